"""Whether the decode frame is compiled (`engine.compile`: off, on or auto), into which cache,
and how.

A compiled frame is one `torch.compile(fullgraph=True)` graph. On CUDA its shapes are dynamic
and the engine runs it inside its own CUDA graphs, one per batch bucket and key bucket
(graphs.py); on CPU it is one graph per batch-size bucket, with static shapes (a batch padded
to its bucket), and calls the eager frame's pre-packed oneDNN linears and its
attention as ops inductor leaves alone (packing.py, attention.py: the attention reads only the
keys the rows reach) and inductor fuses the element-wise work between them. Compiling
costs start-up time (the `small` frame on 2 vCPUs: ~2.5 min cold, ~13 s with the cache warm),
so inductor's cache lives in a directory of chorus's own that outlives the actor: the next
actor on the node (a restart, the next job) reuses the compiled graph.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import torch

from ..native import INDUCTOR_CACHE_ENV, cache_dir
from .settings import compile_mode

# compiled graphs of the decode frame one process may hold (all its engines together)
RECOMPILE_LIMIT = 256


def auto_compiles(device: torch.device, packed_linears: bool) -> bool:
    """engine.compile=auto's choice. CUDA: no. The decode step runs as a CUDA graph
    (engine.cuda_graphs: 3.2-12x the eager step on an H200, S1-mini and S2-Pro shapes at 1-256
    rows), and compiling the frame for the graphs
    did not finish within 176 s cold for the S1-mini shape (torch 2.11, dynamic shapes, the H200
    machine's 16 cores): minutes of every actor's start against kernels a graph already launches
    back to back (docs/performance.md, the GPU check). compile=on still compiles there. CPU:
    compile where the linears are pre-packed
    for oneDNN (packing.py: float32/bfloat16 with engine.cpu_packed_linears on): the compiled
    frame fuses the element-wise work between them and attends to the keys its rows reach
    (attention.py), and was faster than the eager frame at every shape measured (`small` model,
    bf16, Sapphire Rapids, 2 threads: 32 rows 1.19-1.26x per decode step with slots of 112 and
    512 positions; 1 row ~1.7x). Unpacked linears (float64, or packing off) stay eager: not
    measured compiled. The price is start-up: a cold compile takes minutes per batch size on
    CPU, seconds with the cache warm."""
    return device.type == "cpu" and packed_linears


def compiles(config, device: torch.device, packed_linears: bool = False) -> bool:
    """Whether an engine with `config` compiles its decode frame on `device`; `packed_linears`:
    whether that frame's CPU linears are pre-packed."""
    mode = compile_mode(config.compile)
    return auto_compiles(device, packed_linears) if mode == "auto" else mode == "on"


def use_cache_dir(configured: Optional[str]) -> Path:
    """Point inductor's cache at `configured`, else at TORCHINDUCTOR_CACHE_DIR when the user set
    it, else at default_cache_dir(); made if missing. Returns the directory in use. Process-wide
    (inductor reads the variable), so called before the first compile."""
    path = cache_dir(configured)
    path.mkdir(parents=True, exist_ok=True)
    os.environ[INDUCTOR_CACHE_ENV] = str(path)
    return path


def compiled_frame(frame, device: torch.device):
    """The decode frame as one graph. CUDA: shapes dynamic (one compile serves every batch and
    key bucket: a compile per shape would cost minutes each), no CUDA graphs of inductor's own:
    the engine captures the whole step itself (graphs.py), compiled frame inside. CPU: static
    shapes; the linears stay the eager frame's pre-packed oneDNN calls, traced as one custom
    op each (packing.py), as do the attentions (attention.py), and inductor fuses the
    element-wise work between them (norms, RoPE,
    residuals, SwiGLU, sampling): that graph has no oneDNN tensors in it, so inductor's cache
    keeps it for the next start. (Inductor's `freezing`, which packs the weights itself, makes
    graphs the cache refuses; and passed as compile(options=...) it never took effect: dynamo
    reads the global flag while tracing, before the options reach inductor.) A C++ wrapper
    calls the kernels on CPU: ~5% of a `small` 32-row step less than the Python one, for ~30 s
    more of a cold compile."""
    # dynamo keeps one cache entry per graph for the frame's code, shared by every engine in
    # the process: each engine adds one per batch-size bucket and sampling variant, and the
    # default limit (8) is hit by a few engines (bench's modes and repeats, a test session)
    dynamo = torch._dynamo.config
    dynamo.recompile_limit = max(dynamo.recompile_limit, RECOMPILE_LIMIT)
    if device.type == "cuda":
        return torch.compile(frame, fullgraph=True, dynamic=True)
    return torch.compile(frame, fullgraph=True, dynamic=False, options={"cpp_wrapper": True})
