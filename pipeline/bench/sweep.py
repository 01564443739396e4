"""The benchmark's sweep (`python -m pipeline.bench bench=smoke|sweep|overhead output.dir=PATH`):
the end-to-end pipeline on a generated workload, once per (actors, slots) configuration of
the `bench` group, plus the one-row-at-a-time engine loop (1 actor, 1 slot) on the same rows
in the same run; writes bench.json, bench.md and report.html under output.dir.

Per configuration: rows/s, frames/s, audio seconds per wall second, p50/p95/p99 per-row
latency, time to first output row, engine busy fraction (engine step time / wall time; also
under its older name actor_utilisation), slot occupancy (mean over engine steps of live rows /
slots), peak memory per actor, KV bytes, the busy time by phase: prep (reading references,
prompts), engine, codec, write (FLAC + Parquet) -- they overlap now, so `other` is what none
of them covers; model_busy_s is the union of engine and codec time -- and vs_engine_only: the
run's frames/s over its serving time (the actors' first call to the last block's part
written; the run's end after it, shards and summary, is run_end_s; the whole run's ratio is
vs_engine_only_whole_run) over the frames/s of the same rows through the
engine alone (an engine-only pass in an actor of the same size after the run: no process
start, model load, Ray Data, codec or output; times the number of actors, whose engines run
side by side).
Wall time runs from the run's start (Ray already up: one cluster serves every configuration)
to its last row written and summarised; the report page written after that is timed apart.
Nothing here imports torch: the actors do the work.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, replace
from pathlib import Path

import pyarrow.parquet as pq

from actors.files import write_atomically

from ..cluster import connect
from ..config import BenchSettings, ChorusConfig
from ..location import is_local, local_path
from ..names import BENCH_FILE, BENCH_TABLE_FILE, REPORT_FILE
from ..run.actor_settings import actor_arguments
from ..run.steps import run
from .measure import measure, rows_saved
from .workload import make_workload

log = logging.getLogger("chorus")


def _settings(config: ChorusConfig, actors: int, slots: int, cpus: float, data_path: str, out: str) -> ChorusConfig:
    """One configuration's run config: `config` with this workload, output, slots and actors
    (new group objects: `config` itself is left as it is; the run checks the ranges)."""
    cluster = config.cluster
    # an actor call must bring at least `slots` rows, or the extra slots never fill
    cluster = replace(cluster, rows_per_block=max(cluster.rows_per_block, slots), num_actors=actors)
    if cluster.gpus_per_actor == 0:
        # CPU machine: the actors share what is left after one half CPU for reads and writes
        cluster = replace(cluster, cpus_per_actor=round(min(1.0, (cpus - 0.5) / actors), 3))
    return replace(
        config,
        data=replace(config.data, path=data_path, name="bench"),
        output=replace(config.output, dir=out, overwrite=True),
        engine=replace(config.engine, max_rows=slots),
        cluster=cluster,
    )


def engine_only_pass(run_config: ChorusConfig, workload: Path) -> dict:
    """The workload's rows through one engine alone (SynthActor.engine_only), in a fresh actor
    with the run's per-actor CPUs, threads and settings: {rows, frames, seconds, steps}."""
    import ray

    from actors.synth import SynthActor

    arguments = actor_arguments(run_config, str(workload.parent), run_id="engine-only")
    cluster = run_config.cluster
    actor = (
        ray.remote(SynthActor)
        .options(num_cpus=cluster.cpus_per_actor, num_gpus=cluster.gpus_per_actor)
        .remote(**arguments)
    )
    try:
        return ray.get(actor.engine_only.remote(pq.read_table(workload), block_rows=cluster.rows_per_block))
    finally:
        ray.kill(actor)


