"""chorus's C++ kernels, built on the node that runs them: torch's extension builder compiles a
source file once per node, torch version and CPU instruction set into chorus's compile cache,
and every later process loads the build from there (~8-10 s to build on 2 vCPUs, milliseconds
to load). Where no compiler is at hand the build fails, a warning says so, and the caller keeps
its torch code.

The instruction set is torch's own reading of the CPU (`torch.backends.cpu.get_cpu_capability`)
and names the build, so a cache directory shared by unlike nodes holds one build per kind
instead of handing an AVX-512 build to a CPU without it.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Optional

import torch

log = logging.getLogger(__name__)

# inductor's own variable; set, it wins over the default directory below
INDUCTOR_CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"

# compiler flags for each of torch's CPU capabilities: the kernels are written as plain loops
# and vectors, and these let the compiler use the CPU's widest vectors and fused multiply-adds
_CAPABILITY_FLAGS = {
    "AVX512": ["-mavx512f", "-mavx512vl", "-mavx512dq", "-mavx512bw", "-mavx2", "-mfma"],
    "AVX2": ["-mavx2", "-mfma"],
}

_built: dict[str, bool] = {}  # extension name -> whether it loaded in this process


def default_cache_dir() -> Path:
    """Where compiled frames and built kernels are kept unless engine.compile_cache_dir or
    TORCHINDUCTOR_CACHE_DIR says otherwise: beside chorus's other caches, so it survives the
    actor and the job."""
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root) / "chorus" / "compile"


def cache_dir() -> Path:
    """The compile cache this process uses: TORCHINDUCTOR_CACHE_DIR when set (an actor whose
    engine.compile_cache_dir is set exports it to its codec child too), else the default."""
    configured = os.environ.get(INDUCTOR_CACHE_ENV)
    return Path(configured) if configured else default_cache_dir()


def cpu_capability() -> str:
    return torch.backends.cpu.get_cpu_capability()


def build(name: str, source: Path, build_root: Optional[Path] = None) -> bool:
    """Build `source` (ops registered with TORCH_LIBRARY) as extension `name` under
    build_root/<name>-<torch version>-<capability> and load it into this process, once per
    process. False, with a warning, where it cannot be built."""
    if name not in _built:
        capability = cpu_capability()
        try:
            from torch.utils.cpp_extension import load

            folder = Path(build_root or cache_dir()) / f"{name}-{torch.__version__}-{capability}"
            folder.mkdir(parents=True, exist_ok=True)
            flags = ["-O3", *_CAPABILITY_FLAGS.get(capability, [])]
            load(name, [str(source)], extra_cflags=flags, build_directory=str(folder), is_python_module=False)
            _built[name] = True
        except Exception as error:  # a missing compiler or headers surface as several kinds
            log.warning("the C++ kernels %s could not be built (%s); torch's own code serves", name, error)
            _built[name] = False
    return _built[name]
