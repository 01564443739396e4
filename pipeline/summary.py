"""summary.json: totals over the whole output (every run that wrote to it), this run's speed,
per-actor figures, the most common errors and the quality object.

Two ways to the same figures, chosen as planning chooses (cluster.distributed_plan_rows):
below the threshold `summarize` reads the summary columns of every row here and computes
them exactly; above it pipeline/summary_parts.py has a Ray task per file compute that file's
partial figures, which the driver merges (sums, counts and tallies exactly; percentiles from
mergeable sketches, pipeline/sketch.py). Both fill the same `figures` dict, which `assemble`
turns into summary.json, so the file says the same things either way; its "percentiles" key
says how they were computed ("exact", or the sketch's bound).

The distributed way reads each live file's rows as they are: it runs after the run's end
pass (pipeline/supersede.py), which leaves each id on disk once, so there is no older copy
for it to skip as `OutputLayout.read` would.
"""

from __future__ import annotations

from typing import Optional

import pyarrow as pa

from actors import schema as S

from . import metrics, quality
from .output import OutputLayout, engine_figures

# what the summary reads (never the texts, audio or codes)
SUMMARY_COLUMNS = [
    S.ID,
    S.STATUS,
    S.ERROR,
    S.AUDIO_SECONDS,
    S.N_FRAMES,
    S.TOTAL_MS,
    S.RTF,
    S.ACTOR,
    S.NODE,
    S.DEVICE,
    S.RUN,
    S.FINISHED_AT,
    S.BATCH,
    # summary.json's quality object (pipeline/quality.py)
    S.QUALITY_FLAGS,
    S.ATTEMPTS,
    S.DISCARDED_FRAMES,
    *quality.METRIC_COLUMNS,
]
TOP_ERRORS = 10  # messages listed
ERROR_CHARS = 160  # a message is cut to this before messages are counted (metrics.error_kinds)
EXACT = "exact"
# per actor, as the figures hold them (the rates and engine shares are assemble's)
ACTOR_KEYS = ("node", "device", "rows", "rows_ok", "rows_error", "audio_s", "frames", "row_rtf_p50")
ENGINE_KEYS = ("slot_rows", "slot_steps", "engine_busy_s")


def batch_column(table: pa.Table, name: str) -> list:
    return table.column(name).to_pylist() if name in table.column_names else []


def engines(table: pa.Table) -> tuple[dict[str, dict], dict]:
    """What the engines did for these rows' batches (output.engine_figures): per actor, and
    for all of them; the batch structs read once."""
    batches, actors = batch_column(table, S.BATCH), batch_column(table, S.ACTOR)
    per_actor: dict[str, list] = {}
    for actor, batch in zip(actors, batches):
        per_actor.setdefault(actor, []).append(batch)
    return {actor: engine_figures(mine) for actor, mine in per_actor.items()}, engine_figures(batches)


def totals(table: pa.Table, this_run: pa.Table, run_ok: pa.Table) -> dict:
    """The sums both paths add up the same way: row counts (whole output, this run), seconds
    of audio, this run's frames."""
    return {
        "whole": metrics.counts(table),
        "audio_seconds": metrics.total(metrics.ok_rows(table), S.AUDIO_SECONDS),
        "run": metrics.counts(this_run),
        "run_audio_seconds": metrics.total(run_ok, S.AUDIO_SECONDS),
        "run_frames": metrics.total(run_ok, S.N_FRAMES),
    }


def exact_figures(meta: pa.Table, run_id: str) -> dict:
    """The figures of every row of `meta` (SUMMARY_COLUMNS), percentiles exact."""
    table = metrics.normalise(meta)
    this_run = metrics.run_rows(table, run_id)
    run_ok = metrics.ok_rows(this_run)
    by_actor, engine = engines(this_run)
    idle = engine_figures([])
    per_actor = {
        actor: {**{k: figures[k] for k in ACTOR_KEYS}, **{k: by_actor.get(actor, idle)[k] for k in ENGINE_KEYS}}
        for actor, figures in metrics.per_actor(this_run).items()
    }
    errors = metrics.error_kinds(table, TOP_ERRORS, max_chars=ERROR_CHARS)
    return {
        **totals(table, this_run, run_ok),
        "per_actor": per_actor,
        "engine": engine,
        "top_errors": [{"error": k["error"], "rows": k["rows"]} for k in errors],
        "quality": quality.figures(table),
        "percentiles": EXACT,
    }


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
    """summary.json from the rows themselves (exact)."""
    return assemble(exact_figures(meta, run_id), run_id, wall_seconds, extra)


def summary_of(
    layout: OutputLayout, run_id: str, wall_seconds: float, extra: dict, distributed: bool, **options: Optional[int]
) -> dict:
    """The run's summary.json: exact in this process, or from per-file partials on Ray
    (`options`: pipeline/summary_parts.py distributed_figures')."""
    if not distributed:
        return summarize(layout.read(SUMMARY_COLUMNS), run_id, wall_seconds, extra)
    from .summary_parts import distributed_figures

    return assemble(distributed_figures(layout, run_id, **options), run_id, wall_seconds, extra)
