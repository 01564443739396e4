"""Whether the decode frame is compiled (`engine.compile`: off, on or auto), into which cache,
and how.

A compiled frame is one `torch.compile(fullgraph=True)` graph per batch-size bucket, with static
shapes (a batch padded to its bucket, attention over the slot's full capacity). On CUDA it is
replayed as CUDA graphs; on CPU it calls the eager frame's pre-packed oneDNN linears through a
traceable op (packing.py) and inductor fuses the element-wise work between them. Compiling
costs start-up time (the `small` frame on 2 vCPUs: ~2.5 min cold, ~13 s with the cache warm),
so inductor's cache lives in a directory of chorus's own that outlives the actor: the next
actor on the node (a restart, the next job) reuses the compiled graph.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import torch

from .settings import compile_mode

# inductor's own variable; set, it wins over engine.compile_cache_dir's default
INDUCTOR_CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"


def auto_compiles(device: torch.device) -> bool:
    """engine.compile=auto's choice: compile on CUDA, where a decode frame of many small kernels
    is launch-bound and a CUDA graph replays it in one launch (upstream fish-speech's own
    --compile is for CUDA; not yet measured by chorus: `python -m actors.engine frame-check` and
    `bench --compile` on the GPU are the checks). Eager on CPU: the compiled frame's decode step
    is ~1.3x the eager one with slots sized to the rows (`small` model, 32 bf16 rows,
    Sapphire Rapids, 2 threads), but its static shapes attend to every position of a slot, and
    the pipeline's CPU slots (512 positions) are several times longer than its rows, whose
    eager attention reads only the 128-key chunks they reach; a cold compile also takes minutes
    per batch size there (seconds with the cache warm)."""
    return device.type == "cuda"


def compiles(config, device: torch.device) -> bool:
    """Whether an engine with `config` compiles its decode frame on `device`."""
    mode = compile_mode(config.compile)
    return auto_compiles(device) if mode == "auto" else mode == "on"


def default_cache_dir() -> Path:
    """Where compiled frames are kept unless engine.compile_cache_dir or TORCHINDUCTOR_CACHE_DIR
    says otherwise: beside chorus's other caches, so it survives the actor and the job."""
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root) / "chorus" / "compile"


def use_cache_dir(configured: Optional[str]) -> Path:
    """Point inductor's cache at `configured`, else at TORCHINDUCTOR_CACHE_DIR when the user set
    it, else at default_cache_dir(); made if missing. Returns the directory in use. Process-wide
    (inductor reads the variable), so called before the first compile."""
    if configured:
        path = Path(configured).expanduser()
    elif os.environ.get(INDUCTOR_CACHE_ENV):
        path = Path(os.environ[INDUCTOR_CACHE_ENV])
    else:
        path = default_cache_dir()
    path.mkdir(parents=True, exist_ok=True)
    os.environ[INDUCTOR_CACHE_ENV] = str(path)
    return path


def compiled_frame(frame, device: torch.device, cuda_graphs: bool):
    """The decode frame as one graph with static shapes. CUDA: replayed as CUDA graphs when
    asked. CPU: the linears stay the eager frame's pre-packed oneDNN calls, traced as one custom
    op each (packing.py), and inductor fuses the element-wise work between them (norms, RoPE,
    residuals, SwiGLU, sampling): that graph has no oneDNN tensors in it, so inductor's cache
    keeps it for the next start. (Inductor's `freezing`, which packs the weights itself, makes
    graphs the cache refuses; and passed as compile(options=...) it never took effect: dynamo
    reads the global flag while tracing, before the options reach inductor.) A C++ wrapper
    calls the kernels on CPU: ~5% of a `small` 32-row step less than the Python one, for ~30 s
    more of a cold compile."""
    if device.type == "cuda":
        return torch.compile(frame, fullgraph=True, dynamic=False, mode="reduce-overhead" if cuda_graphs else None)
    return torch.compile(frame, fullgraph=True, dynamic=False, options={"cpp_wrapper": True})
