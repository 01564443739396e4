"""A mergeable percentile sketch: counts of values in log-spaced buckets (the idea of
DDSketch, written here), for figures over more rows than one process should hold.

Error bound. A nonzero value v falls in the bucket (g**(k-1), g**k] of its magnitude, with
g = (1 + a) / (1 - a), and reads back as 2 g**k / (g + 1), within a|v| of v; a = 1%
(RELATIVE_ERROR). Values with |v| <= TINY read back as 0. So every order statistic comes back
within 1% of its true value, and a percentile -- linear interpolation between the two closest
ranks, numpy's default, as pipeline/report/metrics.py computes it exactly -- within 1% of the larger
magnitude of those two values. Counts are exact; merging adds counts, so any merge order gives
the same sketch. Size: one entry per occupied bucket, at most ~70 per factor of 2 of range.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Optional

import numpy as np

RELATIVE_ERROR = 0.01
GAMMA = (1 + RELATIVE_ERROR) / (1 - RELATIVE_ERROR)
_LOG_GAMMA = math.log(GAMMA)
TINY = 1e-12
DESCRIPTION = f"sketch, <={RELATIVE_ERROR:.0%} relative"  # what summary.json says of its percentiles


class LogHistogram:
    """Counts per bucket of the finite values added (NaN and inf are left out, as the exact
    figures leave them out)."""

    def __init__(self) -> None:
        self.positive: dict[int, int] = {}
        self.negative: dict[int, int] = {}  # keyed by the magnitude's bucket
        self.zero = 0

    @property
    def count(self) -> int:
        return self.zero + sum(self.positive.values()) + sum(self.negative.values())

    def add(self, values) -> LogHistogram:
        v = np.asarray(values, dtype=np.float64)
        v = v[np.isfinite(v)]
        positive, negative = v[v > TINY], -v[v < -TINY]
        self.zero += int(v.size - positive.size - negative.size)
        for magnitudes, buckets in ((positive, self.positive), (negative, self.negative)):
            if magnitudes.size:
                keys, counts = np.unique(np.ceil(np.log(magnitudes) / _LOG_GAMMA).astype(np.int64), return_counts=True)
                for key, n in zip(keys.tolist(), counts.tolist()):
                    buckets[key] = buckets.get(key, 0) + n
        return self

    def merge(self, other: LogHistogram) -> LogHistogram:
        for mine, theirs in ((self.positive, other.positive), (self.negative, other.negative)):
            for key, n in theirs.items():
                mine[key] = mine.get(key, 0) + n
        self.zero += other.zero
        return self

    def _ordered(self) -> list[tuple[float, int]]:
        """(value each bucket reads back as, count), smallest value first."""
        value = lambda key: 2.0 * GAMMA**key / (GAMMA + 1.0)  # noqa: E731
        out = [(-value(k), self.negative[k]) for k in sorted(self.negative, reverse=True)]
        out += [(0.0, self.zero)] if self.zero else []
        return out + [(value(k), self.positive[k]) for k in sorted(self.positive)]

    def percentiles(self, qs: Sequence[float]) -> list[Optional[float]]:
        """Percentiles (0-100), interpolated between the closest ranks; None for each when
        the sketch is empty."""
        n = self.count
        if not n:
            return [None] * len(qs)
        buckets = self._ordered()
        ends = np.cumsum([c for _, c in buckets])  # the rank after each bucket's last value

        def at_rank(rank: int) -> float:
            return buckets[int(np.searchsorted(ends, rank, side="right"))][0]

        out = []
        for q in qs:
            h = q / 100.0 * (n - 1)
            lo, hi = math.floor(h), math.ceil(h)
            low = at_rank(lo)
            out.append(low + (h - lo) * (at_rank(hi) - low))
        return out
