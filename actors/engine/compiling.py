"""Whether the decode frame is compiled (`engine.compile`: off, on or auto), into which cache,
and how.

A compiled frame is one `torch.compile(fullgraph=True)` graph per batch-size bucket, with static
shapes (a batch padded to its bucket, attention over the slot's full capacity). On CUDA it is
replayed as CUDA graphs; on CPU inductor freezes it (weights folded in as constants and packed
for oneDNN, element-wise work fused). Compiling costs start-up time (the `small` frame on 2
vCPUs: ~110 s cold, ~40 s with the cache warm), so inductor's cache lives in a directory of
chorus's own that outlives the actor: the next actor on the node (a restart, the next job)
reuses the compiled graph.
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
    `bench --compile` on the GPU are the checks). Eager on CPU, where a compiled frame was
    measured no faster (`small` model, 32 bf16 rows, Sapphire Rapids, 2 threads, inductor
    freezing: 0.77x the eager step at the pipeline's 512-position slots, whose keys a static
    frame attends to in full while the eager frame reads only the chunks its rows reach; 1.02x
    with slots sized to the rows) and costs ~110 s of a start cold, ~40 s with its cache warm."""
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
    """The decode frame as one graph. CUDA: replayed as CUDA graphs when asked. CPU: inductor's
    freezing, which folds the weights into the graph as constants and packs them for oneDNN
    itself (the eager frame's pack_cpu_linears, which a trace cannot follow), and fuses the
    element-wise work between the products; without freezing the compiled frame was slower than
    eager, with it 1.10x faster when the eager frame's attention still read whole 512-key blocks,
    and 1.01-1.02x since it reads 128-key chunks (auto_compiles has the figures)."""
    if device.type == "cuda":
        mode = "reduce-overhead" if cuda_graphs else None
        return torch.compile(frame, fullgraph=True, dynamic=False, mode=mode)
    return torch.compile(frame, fullgraph=True, dynamic=False, options={"freezing": True})
