"""summary.json: totals over the whole output (every run that wrote to it), this run's speed,
per-actor figures, the most common errors and the quality object.

Two ways to the same figures, chosen as planning chooses (cluster.distributed_plan_rows):
below the threshold `summarize` reads the summary columns of every row here and computes
them exactly; above it pipeline/report/summary_merge.py has a Ray task per file compute that file's
partial figures, which the driver merges (sums, counts and tallies exactly; percentiles from
mergeable sketches, pipeline/report/sketch.py). Both fill the same `figures` dict, which `assemble`
turns into summary.json, so the file says the same things either way; its "percentiles" key
says how they were computed ("exact", or the sketch's bound).

The distributed way reads each live file's rows as they are: it runs after the run's end
pass (pipeline/output/supersede.py), which leaves each id on disk once, so there is no older copy
for it to skip as `OutputLayout.read` would.
"""

from __future__ import annotations

from typing import Optional

import pyarrow as pa

from ..output.layout import OutputLayout
from . import metrics
from .summary_figures import ACTOR_KEYS, SUMMARY_COLUMNS, exact_figures
from .summary_merge import distributed_figures


def assemble(figures: dict, run_id: str, wall_seconds: float, extra: dict) -> dict:
    """summary.json from the figures: speeds of this run (rows_per_s, frames_per_s, rtf =
    wall seconds per second of audio) and the engines' shares against its wall time."""
    per_actor = {}
    for actor, a in figures["per_actor"].items():
        per_actor[actor] = {
            **{k: a[k] for k in ACTOR_KEYS},
            "rows_per_s": metrics.rate(a["rows"], wall_seconds),
            "frames_per_s": metrics.rate(a["frames"], wall_seconds),
            # the batches' shares of their actor's steps: mean share of slots holding a row
            "slot_occupancy": a["slot_rows"] / a["slot_steps"] if a["slot_steps"] else None,
            "engine_busy": metrics.rate(a["engine_busy_s"], wall_seconds),
        }
    busy = [a["engine_busy"] for a in per_actor.values() if a["engine_busy"] is not None]
    whole, run, engine = figures["whole"], figures["run"], figures["engine"]
    return {
        **extra,
        "run_id": run_id,
        "rows_total": whole["rows"],
        "rows_ok": whole["rows_ok"],
        "rows_error": whole["rows_error"],
        "rows_rejected": whole["rows_rejected"],
        "audio_seconds": figures["audio_seconds"],
        "audio_hours": figures["audio_seconds"] / 3600.0,
        "wall_s": wall_seconds,
        "run_rows": run["rows"],
        "run_rows_ok": run["rows_ok"],
        "run_rows_error": run["rows_error"],
        "run_audio_seconds": figures["run_audio_seconds"],
        "rows_per_s": metrics.rate(run["rows"], wall_seconds),
        "frames_per_s": metrics.rate(figures["run_frames"], wall_seconds),
        "rtf": metrics.rate(wall_seconds, figures["run_audio_seconds"]),
        # this run's engines: mean share of slots holding a row per step, and of wall time stepping
        "slot_occupancy": engine["slot_rows"] / engine["slot_steps"] if engine["slot_steps"] else None,
        "engine_busy": sum(busy) / len(busy) if busy else None,
        "top_errors": figures["top_errors"],
        "quality": figures["quality"],
        "percentiles": figures["percentiles"],  # of row_rtf_p50 and the quality metrics
        "per_actor": per_actor,
    }


def summarize(meta: pa.Table, run_id: str, wall_seconds: float, extra: dict) -> dict:
    """summary.json from the rows themselves (exact; `meta` holds SUMMARY_COLUMNS)."""
    return assemble(exact_figures(meta, run_id), run_id, wall_seconds, extra)


def summary_of(
    layout: OutputLayout, run_id: str, wall_seconds: float, extra: dict, distributed: bool, **options: Optional[int]
) -> dict:
    """The run's summary.json: exact in this process, or from per-file partials on Ray
    (`options`: summary_merge.distributed_figures')."""
    if not distributed:
        return summarize(layout.read(SUMMARY_COLUMNS), run_id, wall_seconds, extra)
    return assemble(distributed_figures(layout, run_id, **options), run_id, wall_seconds, extra)