def markdown(report: dict) -> str:
    lines = [
        "| actors | slots | rows/s | frames/s | audio s / wall s | vs 1-row loop | vs engine only (whole run) "
        "| p50 / p95 / p99 latency ms | first row s | slot occupancy | engine busy | peak RSS MiB/actor | KV MiB "
        "| prep / engine / codec / checks / write / other s | host s per audio s | overhead (after start-up) | Ray + Parquet + FLAC | report page s "
        "| rejected rows | regenerated frames | rows saved (rejected with 1 attempt) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]

    def share(value):
        return "-" if value is None else f"{value:.0%}"

    for c in report["configs"]:
        m, s = c, c["split_s"]
        ratio = "-" if c["vs_one_row_loop"] is None else f"{c['vs_one_row_loop']:.2f}x"
        vs_engine = (
            "-" if c["vs_engine_only"] is None else f"{c['vs_engine_only']:.2f} ({c['vs_engine_only_whole_run']:.2f})"
        )
        label = f" ({c['rows_as']})" if c.get("rows_as") else ""
        lines.append(
            f"| {c['num_actors']}{label} | {c['slots']} | {m['rows_per_s']:.2f} | {m['frames_per_s']:.1f} | "
            f"{m['audio_s_per_wall_s']:.2f} | {ratio} | {vs_engine} | {m['latency_ms_p50']:.0f} / "
            f"{m['latency_ms_p95']:.0f} / {m['latency_ms_p99']:.0f} | {m['time_to_first_row_s']:.1f} | "
            f"{share(m['slot_occupancy'])} | {share(m['engine_busy'])} | "
            f"{m['peak_rss_mb_per_actor']:.0f} | {m['kv_bytes'] / 2**20:.1f} | "
            f"{s['prep']:.1f} / {s['engine']:.1f} / {s['codec']:.1f} / {s['checks']:.1f} / {s['write']:.1f} / "
            f"{s['other']:.1f} | {m['host_s_per_audio_s'].get('total', 0.0):.3f} | "
            f"{m['overhead_fraction']:.1%} ({m['overhead_fraction_after_startup']:.1%}) | "
            f"{m['pipeline_overhead_fraction']:.1%} | {m['report_s']:.1f} | "
            f"{m['rows_rejected']} | {share(m['regenerated_frames_share'])} | {_saved(c.get('single_attempt'))} |"
        )
    return "\n".join(lines) + "\n"


def _saved(single: dict | None) -> str:
    return "-" if single is None else f"{single['rows_saved']} ({single['rows_rejected']})"


def _bench_config(
    config: ChorusConfig, actors: int, slots: int, cpus: float, root: Path, workload: Path, rows_as: str = ""
) -> dict:
    """One configuration: the job on a fresh output, its figures, and the same rows through
    the engine alone for comparison. `rows_as` names the workload when there are several."""
    out = root / "runs" / (f"a{actors}-s{slots}" + (f"-{rows_as}" if rows_as else ""))
    run_config = _settings(config, actors, slots, cpus, str(workload), str(out))
    log.info("bench: %d actor(s) x %d slots on %d rows", actors, slots, config.bench.rows)
    t0, unix0 = time.monotonic(), time.time()
    finished = run(run_config)
    # the job's wall time: start to the last row written and summarised; the report page
    # written after it is timed on its own
    wall = time.monotonic() - t0 - finished.report_s
    stream = {"write_s": finished.summary.get("write_s") or 0.0, "last_block_at": finished.summary.get("last_block_at")}
    entry = {
        "num_actors": actors,
        "slots": slots,
        "rows_as": rows_as or None,
        "cpus_per_actor": run_config.cluster.cpus_per_actor,
        "output": str(out),
        **measure(str(out), wall, unix0, stream),
        "report_s": finished.report_s,
    }
    if config.bench.single_attempt_pass:
        entry["single_attempt"] = _single_attempt(run_config, root, workload, str(out))
    log.info("bench: the same rows through the engine alone (%d slots)", slots)
    alone = engine_only_pass(run_config, workload)
    # each actor's engine runs side by side with the others on its own CPU share
    alone_rate = actors * alone["frames"] / alone["seconds"] if alone["seconds"] > 0 else None
    entry["engine_only"] = {**alone, "frames_per_s": alone_rate}
    # the engine-only pass loads nothing and starts no process: the run is compared over
    # its serving time (first actor call to last row written); over the whole wall too
    entry["vs_engine_only"] = entry["frames_per_s_serving"] / alone_rate if alone_rate else None
    entry["vs_engine_only_whole_run"] = entry["frames_per_s"] / alone_rate if alone_rate else None
    return entry


def _single_attempt(run_config: ChorusConfig, root: Path, workload: Path, out: str):
    """The same rows as the configuration `run_config` (written to `out`) with one attempt
    each (no regeneration): its rows/s and rejected rows, and the rows regeneration saved
    (rejected there, ok in the configured run)."""
    cluster = run_config.cluster
    single_out = root / "runs" / f"a{cluster.num_actors}-s{run_config.engine.max_rows}-single-attempt"
    single = replace(
        run_config,
        output=replace(run_config.output, dir=str(single_out)),
        quality=replace(run_config.quality, max_attempts=1),
    )
    log.info("bench: the same rows with one attempt each (quality.max_attempts=1)")
    t0 = time.monotonic()
    finished = run(single)
    wall = time.monotonic() - t0 - finished.report_s
    return {"wall_s": wall, "rows_per_s": run_config.bench.rows / wall, **rows_saved(str(single_out), out)}


def _workloads(b: BenchSettings, root: Path) -> dict[str, Path]:
    """The generated workload(s), by what their rows are: one table, or with dialogues, the
    dialogues and the same texts as single-voice rows."""
    args = (b.rows, b.text_words, b.reference_fraction, b.seed, b.long_fraction, b.long_chars, b.dialogue_fraction)
    if not b.dialogue_fraction:
        make_workload(root / "workload.parquet", *args)
        return {"": root / "workload.parquet"}
    tables = {"dialogue": root / "workload.parquet", "single_voice": root / "workload-single-voice.parquet"}
    for rows_as, path in tables.items():
        make_workload(path, *args, single_voice=rows_as == "single_voice")
    return tables


def _against_single_voice(results: list[dict]) -> None:
    """Each dialogue run's frames/s and rows/s over its single-voice twin's (same configuration)."""
    twins = {(r["num_actors"], r["slots"]): r for r in results if r["rows_as"] == "single_voice"}
    for r in results:
        twin = twins.get((r["num_actors"], r["slots"])) if r["rows_as"] == "dialogue" else None
        if twin:
            r["vs_single_voice"] = {key: r[key] / twin[key] for key in ("frames_per_s", "rows_per_s") if twin[key]}


def run_bench(config: ChorusConfig) -> dict:
    b = config.bench
    if not is_local(config.output.dir):
        raise ValueError("the benchmark writes its tables locally: give a local output.dir")
    root = Path(local_path(config.output.dir))
    root.mkdir(parents=True, exist_ok=True)
    workloads = _workloads(b, root)
    configs = [(a, s) for a in b.actors for s in b.slots]
    if b.baseline and (1, 1) not in configs:
        configs.insert(0, (1, 1))
    import ray

    cluster = connect(config.cluster)  # one Ray for every configuration: ray.init is ~9 s
    try:
        cpus = ray.cluster_resources().get("CPU", 1.0)
        results = [
            _bench_config(config, actors, slots, cpus, root, workload, rows_as)
            for actors, slots in configs
            for rows_as, workload in workloads.items()
        ]
    finally:
        cluster.close()
    baseline = next((r for r in results if r["num_actors"] == 1 and r["slots"] == 1), None)
    _against_single_voice(results)
    for r in results:
        r["vs_one_row_loop"] = (
            r["frames_per_s"] / baseline["frames_per_s"] if baseline and baseline["frames_per_s"] else None
        )
    report = {
        "bench": asdict(b),
        "model": config.model.name,
        "engine": asdict(config.engine),
        "cpus": cpus,
        "configs": results,
    }
    write_atomically(root / BENCH_FILE, json.dumps(report, indent=2) + "\n")
    table = markdown(report)
    write_atomically(root / BENCH_TABLE_FILE, table)
    from ..report.page import write_report

    best = max(results, key=lambda r: r["frames_per_s"])
    page = write_report(
        best["output"], title=f"chorus bench: {best['num_actors']} actor(s) x {best['slots']} slots", bench=report
    )
    write_atomically(root / REPORT_FILE, Path(page).read_bytes())
    print(table, flush=True)
    print(f"chorus bench: wrote {root / BENCH_FILE}, {root / BENCH_TABLE_FILE}, {root / REPORT_FILE}", flush=True)
    return report
