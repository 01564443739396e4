"""The run's write stage: each finished block becomes one crash-safe part file (one Ray task
per block), and the driver gets back a one-row stats table: its progress, what fills a shard
(pipeline/output/compaction.py), and the engines' slot figures."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Optional

import pyarrow as pa
import pyarrow.compute as pc

from actors import schema as S
from actors.storage import retries_spent

from ..names import part_name
from .layout import OutputLayout

STATS_SCHEMA = pa.schema(
    [
        ("rows", pa.int64()),
        ("ok", pa.int64()),
        ("errors", pa.int64()),
        ("audio_seconds", pa.float64()),
        ("frames", pa.int64()),
        ("part", pa.string()),
        ("bytes", pa.int64()),  # the part file's size (what compaction packs by)
        ("write_ms", pa.float64()),
        ("slot_rows", pa.float64()),
        ("slot_steps", pa.float64()),
        ("store_retries", pa.int64()),  # object-store calls the task retried (actors/storage)
    ]
)


def engine_figures(batches: Iterable[Optional[dict]]) -> dict:
    """What the engines did for these batches (the `batch` structs of output rows, each batch
    counted once): `slot_rows` (live rows summed over engine steps), `slot_steps` (steps x
    slots), `slot_occupancy` (their ratio: the mean share of slots holding a row while the
    engine stepped) and `engine_busy_s` (engine step time). Each batch holds its share of its
    actor's steps, so sums over batches are the actors' totals."""
    unique = {b[S.BATCH_ID]: b for b in batches if b}
    slot_rows = sum(b.get(S.BATCH_SLOT_ROWS) or 0.0 for b in unique.values())
    slot_steps = sum((b.get(S.BATCH_ENGINE_STEPS) or 0.0) * (b.get(S.BATCH_SLOTS) or 0) for b in unique.values())
    return {
        "slot_rows": slot_rows,
        "slot_steps": slot_steps,
        "slot_occupancy": slot_rows / slot_steps if slot_steps else None,
        "engine_busy_s": sum(b.get(S.BATCH_ENGINE_MS) or 0.0 for b in unique.values()) / 1000.0,
    }


def block_stats(table: pa.Table, part: str) -> dict:
    statuses = table.column(S.STATUS).to_pylist()
    ok, rejected = statuses.count(S.STATUS_OK), statuses.count(S.STATUS_REJECTED)
    figures = engine_figures(table.column(S.BATCH).to_pylist())
    return {
        "rows": table.num_rows,
        "ok": ok,
        "errors": table.num_rows - ok - rejected,  # rejected rows are done, with audio
        "audio_seconds": float(pc.sum(table.column(S.AUDIO_SECONDS)).as_py() or 0.0),
        "frames": int(pc.sum(table.column(S.N_FRAMES)).as_py() or 0),
        "part": part,
        "slot_rows": figures["slot_rows"],
        "slot_steps": figures["slot_steps"],
    }


def write_block(batch: pa.Table, location: str, run_id: str = "") -> pa.Table:
    """The run's write stage (one Ray task per block): the block becomes one part file, and
    the driver gets back a one-row stats table for progress."""
    if batch.num_rows == 0:
        return pa.Table.from_pylist([], schema=STATS_SCHEMA)
    began, retried = time.perf_counter(), retries_spent()
    batch = batch.select(S.OUTPUT_SCHEMA.names).cast(S.OUTPUT_SCHEMA)
    name = part_name(batch.column(S.ID).to_pylist(), run_id)
    layout = OutputLayout(location)
    path = layout.write_part(batch, name, owner=run_id)
    size = layout.fs.get_file_info(path).size
    stats = dict(
        block_stats(batch, name),
        bytes=size,
        write_ms=(time.perf_counter() - began) * 1000.0,
        store_retries=retries_spent() - retried,
    )
    return pa.Table.from_pylist([stats], schema=STATS_SCHEMA)
