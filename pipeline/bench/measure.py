"""One benchmark configuration's figures, from its output rows (every row of the output
belongs to this run: each configuration writes a fresh output): rates, latency percentiles,
the quality gate's share, slot occupancy, the actors' busy time by phase, start-up and
overhead fractions."""

from __future__ import annotations

import numpy as np
import pyarrow.compute as pc

from actors import schema as S

from ..output.layout import OutputLayout
from ..output.parts import engine_figures
from ..report import metrics
from ..report import quality_figures as quality


def measure(output_dir: str, wall_s: float, started_unix: float, stream: dict) -> dict:
    """The figures of one configuration's run, from its output rows (every row of the output
    belongs to this run: each configuration writes a fresh output)."""
    meta = OutputLayout(output_dir).read(S.METADATA_COLUMNS, latest_only=False)
    table = metrics.normalise(meta)
    counted, ok = metrics.counts(table), metrics.ok_rows(table)
    gate = quality.figures(table)
    frames = metrics.total(ok, S.N_FRAMES)
    audio = metrics.total(ok, S.AUDIO_SECONDS)
    p50, p95, p99 = metrics.percentiles(ok.column(S.TOTAL_MS), [50, 95, 99])
    calls = metrics.batches(meta)
    call_rows, actors = calls.to_pylist(), metrics.actor_batches(calls).to_pylist()
    finished = pc.min(table.column(S.FINISHED_AT)).as_py()
    times = _times(actors, wall_s, started_unix, stream)
    startup, model_busy, serving_s = times["startup_s"], times["model_busy_s"], times["serving_s"]
    per_actor = _per_actor(actors, call_rows, wall_s)
    engine_busy = float(np.mean([a["utilisation"] for a in per_actor.values()])) if per_actor else None
    return {
        "rows": counted["rows"],
        "rows_ok": counted["rows_ok"],
        "rows_error": counted["rows_error"],
        # the quality gate: rows kept as rejected, and the frames regeneration generated and
        # discarded, as a share of all frames generated (pipeline/report/quality_figures.py)
        "rows_rejected": gate["rows_by_status"].get(S.STATUS_REJECTED, 0),
        "regenerated_frames_share": gate["discarded_share"],
        "frames": frames,
        "audio_seconds": audio,
        "wall_s": wall_s,
        "rows_per_s": counted["rows"] / wall_s,
        "frames_per_s": frames / wall_s,
        "audio_s_per_wall_s": audio / wall_s,
        "latency_ms_p50": p50,
        "latency_ms_p95": p95,
        "latency_ms_p99": p99,
        "time_to_first_row_s": (finished - started_unix) if finished is not None else None,
        "actors": len(actors),
        "per_actor": per_actor,
        "engine_busy": engine_busy,
        "actor_utilisation": engine_busy,
        "slot_occupancy": engine_figures(call_rows)["slot_occupancy"],
        "peak_rss_mb_per_actor": max((a["peak_rss_mb"] for a in per_actor.values()), default=None),
        "kv_bytes": pc.max(calls.column(S.BATCH_KV_BYTES)).as_py(),
        "split_s": _phase_split(actors, stream, wall_s),
        "host_s_per_audio_s": host_cost(actors, stream, audio),
        "frames_per_s_serving": frames / serving_s,
        "model_busy_s": model_busy,
        # the wall time in which neither the engine nor the codec ran (the actor fed continuously
        # runs them at once, so their union counts, not their sum), as a share of wall time:
        # all of it, and after the actors' start-up (what a long job converges to)
        "overhead_fraction": max(0.0, 1.0 - model_busy / wall_s),
        "actor_startup_s": startup,
        "run_end_s": times["run_end_s"],
        "overhead_fraction_after_startup": max(0.0, 1.0 - model_busy / serving_s),
        "actor_init_s": times["model_load_s"],
        # Ray + Parquet + FLAC: the wall time that is neither the model's work nor its loading
        "pipeline_overhead_fraction": max(0.0, 1.0 - (model_busy + times["model_load_s"]) / wall_s),
    }


