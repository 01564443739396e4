"""`python -m pipeline.bench bench=smoke|sweep|overhead output.dir=PATH [any run setting]`:
the end-to-end pipeline on a generated workload, once per (actors, slots) configuration of
the `bench` group, plus the one-row-at-a-time engine loop (1 actor, 1 slot) on the same rows
in the same run; writes bench.json, bench.md and report.html under output.dir.

Per configuration: rows/s, frames/s, audio seconds per wall second, p50/p95/p99 per-row
latency, time to first output row, engine busy fraction (engine step time / wall time; also
under its older name actor_utilisation), slot occupancy (mean over engine steps of live rows /
slots), peak memory per actor, KV bytes, the busy time by phase: prep (reading references,
prompts), engine, codec, write (FLAC + Parquet) -- they overlap now, so `other` is what none
of them covers; model_busy_s is the union of engine and codec time -- and vs_engine_only: the
run's frames/s over its serving time (the actors' first call to the last row written; the
whole run's ratio is vs_engine_only_whole_run) over the frames/s of the same rows through the
engine alone (an engine-only pass in an actor of the same size after the run: no process
start, model load, Ray Data, codec or output; times the number of actors, whose engines run
side by side).
Wall time runs from the run's start (Ray already up: one cluster serves every configuration)
to its last row written and summarised; the report page written after that is timed apart.
Nothing here imports torch: the actors do the work.
"""

from __future__ import annotations

import copy
import json
import logging
import math
import sys
import time
from pathlib import Path

import hydra
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from omegaconf import DictConfig, OmegaConf

from actors import schema as S
from actors.cli import error
from actors.files import write_atomically

from . import metrics, quality
from .config import CONF_DIR, REPO_ROOT
from .output import OutputLayout, engine_figures, is_local, local_path
from .plan import run
from .stream import connect

log = logging.getLogger("chorus")

DEMO_TABLE = REPO_ROOT / "data" / "demo" / "demo.parquet"


