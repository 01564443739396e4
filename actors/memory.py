"""What an actor and its codec child keep in memory, bounded: oneDNN's primitive cache, and
freed heap memory handed back to the operating system (glibc's malloc_trim).

oneDNN (torch's CPU matmul and convolution kernels) caches one primitive, with its JIT-compiled
kernel, per distinct operation shape. Prefill chunks and codec batches come in many shapes, so
the cache fills to its capacity (oneDNN's default 1,024): measured with heaptrack on the demo
actor, entries of up to ~260 KB, about 12 MB a minute for the first minutes of a run.
torch's ideep layer keeps its own cache of the same primitives (LRU_CACHE_CAPACITY, also
1,024), which holds them alive after oneDNN's drops them: with only oneDNN's bounded, a soak
still kept ~470 new primitives in 146 s. `bound_native_caches` sets both capacities to
ONEDNN_CACHE_ENTRIES before the process's first oneDNN call (values already in the
environment win).

An actor and its codec child allocate and free many buffers of changing sizes from several
threads (prompts, K/V prefix copies, codes, waveforms, FLAC bytes). glibc keeps what is freed
inside its arenas for reuse and returns it to the system only from the top of each heap, so
the resident size of a long-running process creeps up with fragmentation although nothing is
leaked. `HeapTrimmer.maybe_trim` calls malloc_trim(0), which also releases the free pages in
the middle of every arena, at most once per `every_s` seconds (a trim walks the arenas: ~2 ms
measured at ~700 MB): 5 s in the actor, 0 (after every call) in the codec child, whose
working set between calls is only its model. Where there is no glibc (macOS, musl) it does
nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import threading
import time
from typing import Optional

# the actor's interval: a 60-minute soak trimming every 30 s showed a 40 MB saw-tooth between
# trims; at 5 s the cost is still ~2 ms in 5,000 (0.04%)
TRIM_EVERY_S = 5.0
# oneDNN primitives kept per process: the decode steps' few shapes stay, prefill's turn over
# 64, not 256: in 20-minute soaks of the demo the actor held ~100 MB less at 64 (618 against
# 716 MB at minute 6) and ran as fast (595 against 529 rows/min; prefill shapes miss either way)
ONEDNN_CACHE_ENTRIES = 64
# the codec child's: one decode call alone runs more than 64 distinct convolutions and matmuls
# (time chunks, their remainders, each layer's own shape), so at 64 every call rebuilt them all
# (demo codec, 1 thread, rows of 10-110 frames, SPR: 1.24 ms per frame at 64, 0.83-0.87 at
# 128-512, 0.57 with every shape cached; peak RSS 321 MB at 128, 335 at 256, 376 at 512)
CODEC_ONEDNN_CACHE_ENTRIES = 256
# the two caches that hold them: oneDNN's own, and torch's ideep layer's (which keeps its
# primitives alive after oneDNN's cache drops them, so both need the bound)
CACHE_VARIABLES = ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")


def bound_native_caches(environ=os.environ, entries: Optional[int] = None) -> dict:
    """Bound the primitive caches (each read once, at the process's first oneDNN call: call this
    before loading a model). `entries` replaces what the environment holds; without it a value
    already there wins over ONEDNN_CACHE_ENTRIES. Returns the capacities in force."""
    for name in CACHE_VARIABLES:
        if entries is not None:
            environ[name] = str(entries)
        else:
            environ.setdefault(name, str(ONEDNN_CACHE_ENTRIES))
    return {name: int(environ[name]) for name in CACHE_VARIABLES}


def _malloc_trim():
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


class HeapTrimmer:
    def __init__(self, every_s: float = TRIM_EVERY_S):
        self.every_s = every_s
        self._trim = _malloc_trim()
        self._lock = threading.Lock()
        self._last = time.monotonic()
        self.trims = 0

    @property
    def available(self) -> bool:
        return self._trim is not None

    def maybe_trim(self, now: Optional[float] = None) -> bool:
        """Trim if `every_s` has passed since the last trim; True when it trimmed. Safe from
        any thread (one trims, the others return)."""
        if self._trim is None:
            return False
        now = time.monotonic() if now is None else now
        if now - self._last < self.every_s or not self._lock.acquire(blocking=False):
            return False
        try:
            self._last = now
            self._trim(0)
            self.trims += 1
            return True
        finally:
            self._lock.release()