def _times(actors: list[dict], wall_s: float, started_unix: float, stream: dict) -> dict:
    """The run's time split: the actors' start-up, their own construction within it, their
    model-busy seconds, and the serving window with the run's end after it."""
    # actor start-up (process, torch import, model + codec load): run start to its first call
    startup = float(np.mean([a[f"{S.BATCH_STARTED_AT}_min"] - started_unix for a in actors])) if actors else 0.0
    # of which the actors' own construction (imports, model + codec load), not Ray's
    model_load = float(np.mean([a[f"{S.BATCH_ACTOR_INIT_MS}_first"] for a in actors])) / 1000.0 if actors else 0.0
    # per actor: the seconds its engine or codec ran (their union: they overlap)
    model_busy = float(np.mean([(a[f"{S.BATCH_ACTOR_MODEL_BUSY_MS}_max"] or 0.0) for a in actors])) / 1000.0
    # serving: the actors' first call to the last row written (the last block's part reached the
    # driver); the run's end after it (older copies dropped, parts packed into shards,
    # summary.json) is once per job, not per row: run_end_s, apart
    last_block_at = stream.get("last_block_at")
    streamed_s = min(wall_s, last_block_at - started_unix) if last_block_at else wall_s
    return {
        "startup_s": startup,
        "model_load_s": model_load,
        "model_busy_s": model_busy,
        "serving_s": max(streamed_s - startup, 1e-9),
        "run_end_s": wall_s - streamed_s,
    }


def _per_actor(actors: list[dict], call_rows: list[dict], wall_s: float) -> dict:
    """Each actor's busy seconds, utilisation, slot occupancy, peak RSS and rows."""
    return {
        a["actor"]: {
            "engine_busy_s": a[f"{S.BATCH_ENGINE_MS}_sum"] / 1000.0,
            "model_busy_s": (a[f"{S.BATCH_ACTOR_MODEL_BUSY_MS}_max"] or 0.0) / 1000.0,
            "utilisation": a[f"{S.BATCH_ENGINE_MS}_sum"] / 1000.0 / wall_s,
            "slot_occupancy": engine_figures(c for c in call_rows if c["actor"] == a["actor"])["slot_occupancy"],
            "peak_rss_mb": a[f"{S.BATCH_PEAK_RSS_MB}_max"],
            "rows": a[f"{S.BATCH_ROWS}_sum"],
        }
        for a in actors
    }


def _phase_split(actors: list[dict], stream: dict, wall_s: float) -> dict:
    """Per-actor average busy seconds by phase; `other` is what is left of the wall time."""
    n_actors = max(1, len(actors))

    def phase_s(key: str) -> float:
        return sum(a[f"{key}_sum"] for a in actors) / 1000.0 / n_actors

    prep, engine, codec, encode, checks = (
        phase_s(k) for k in (S.BATCH_PREP_MS, S.BATCH_ENGINE_MS, S.BATCH_CODEC_MS, S.BATCH_ENCODE_MS, S.BATCH_CHECKS_MS)
    )
    write = encode + stream.get("write_s", 0.0) / n_actors
    return {
        "prep": prep,
        "engine": engine,
        "codec": codec,
        "checks": checks,
        "write": write,
        "other": max(0.0, wall_s - prep - engine - codec - checks - write),
    }


def host_cost(actors: list[dict], stream: dict, audio_s: float) -> dict:
    """Seconds of host work per second of audio, per stage, summed over the actors: preparing
    rows (clips, prompts), the codec hand-off (decode calls, as the finisher waits on them),
    the checks on decoded audio (CPU time), FLAC and the output rows, and the driver's Parquet
    writes. Their sum times a rate (audio seconds per second) is the host cores that rate needs."""
    if not audio_s:
        return {}

    def total_s(key: str) -> float:
        return sum(a[f"{key}_sum"] or 0.0 for a in actors) / 1000.0

    stages = {
        "prep": total_s(S.BATCH_PREP_MS),
        "codec": total_s(S.BATCH_CODEC_MS),
        "checks": total_s(S.BATCH_CHECKS_MS),
        "flac_and_rows": total_s(S.BATCH_ENCODE_MS),
        "parquet_write": stream.get("write_s", 0.0),
    }
    per_audio_s = {stage: seconds / audio_s for stage, seconds in stages.items()}
    return {**per_audio_s, "total": sum(per_audio_s.values())}


def rows_saved(single_attempt_output: str, output: str) -> dict:
    """Rows rejected with one attempt each, and of those the rows the configured run (with
    regeneration) wrote ok: what regeneration saved."""
    columns = [S.ID, S.STATUS]
    single = OutputLayout(single_attempt_output).read(columns, latest_only=False).to_pylist()
    regenerated = {r[S.ID]: r[S.STATUS] for r in OutputLayout(output).read(columns, latest_only=False).to_pylist()}
    rejected = [r[S.ID] for r in single if r[S.STATUS] == S.STATUS_REJECTED]
    saved = sum(1 for i in rejected if regenerated.get(i) == S.STATUS_OK)
    return {"rows_rejected": len(rejected), "rows_saved": saved}