def make_workload(
    path: Path,
    rows: int,
    text_words: float,
    reference_fraction: float,
    seed: int,
    long_fraction: float = 0.0,
    long_chars: int = 3000,
) -> None:
    """A seeded table of `rows` texts (lognormal word counts around `text_words`, words from
    the demo texts) where a `reference_fraction` share of rows carries one of the demo's real
    speech clips as bytes (rows naming the same clip share its `ref_id`), and a
    `long_fraction` share is long text: sentences of such words up to `long_chars` characters."""
    demo = pq.read_table(DEMO_TABLE).to_pylist()
    words = sorted({w.strip(".,!?") for r in demo for w in r[S.TEXT].split() if w.strip(".,!?")})
    refs = []
    for r in demo:
        if r.get(S.REF_AUDIO_PATH) and r.get(S.REF_TEXT):
            clip = (DEMO_TABLE.parent / r[S.REF_AUDIO_PATH]).read_bytes()
            if all(clip != c for c, _, _ in refs):
                refs.append((clip, r[S.REF_TEXT], Path(r[S.REF_AUDIO_PATH]).stem))
    rng = np.random.default_rng(seed)
    table = {S.ID: [], S.TEXT: [], S.REF_AUDIO: [], S.REF_TEXT: [], S.REF_ID: []}
    for i in range(rows):
        n = max(1, int(round(rng.lognormal(math.log(text_words), 0.5))))
        text = " ".join(rng.choice(words, n)).capitalize() + "."
        if long_fraction and rng.random() < long_fraction:
            sentences = []
            while sum(len(s) + 1 for s in sentences) < long_chars:
                sentences.append(" ".join(rng.choice(words, int(rng.integers(6, 16)))).capitalize() + ".")
            text = " ".join(sentences)[:long_chars].rstrip() + "."
        ref = refs[int(rng.integers(len(refs)))] if refs and rng.random() < reference_fraction else None
        table[S.ID].append(f"bench-{i:06d}")
        table[S.TEXT].append(text)
        table[S.REF_AUDIO].append(ref[0] if ref else None)
        table[S.REF_TEXT].append(ref[1] if ref else None)
        table[S.REF_ID].append(ref[2] if ref else None)
    pq.write_table(
        pa.table(
            table,
            schema=pa.schema(
                [
                    (S.ID, pa.string()),
                    (S.TEXT, pa.string()),
                    (S.REF_AUDIO, pa.binary()),
                    (S.REF_TEXT, pa.string()),
                    (S.REF_ID, pa.string()),
                ]
            ),
        ),
        path,
    )


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
    call_rows = calls.to_pylist()
    actors = metrics.actor_batches(calls).to_pylist()
    finished = pc.min(table.column(S.FINISHED_AT)).as_py()
    # actor start-up (process, torch import, model + codec load): run start to its first call
    startup = float(np.mean([a[f"{S.BATCH_STARTED_AT}_min"] - started_unix for a in actors])) if actors else 0.0
    # of which the actors' own construction (imports, model + codec load), not Ray's
    model_load = float(np.mean([a[f"{S.BATCH_ACTOR_INIT_MS}_first"] for a in actors])) / 1000.0 if actors else 0.0
    # per actor: the seconds its engine or codec ran (their union: they overlap)
    model_busy = float(np.mean([(a[f"{S.BATCH_ACTOR_MODEL_BUSY_MS}_max"] or 0.0) for a in actors])) / 1000.0
    serving_s = max(wall_s - startup, 1e-9)  # the actors' first call to the last row written
    per_actor = _per_actor(actors, call_rows, wall_s)
    return {
        "rows": counted["rows"],
        "rows_ok": counted["rows_ok"],
        "rows_error": counted["rows_error"],
        # the quality gate: rows kept as rejected, and the frames regeneration generated and
        # discarded, as a share of all frames generated (pipeline/quality.py)
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
        "engine_busy": float(np.mean([a["utilisation"] for a in per_actor.values()])) if per_actor else None,
        "actor_utilisation": float(np.mean([a["utilisation"] for a in per_actor.values()])) if per_actor else None,
        "slot_occupancy": engine_figures(call_rows)["slot_occupancy"],
        "peak_rss_mb_per_actor": max((a["peak_rss_mb"] for a in per_actor.values()), default=None),
        "kv_bytes": pc.max(calls.column(S.BATCH_KV_BYTES)).as_py(),
        "split_s": _phase_split(actors, stream, wall_s),
        "frames_per_s_serving": frames / serving_s,
        "model_busy_s": model_busy,
        # the wall time in which neither the engine nor the codec ran (the actor fed continuously
        # runs them at once, so their union counts, not their sum), as a share of wall time:
        # all of it, and after the actors' start-up (what a long job converges to)
        "overhead_fraction": max(0.0, 1.0 - model_busy / wall_s),
        "actor_startup_s": startup,
        "overhead_fraction_after_startup": max(0.0, 1.0 - model_busy / serving_s),
        "actor_init_s": model_load,
        # Ray + Parquet + FLAC: the wall time that is neither the model's work nor its loading
        "pipeline_overhead_fraction": max(0.0, 1.0 - (model_busy + model_load) / wall_s),
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

    prep, engine, codec, encode = (
        phase_s(k) for k in (S.BATCH_PREP_MS, S.BATCH_ENGINE_MS, S.BATCH_CODEC_MS, S.BATCH_ENCODE_MS)
    )
    write = encode + stream.get("write_s", 0.0) / n_actors
    return {
        "prep": prep,
        "engine": engine,
        "codec": codec,
        "write": write,
        "other": max(0.0, wall_s - prep - engine - codec - write),
    }


def _settings(cfg: DictConfig, actors: int, slots: int, cpus: float, data_path: str, out: str) -> DictConfig:
    run_cfg = copy.deepcopy(cfg)  # keeps the schema: its types check what is set here too
    OmegaConf.set_struct(run_cfg, True)
    run_cfg.data.path = data_path
    run_cfg.data.name = "bench"
    run_cfg.output.dir = out
    run_cfg.output.overwrite = True
    run_cfg.engine.max_rows = slots
    # an actor call must bring at least `slots` rows, or the extra slots never fill
    run_cfg.cluster.rows_per_block = max(cfg.cluster.rows_per_block, slots)
    run_cfg.cluster.num_actors = actors
    if cfg.cluster.gpus_per_actor == 0:
        # CPU machine: the actors share what is left after one half CPU for reads and writes
        run_cfg.cluster.cpus_per_actor = round(min(1.0, (cpus - 0.5) / actors), 3)
    return run_cfg


def engine_only_pass(run_cfg: DictConfig, workload: Path) -> dict:
    """The workload's rows through one engine alone (SynthActor.engine_only), in a fresh actor
    with the run's per-actor CPUs, threads and settings: {rows, frames, seconds, steps}."""
    import ray

    from actors.synth import SynthActor

    from .plan import actor_arguments

    arguments = actor_arguments(run_cfg, str(workload.parent), run_id="engine-only")
    actor = (
        ray.remote(SynthActor)
        .options(num_cpus=run_cfg.cluster.cpus_per_actor, num_gpus=run_cfg.cluster.gpus_per_actor)
        .remote(**arguments)
    )
    try:
        return ray.get(actor.engine_only.remote(pq.read_table(workload), block_rows=run_cfg.cluster.rows_per_block))
    finally:
        ray.kill(actor)


def markdown(report: dict) -> str:
    lines = [
        "| actors | slots | rows/s | frames/s | audio s / wall s | vs 1-row loop | vs engine only (whole run) "
        "| p50 / p95 / p99 latency ms | first row s | slot occupancy | engine busy | peak RSS MiB/actor | KV MiB "
        "| prep / engine / codec / write / other s | overhead (after start-up) | Ray + Parquet + FLAC | report page s "
        "| rejected rows | regenerated frames |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]

    def share(value):
        return "-" if value is None else f"{value:.0%}"

    for c in report["configs"]:
        m, s = c, c["split_s"]
        ratio = "-" if c["vs_one_row_loop"] is None else f"{c['vs_one_row_loop']:.2f}x"
        vs_engine = (
            "-" if c["vs_engine_only"] is None else f"{c['vs_engine_only']:.2f} ({c['vs_engine_only_whole_run']:.2f})"
        )
        lines.append(
            f"| {c['num_actors']} | {c['slots']} | {m['rows_per_s']:.2f} | {m['frames_per_s']:.1f} | "
            f"{m['audio_s_per_wall_s']:.2f} | {ratio} | {vs_engine} | {m['latency_ms_p50']:.0f} / "
            f"{m['latency_ms_p95']:.0f} / {m['latency_ms_p99']:.0f} | {m['time_to_first_row_s']:.1f} | "
            f"{share(m['slot_occupancy'])} | {share(m['engine_busy'])} | "
            f"{m['peak_rss_mb_per_actor']:.0f} | {m['kv_bytes'] / 2**20:.1f} | "
            f"{s['prep']:.1f} / {s['engine']:.1f} / {s['codec']:.1f} / {s['write']:.1f} / {s['other']:.1f} | "
            f"{m['overhead_fraction']:.1%} ({m['overhead_fraction_after_startup']:.1%}) | "
            f"{m['pipeline_overhead_fraction']:.1%} | {m['report_s']:.1f} | "
            f"{m['rows_rejected']} | {share(m['regenerated_frames_share'])} |"
        )
    return "\n".join(lines) + "\n"


def _bench_config(cfg: DictConfig, actors: int, slots: int, cpus: float, root: Path, workload: Path) -> dict:
    """One configuration: the job on a fresh output, its figures, and the same rows through
    the engine alone for comparison."""
    out = root / "runs" / f"a{actors}-s{slots}"
    run_cfg = _settings(cfg, actors, slots, cpus, str(workload), str(out))
    log.info("bench: %d actor(s) x %d slots on %d rows", actors, slots, cfg.bench.rows)
    t0, unix0 = time.monotonic(), time.time()
    finished = run(run_cfg)
    # the job's wall time: start to the last row written and summarised; the report page
    # written after it is timed on its own
    wall = time.monotonic() - t0 - finished.report_s
    stream = {"write_s": finished.summary.get("write_s") or 0.0}
    entry = {
        "num_actors": actors,
        "slots": slots,
        "cpus_per_actor": run_cfg.cluster.cpus_per_actor,
        "output": str(out),
        **measure(str(out), wall, unix0, stream),
        "report_s": finished.report_s,
    }
    log.info("bench: the same rows through the engine alone (%d slots)", slots)
    alone = engine_only_pass(run_cfg, workload)
    # each actor's engine runs side by side with the others on its own CPU share
    alone_rate = actors * alone["frames"] / alone["seconds"] if alone["seconds"] > 0 else None
    entry["engine_only"] = {**alone, "frames_per_s": alone_rate}
    # the engine-only pass loads nothing and starts no process: the run is compared over
    # its serving time (first actor call to last row written); over the whole wall too
    entry["vs_engine_only"] = entry["frames_per_s_serving"] / alone_rate if alone_rate else None
    entry["vs_engine_only_whole_run"] = entry["frames_per_s"] / alone_rate if alone_rate else None
    return entry


def run_bench(cfg: DictConfig) -> dict:
    b = cfg.bench
    if not is_local(cfg.output.dir):
        raise ValueError("the benchmark writes its tables locally: give a local output.dir")
    root = Path(local_path(cfg.output.dir))
    root.mkdir(parents=True, exist_ok=True)
    workload = root / "workload.parquet"
    make_workload(workload, b.rows, b.text_words, b.reference_fraction, b.seed, b.long_fraction, b.long_chars)
    configs = [(a, s) for a in b.actors for s in b.slots]
    if b.baseline and (1, 1) not in configs:
        configs.insert(0, (1, 1))
    import ray

    plain_cluster = OmegaConf.to_container(cfg.cluster, resolve=True)
    started_ray = connect(plain_cluster)  # one Ray for every configuration: ray.init is ~9 s
    try:
        cpus = ray.cluster_resources().get("CPU", 1.0)
        results = [_bench_config(cfg, actors, slots, cpus, root, workload) for actors, slots in configs]
    finally:
        if started_ray:
            ray.shutdown()
    baseline = next((r for r in results if r["num_actors"] == 1 and r["slots"] == 1), None)
    for r in results:
        r["vs_one_row_loop"] = (
            r["frames_per_s"] / baseline["frames_per_s"] if baseline and baseline["frames_per_s"] else None
        )
    report = {
        "bench": OmegaConf.to_container(b, resolve=True),
        "model": cfg.model.name,
        "engine": OmegaConf.to_container(cfg.engine, resolve=True),
        "cpus": cpus,
        "configs": results,
    }
    write_atomically(root / "bench.json", json.dumps(report, indent=2) + "\n")
    table = markdown(report)
    write_atomically(root / "bench.md", table)
    from .report import write_report

    best = max(results, key=lambda r: r["frames_per_s"])
    page = write_report(
        best["output"], title=f"chorus bench: {best['num_actors']} actor(s) x {best['slots']} slots", bench=report
    )
    write_atomically(root / "report.html", Path(page).read_bytes())
    print(table, flush=True)
    print(f"chorus bench: wrote {root / 'bench.json'}, {root / 'bench.md'}, {root / 'report.html'}", flush=True)
    return report


@hydra.main(version_base=None, config_path=str(CONF_DIR), config_name="config")
def main(cfg: DictConfig) -> None:
    if not cfg.bench.enabled:
        sys.exit(error("choose a benchmark: bench=smoke, bench=sweep or bench=overhead"))
    run_bench(cfg)


if __name__ == "__main__":
    main()
