"""chorus's C++ kernels, built on the node that runs them: torch's extension builder compiles a
source file once per node, torch version and CPU instruction set into chorus's compile cache,
and every later process loads the build from there (~8-10 s to build on 2 vCPUs, milliseconds
to load). A build needs a C++ compiler and ninja; where they are not at hand it fails, a
warning says so, and the caller keeps its torch code.

The machine's architecture and torch's reading of its instruction set
(`torch.backends.cpu.get_cpu_capability`) name the build, so a cache directory shared by unlike
nodes holds one build per kind instead of handing an AVX-512 build to a CPU without it.
"""

from __future__ import annotations

import logging
import os
import platform
from pathlib import Path
from typing import Optional

import torch
from filelock import FileLock

log = logging.getLogger(f"chorus.{__name__}")  # one namespace: configuring "chorus" reaches every module

# inductor's own variable; set, it wins over the default directory below
INDUCTOR_CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"

# compiler flags for each of torch's CPU capabilities: the kernels are written as plain loops
# and vectors, and these let the compiler use the CPU's widest vectors and fused multiply-adds
_CAPABILITY_FLAGS = {
    "AVX512": ["-mavx512f", "-mavx512vl", "-mavx512dq", "-mavx512bw", "-mavx2", "-mfma"],
    "AVX2": ["-mavx2", "-mfma"],
}

# how long a process waits for another's build of the same kernel (one takes ~10 s)
BUILD_WAIT_S = 300.0

_built: dict[str, bool] = {}  # extension name -> whether it loaded in this process


def default_cache_dir() -> Path:
    """Where compiled frames and built kernels are kept unless engine.compile_cache_dir or
    TORCHINDUCTOR_CACHE_DIR says otherwise: beside chorus's other caches, so it survives the
    actor and the job."""
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root) / "chorus" / "compile"


def cache_dir(configured: Optional[str] = None) -> Path:
    """The compile cache: `configured` (engine.compile_cache_dir) when given, else
    TORCHINDUCTOR_CACHE_DIR when set, else the default."""
    if configured:
        return Path(configured).expanduser()
    from_environment = os.environ.get(INDUCTOR_CACHE_ENV)
    return Path(from_environment) if from_environment else default_cache_dir()


def cpu_capability() -> str:
    return torch.backends.cpu.get_cpu_capability()


def build(name: str, source: Path, build_root: Optional[Path] = None) -> bool:
    """Build `source` (ops registered with TORCH_LIBRARY) as extension `name` under
    build_root/<name>-<torch version>-<machine>-<capability> and load it into this process, once
    per process. False, with a warning, where it cannot be built (no compiler or ninja), or where
    another process has held the build for BUILD_WAIT_S."""
    if name not in _built:
        capability = cpu_capability()
        folder = Path(build_root or cache_dir()) / f"{name}-{torch.__version__}-{platform.machine()}-{capability}"
        try:
            from torch.utils.cpp_extension import load

            folder.mkdir(parents=True, exist_ok=True)
            # torch's builder marks a build in progress with a `lock` file, which a process
            # killed mid-build leaves behind, and every later build then waits on it forever.
            # An OS lock (released when its holder dies) guards the build instead; whoever holds
            # it may clear torch's marker, since nobody else is building here
            with FileLock(str(folder / "chorus-build.lock"), timeout=BUILD_WAIT_S):
                (folder / "lock").unlink(missing_ok=True)
                flags = ["-O3", *_CAPABILITY_FLAGS.get(capability, [])]
                load(name, [str(source)], extra_cflags=flags, build_directory=str(folder), is_python_module=False)
            _built[name] = True
        except Exception as error:  # a missing compiler or headers surface as several kinds
            log.warning(
                "the C++ kernels %s could not be built in %s (%s); torch's own code serves", name, folder, error
            )
            _built[name] = False
    return _built[name]
