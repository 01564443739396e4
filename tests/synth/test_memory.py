"""actors/memory.py: malloc_trim hands freed heap pages back (glibc), at most once per interval."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

from actors.memory import HeapTrimmer


def _anon_mb() -> float:
    with open(f"/proc/{os.getpid()}/status") as f:
        for line in f:
            if line.startswith("RssAnon"):
                return int(line.split()[1]) / 1024.0
    raise AssertionError("no RssAnon")


def test_trims_at_most_once_per_interval():
    heap = HeapTrimmer(every_s=10.0)
    if not heap.available:
        pytest.skip("no glibc malloc_trim here")
    start = heap._last
    assert not heap.maybe_trim(now=start + 5.0)
    assert heap.maybe_trim(now=start + 10.5)
    assert not heap.maybe_trim(now=start + 15.0)
    assert heap.maybe_trim(now=start + 21.0)
    assert heap.trims == 2


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc and glibc's arenas")
def test_a_trim_gives_back_the_holes_fragmentation_leaves():
    heap = HeapTrimmer(every_s=0.0)
    if not heap.available:
        pytest.skip("no glibc malloc_trim here")
    # many 16 KB arrays (below the mmap threshold, so they live in the heap), every other freed:
    # the freed half is whole pages in the middle of the heap that glibc alone keeps
    kept, freed = [], []
    for i in range(20_000):
        (kept if i % 2 else freed).append(np.full(2048, float(i)))
    freed.clear()
    before = _anon_mb()
    assert heap.maybe_trim()
    after = _anon_mb()
    assert before - after > 100, (before, after)  # of the 160 MB freed
    assert len(kept) == 10_000 and kept[-1][0] == 19_999.0


def test_the_onednn_cache_bound_is_set_once_and_a_users_value_wins():
    from actors.memory import ONEDNN_CACHE_ENTRIES, bound_native_caches

    env: dict = {}
    expected = {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": ONEDNN_CACHE_ENTRIES, "LRU_CACHE_CAPACITY": ONEDNN_CACHE_ENTRIES}
    assert bound_native_caches(env) == expected
    assert env == {k: str(v) for k, v in expected.items()}
    mine = bound_native_caches({"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "64"})
    assert mine == {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": 64, "LRU_CACHE_CAPACITY": ONEDNN_CACHE_ENTRIES}
    # the codec child's own size replaces what the actor's environment holds
    child = bound_native_caches({"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "64", "LRU_CACHE_CAPACITY": "64"}, 256)
    assert child == {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": 256, "LRU_CACHE_CAPACITY": 256}
