"""glibc malloc settings for engine processes.

By default glibc serves large blocks with mmap and hands freed heap tops back to the kernel,
with thresholds that adapt to the sizes seen. An engine step allocates and frees the same
large activations (attention scores, batch K/V reads, logits) every frame, so the default
turns each step into fresh page faults. Raising the mmap and trim thresholds keeps that memory
in the process and reuses it. Applied once per process when an engine is built; nothing for
users to set. `CHORUS_MALLOPT=0` leaves glibc's defaults (for side-by-side measurement)."""

from __future__ import annotations

import ctypes
import ctypes.util
import os

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
# glibc's largest accepted mmap threshold on 64-bit (HEAP_MAX_SIZE / 2)
_MMAP_THRESHOLD = 32 * 1024 * 1024
_TRIM_THRESHOLD = 1024 * 1024 * 1024

_state: dict = {}


def tune_malloc() -> bool:
    """Raise glibc's mmap/trim thresholds once per process; True when they are in force."""
    if "applied" in _state:
        return _state["applied"]
    applied = False
    if os.environ.get("CHORUS_MALLOPT", "1") != "0":
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            mallopt = libc.mallopt
        except (OSError, AttributeError):  # not glibc (macOS, musl): nothing to tune
            mallopt = None
        if mallopt is not None:
            mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
            ok_mmap = mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD) == 1
            ok_trim = mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD) == 1
            applied = ok_mmap and ok_trim
    _state["applied"] = applied
    return applied
