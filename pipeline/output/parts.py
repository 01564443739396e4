"""The run's writes: the actors write each group of finished rows as one crash-safe part file
(`PartSink`, as rows finish: actors/synth/blocks.py), and the driver gets each part's stats:
its progress, what fills a shard (pipeline/output/compaction.py), and the engines' slot
figures."""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Optional

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


def write_rows(batch: pa.Table, location: str, run_id: str = "") -> dict:
    """Output rows as one crash-safe part file (named for its run and ids: a retried write
    replaces its own file); its stats (STATS_SCHEMA's fields)."""
    began, retried = time.perf_counter(), retries_spent()
    batch = batch.select(S.OUTPUT_SCHEMA.names).cast(S.OUTPUT_SCHEMA)
    name = part_name(batch.column(S.ID).to_pylist(), run_id)
    layout = OutputLayout(location)
    path = layout.write_part(batch, name, owner=run_id)
    size = layout.fs.get_file_info(path).size
    return dict(
        block_stats(batch, name),
        bytes=size,
        write_ms=(time.perf_counter() - began) * 1000.0,
        store_retries=retries_spent() - retried,
    )


def write_block(batch: pa.Table, location: str, run_id: str = "") -> pa.Table:
    """One block as one part file, and a one-row stats table (tests and tools write parts so)."""
    if batch.num_rows == 0:
        return pa.Table.from_pylist([], schema=STATS_SCHEMA)
    return pa.Table.from_pylist([write_rows(batch, location, run_id)], schema=STATS_SCHEMA)


@dataclass(frozen=True)
class PartSink:
    """Where a run's actors write their finished rows (actors/synth/actor.py SynthStage, given
    one at construction): each `write` is one crash-safe part, its stats handed to the run's
    inbox (pipeline/run/readahead.py ReadAhead.written: progress, compaction and the read-ahead
    window read them there) before `write` returns, so the driver has them by the time the
    block's call ends. Picklable: Ray ships it to every actor."""

    location: str
    run_id: str
    inbox: Any = None  # the run's ReadAhead actor

    def write(self, rows: pa.Table) -> dict:
        if rows.num_rows == 0:
            return {}
        stats = write_rows(rows, self.location, self.run_id)
        if self.inbox is not None:
            import ray

            ray.get(self.inbox.written.remote(stats))
        return stats
