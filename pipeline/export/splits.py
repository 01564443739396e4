"""Which split an exported row belongs to (export.splits): a hash of its id alone, read as a
number in [0, 1), against the splits' cumulative shares in the order given. A row's split is a
function of its id: the same in every export of the same splits, however the dataset grows,
shrinks or is filtered -- a row in `test` never moves to `train` when more rows are synthesized.
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
from typing import Optional

DEFAULT_SPLIT = "train"  # the one split of an export without export.splits
_SCALE = float(1 << 64)


def position(row_id: str) -> float:
    """Where the id falls in [0, 1): the first 8 bytes of its BLAKE2b digest (keyed by nothing
    else, so any tool can recompute it)."""
    digest = hashlib.blake2b(row_id.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") / _SCALE


class SplitRule:
    """export.splits as a lookup: `of(id)` gives the row's split name."""

    def __init__(self, shares: Optional[dict]):
        shares = shares or {DEFAULT_SPLIT: 1.0}
        self.names = list(shares)
        # cumulative upper edges; the last is 1 exactly, so rounding never leaves a row out
        self.edges = [*itertools.accumulate(shares.values())][:-1]

    def of(self, row_id: str) -> str:
        return self.names[bisect.bisect_right(self.edges, position(row_id))]
