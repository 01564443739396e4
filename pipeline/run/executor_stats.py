"""Ray Data's own per-block bookkeeping on the driver, bounded by cutting the stream.

Every map operator of a running dataset keeps a stats record (a BlockStats with its exec
stats) of each block it outputs, for the dataset's end-of-run summary, until the dataset's
execution ends; Ray 2.49 and 2.60 have no setting that turns it off or bounds it (DataContext's
stats options change what is logged, not what is kept). A run's stream has three such
operators (read, actors, part writer), and the driver's Python heap grows by about 2.4 KB per
block (4.6 KB resident; docs/performance.md, "Driver memory per block"): a million rows at 16
rows per block would keep ~150 MB, ten million ~1.5 GB.

So the stream runs as several datasets, one after another, each of at most
cluster.blocks_per_dataset blocks: a finished dataset's records go with it (measured: the heap
stops growing), and what the driver keeps stays under one dataset's worth (~120 MB at the
default) whatever the job's size. Each dataset starts its own
actors (the model loads again) and drains before the next starts: the default (50,000 blocks,
800,000 rows at 16 rows per block) makes that a few minutes of a many-hour stream.
"""

from __future__ import annotations

from .chosen_rows import Chunk


def blocks_of(chunk: Chunk, rows_per_block: int) -> int:
    return -(-chunk.rows // rows_per_block)


def segments(work: list[Chunk], rows_per_block: int, max_blocks: int) -> list[list[Chunk]]:
    """The run's read chunks, in order, cut into consecutive groups of at most `max_blocks`
    blocks each (a chunk larger than that alone): one dataset each."""
    groups: list[list[Chunk]] = []
    blocks = 0
    for chunk in work:
        size = blocks_of(chunk, rows_per_block)
        if groups and blocks + size <= max_blocks:
            groups[-1].append(chunk)
            blocks += size
        else:
            groups.append([chunk])
            blocks = size
    return groups
