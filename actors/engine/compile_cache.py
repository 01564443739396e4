"""One directory for everything a start compiles (`engine.compile_cache_dir`): inductor's cache,
Triton's (the fused kernels and inductor's GPU kernels), the CPU kernels chorus builds
(actors/native.py), and torch's portable "mega-cache" of a warmed-up engine.

The mega-cache (`torch.compiler.save_cache_artifacts` / `load_cache_artifacts`) is one file
holding what a process compiled (inductor's graphs, autotuning results, Triton's binaries). It is
saved after `Engine.warm_up` and loaded when the next engine starts, before anything compiles,
under a name that keys it by what makes it valid: the torch and Triton versions, the device
(the GPU's name, or the CPU's instruction set) and a hash of chorus's engine source. A node
whose directory is empty still starts warm once the file is there: a cluster shares it by
copying `mega/<key>.bin` beside the checkpoint (object store or shared filesystem) and into each
node's `engine.compile_cache_dir` before the actors start, or by pointing
`engine.compile_cache_dir` at a shared filesystem (every process writes under a temporary name
and renames, so concurrent writers are safe).
"""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path
from typing import Optional

import torch

from ..files import write_atomically
from ..native import cpu_capability

log = logging.getLogger(f"chorus.{__name__}")  # one namespace: configuring "chorus" reaches every module

TRITON_CACHE_ENV = "TRITON_CACHE_DIR"
_SOURCE = Path(__file__).resolve().parent  # actors/engine: its modules and kernels shape the graphs


def use_triton_cache(directory: Path) -> Path:
    """Triton's cache under `directory` (unless TRITON_CACHE_DIR is set): process-wide, read when
    Triton first compiles."""
    path = Path(os.environ.get(TRITON_CACHE_ENV) or directory / "triton")
    path.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault(TRITON_CACHE_ENV, str(path))
    return path


def source_hash() -> str:
    """A hash of the engine's source files (the code the graphs and kernels come from)."""
    digest = hashlib.sha256()
    for path in sorted(_SOURCE.rglob("*.py")) + sorted(_SOURCE.glob("*.cpp")):
        digest.update(path.relative_to(_SOURCE).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def artifact_key(device: torch.device) -> str:
    """What a saved mega-cache is valid for: torch, Triton, the device and the source."""
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = "none"
    if device.type == "cuda":
        where = torch.cuda.get_device_name(device).replace(" ", "_")
    else:
        where = f"cpu-{cpu_capability()}"
    torch_version = torch.__version__.replace("+", "_")
    return f"torch{torch_version}-triton{triton_version}-{where}-src{source_hash()}"


def artifact_path(directory: Path, device: torch.device) -> Path:
    return Path(directory) / "mega" / f"{artifact_key(device)}.bin"


def load_artifacts(directory: Optional[Path], device: torch.device) -> bool:
    """Load the saved mega-cache for this torch/Triton/device/source, if there is one. True when
    loaded; a file that does not load is logged and skipped (the start compiles as if cold)."""
    if directory is None:
        return False
    path = artifact_path(directory, device)
    if not path.is_file():
        return False
    try:
        torch.compiler.load_cache_artifacts(path.read_bytes())
    except Exception as error:  # a stale or damaged file costs a cold start, never the actor
        log.warning("compile cache %s did not load (%s: %s); compiling afresh", path, type(error).__name__, error)
        return False
    log.info("compile cache: loaded %s", path)
    return True


def save_artifacts(directory: Optional[Path], device: torch.device) -> Optional[Path]:
    """Save what this process compiled as the mega-cache for its key; None when nothing was."""
    if directory is None:
        return None
    saved = torch.compiler.save_cache_artifacts()
    if saved is None:
        return None
    path = artifact_path(directory, device)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, saved[0])
    return path
