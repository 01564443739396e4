"""Ray Data's own per-block bookkeeping on the driver, bounded.

Ray 2.60's map operators append a BlockStats (with its exec stats) for every block they output
to a list that lives as long as the dataset's execution (`_output_blocks_stats`, read only to
print the dataset's stats summary at its end): about 1 KB per block per operator, 62,500 blocks
per operator per million rows at 16 rows per block. The job clears those lists as it streams;
what is lost is the per-block part of Ray's end-of-run stats log line, which chorus does not
read (its own figures come from the output rows). Attributes Ray may rename are looked up
softly: on another Ray version this does nothing and tests/pipeline/run/test_readahead.py says so.
"""

from __future__ import annotations

# clear every this many blocks the driver sees: the lists stay under a few hundred entries
TRIM_EVERY_BLOCKS = 256


def trim_block_stats(dataset) -> int:
    """Empty the per-block stats lists of `dataset`'s running execution; returns the entries
    dropped (0 when it is not running, or on a Ray without these lists)."""
    executor = getattr(dataset, "_current_executor", None)
    topology = getattr(executor, "_topology", None) or {}
    dropped = 0
    for operator in topology:
        kept = getattr(operator, "_output_blocks_stats", None)
        if isinstance(kept, list):
            dropped += len(kept)
            kept.clear()
    return dropped
