"""The figures summary.json is made of, computed exactly over a table of output rows: the
columns read, the totals, per-actor and engine figures, the top errors, the quality object.
pipeline/report/summary_merge.py computes the same figures per file and merges them."""

from __future__ import annotations

import pyarrow as pa

from actors import schema as S

from ..output.parts import engine_figures
from . import metrics
from . import quality_figures as quality

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
    # summary.json's quality object (pipeline/report/quality_figures.py)
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
    """What the engines did for these rows' batches (parts.engine_figures): per actor, and
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
