"""One synthesis run: check the input and output, build the Ray Data plan, stream it, report.

    plan (pipeline/resume.py: every row new / done / changed / retry / rejected)
      -> read the chosen rows (pipeline/todo_read.py: small blocks, content hash attached)
      -> map_batches(SynthActor, actor pool)
      -> map_batches(write_block): one crash-safe part file per block, stats back to the driver
      (Ray tasks, while it runs): each shard's worth of parts packed into a shard

The driver consumes the stream of per-block stats: that is the progress, and what fills a
shard starts its compaction (pipeline/compaction.py); the run's end packs the remaining
parts. The live files are the resume state (pipeline/output.py). Nothing here imports torch.
"""

from __future__ import annotations

import datetime
import json
import logging
import math
import os
import shutil
import time
import uuid
import warnings
from dataclasses import dataclass, replace

import pyarrow.fs as pafs
from omegaconf import DictConfig, OmegaConf

from actors import schema as S
from actors.demo import cache_root
from actors.files import write_atomically
from actors.settings import ActorSettings, CrashSettings, RunContext

from . import planner as P
from . import readahead, shards, supersede
from .compaction import RunningCompaction
from .config import ConfigError, in_ray_job, settings, to_plain, validate
from .executor_stats import TRIM_EVERY_BLOCKS, trim_block_stats
from .inputs import InputScan, file_ids_digest, ids_digest, output_inside_input, scan_input
from .lease import Lease, OutputInUse
from .output import (
    ATTEMPTS_DIR,
    CONFIG_FILE,
    REJECTED_PART,
    SUMMARY_FILE,
    OutputLayout,
    is_local,
    local_path,
    write_block,
)
from .planning import todo_fragments, use_distributed
from .progress import Progress
from .resume import plan_job, rejected_id_array, rejected_rows, write_changed
from .summary import summary_of

log = logging.getLogger("chorus")


@dataclass
class RunReport:
    output: str
    summary: dict
    report_s: float = 0.0  # writing report.html, after the data is complete (not in summary wall_s)


def _check_settings(cfg: DictConfig, plain: dict) -> None:
    """Everything about the settings that can be checked before Ray starts: each group's range
    checks (pipeline/config.py::validate), then what depends on where the run is."""
    validate(cfg)
    output = plain["output"]
    if in_ray_job() and is_local(output["dir"]) and not os.path.isabs(os.path.expanduser(output["dir"])):
        raise ConfigError(
            f"output.dir={output['dir']!r} is relative: inside a Ray Job that is the job's "
            f"temporary working directory, deleted afterwards; pass an absolute path or a URI"
        )
    model = plain["model"]
    checkpoint = model["checkpoint"]
    if checkpoint is not None and is_local(checkpoint):
        if not os.path.isfile(os.path.join(local_path(checkpoint), "config.json")):
            raise ConfigError(f"model.checkpoint={checkpoint!r} is not a checkpoint directory (no config.json there)")
        codec = model["codec"] or os.path.join(checkpoint, "codec.pth")
        if is_local(codec) and not os.path.exists(local_path(codec)):
            raise ConfigError(f"codec {codec!r} does not exist (set model.codec)")


# the built-in demo is built from these sources (actors/demo.py), so they are its weights
_DEMO_SOURCES = ("actors/demo.py", "actors/engine/tiny.py", "actors/codec/tiny.py")
# the settings a row's audio depends on (the rest -- batching, threads, compile -- leave the
# codes of a row unchanged, which the determinism tests check)
_ROW_SETTINGS = {
    "engine": ("max_tokens", "max_frames", "frames_per_char", "min_frames", "stop_on_eos"),
    "data": (
        "audio_root",
        "max_reference_seconds",
        "max_reference_bytes",
        "max_text_chars",
        "max_text_bytes",
        "allow_special_tokens",
    ),
    "long_form": ("segment_bytes", "max_turns", "history_fraction"),
}
# whole-file hashes of model files, keyed by path, size and modification time: a multi-GB
# checkpoint is read once per machine, not at every run start
FILE_HASH_CACHE = "file-hashes.json"  # in the cache directory (actors/demo.py cache_root: $CHORUS_CACHE)
_FILE_HASH_CACHE_ENTRIES = 4096


def _file_hashes(fs, files: list) -> list[str]:
    """Each file's content hash (blake2b of every byte), from the cache when its path, size
    and modification time are unchanged."""
    import hashlib

    cache_file = cache_root() / FILE_HASH_CACHE
    try:
        cache = json.loads(cache_file.read_text())
        cache = cache if isinstance(cache, dict) else {}
    except (OSError, ValueError):
        cache = {}
    hashes, fresh = [], False
    for f in files:
        key = f"{fs.type_name}:{f.path}|{f.size}|{f.mtime_ns}"
        if key not in cache:
            digest = hashlib.blake2b(digest_size=16)
            with fs.open_input_stream(f.path) as handle:
                while chunk := handle.read(8 << 20):
                    digest.update(chunk)
            cache[key], fresh = digest.hexdigest(), True
        hashes.append(cache[key])
    if fresh:
        try:
            cache_file.parent.mkdir(parents=True, exist_ok=True)
            kept = dict(list(cache.items())[-_FILE_HASH_CACHE_ENTRIES:])
            write_atomically(str(cache_file), json.dumps(kept))
        except OSError as e:  # a read-only home: hash again next time
            log.warning("could not save file hashes to %s: %r", cache_file, e)
    return hashes


def _fingerprint_location(digest, location: str) -> None:
    import pyarrow.fs as pafs

    from .output import open_location

    fs, path = open_location(location)
    info = fs.get_file_info(path)
    if info.type == pafs.FileType.Directory:
        entries = [f for f in fs.get_file_info(pafs.FileSelector(path, recursive=True)) if f.type == pafs.FileType.File]
    elif info.type == pafs.FileType.File:
        entries = [info]
    else:
        digest.update(f"missing:{location}".encode())
        return
    entries.sort(key=lambda e: e.path)
    for f, content in zip(entries, _file_hashes(fs, entries)):
        digest.update(f"{f.path[len(path) :]}|{f.size}|{content}|".encode())


def model_fingerprint(model: dict) -> str:
    """What the model's weights are, not what its folder is called: the content of every
    file of the checkpoint and codec (hashed whole; see _file_hashes for the cache)."""
    import hashlib

    from .config import REPO_ROOT

    digest = hashlib.blake2b(digest_size=16)
    if model["checkpoint"] is None:
        for source in _DEMO_SOURCES:
            digest.update(source.encode() + b"\x00" + (REPO_ROOT / source).read_bytes())
    else:
        _fingerprint_location(digest, model["checkpoint"])
        codec = model["codec"] or model["checkpoint"].rstrip("/") + "/codec.pth"
        _fingerprint_location(digest, codec)
    return digest.hexdigest()


def settings_digest(plain: dict, fingerprint: str) -> str:
    """One digest of every setting a row's audio depends on, the model's fingerprint included."""
    import hashlib

    relevant = {
        "model": {
            "name": plain["model"]["name"],
            "fingerprint": fingerprint,
            "dtype": plain["model"]["dtype"],
            "codec_dtype": plain["model"]["codec_dtype"],
        },
        "sampling": plain["sampling"],
        "keep_codes": plain["output"]["keep_codes"],
        **{group: {k: plain[group].get(k) for k in keys} for group, keys in _ROW_SETTINGS.items()},
    }
    return hashlib.blake2b(json.dumps(relevant, sort_keys=True).encode(), digest_size=16).hexdigest()


def input_ids_digest(scan: InputScan, distributed: bool) -> str:
    """The input's ids in order, as one digest (inputs.ids_digest): each file's ids hashed by
    its own Ray task when the job is planned distributed, else here."""
    id_column = next((name for name, canonical in scan.rename.items() if canonical == S.ID), S.ID)
    if not distributed or len(scan.files) == 1 and scan.total_rows < 1_000_000:
        return ids_digest([file_ids_digest(path, scan.filesystem, id_column) for path in scan.files])
    import ray

    task = ray.remote(num_cpus=0.25)(file_ids_digest)
    return ids_digest(ray.get([task.remote(path, scan.filesystem, id_column) for path in scan.files]))


def _identity(plain: dict, scan: InputScan, ids: str) -> dict:
    """What an output belongs to: the input's ids (not its path: a Ray Job reads its copy of
    the table from a new temporary directory each time) and the model."""
    checkpoint = plain["model"]["checkpoint"]
    return {
        "input_rows": scan.total_rows,
        "input_ids": ids,
        "model": plain["model"]["name"],
        "checkpoint": os.path.basename(os.path.normpath(checkpoint)) if checkpoint else None,
    }


# Ray keeps at most ~num_cpus workers around and kills the rest once idle for 1 s. The actors
# hold workers for the whole run, so on a small node every write task found its worker killed
# and booted a fresh Python (~1 CPU-second each, every ~1.3 s: measured 23 worker boots in one
# 80 s run on 2 CPUs, CPU taken from the actors). Idle workers now live for a minute. For a
# `ray start` cluster set RAY_idle_worker_killing_time_threshold_ms=60000 on the nodes.
LOCAL_RAY_SYSTEM_CONFIG = {"idle_worker_killing_time_threshold_ms": 60_000}


def connect(cluster: dict) -> bool:
    """Join or start Ray; True when this call started it (and so should stop it).

    cluster.address null: RAY_ADDRESS (a Ray Job sets it) or else a new local Ray; "auto":
    Ray's discovery of a `ray start` cluster on this machine; anything else: that address."""
    import ray

    if ray.is_initialized():
        return False
    address = cluster["address"] or os.environ.get("RAY_ADDRESS") or "local"
    options = {}
    if address == "local":
        options = {
            "num_cpus": cluster["num_cpus"],
            "include_dashboard": False,
            "_system_config": LOCAL_RAY_SYSTEM_CONFIG,
        }
    ray.init(address=address, **options)
    import ray.data  # noqa: F401  (~0.7 s: once per driver, with the cluster, not inside a run's clock)

    return True


def _check_resources(cluster: dict) -> None:
    import ray

    cpus = ray.cluster_resources().get("CPU", 0.0)
    wanted = cluster["num_actors"] * cluster["cpus_per_actor"]
    if cpus and wanted >= cpus:
        message = (
            f"{cluster['num_actors']} actors x {cluster['cpus_per_actor']} CPU = {wanted:g} CPU of the "
            f"cluster's {cpus:g}: nothing is left for reading and writing, and the run would "
            f"hang; lower cluster.cpus_per_actor or cluster.num_actors"
        )
        if cluster["gpus_per_actor"] == 0:
            raise ConfigError(message)
        log.warning(message)  # GPU clusters may still be scaling up


def attempts_dir(output_location: str, run_id: str) -> str:
    """Where actors count the blocks that killed them: beside the output when it is local (a
    shared filesystem serves every node), else in this machine's cache (one node only)."""
    if is_local(output_location):
        return os.path.join(local_path(output_location), ATTEMPTS_DIR, run_id)
    return os.path.join(os.path.expanduser("~"), ".cache", "chorus", ATTEMPTS_DIR, run_id)


def blocks_per_actor(rows: int, rows_per_block: int, actors: int) -> int:
    """Each actor's share of an input's blocks (rounded up)."""
    return math.ceil(math.ceil(rows / rows_per_block) / max(1, actors))


def concurrent_blocks(engine, rows_per_block: int, rows: int | None = None, actors: int = 1) -> int:
    """Blocks one actor holds at once: engine.max_concurrent_blocks, or (null) enough that the
    rows in flight cover the slots and the feed queue, plus two: one whose last rows are
    finishing and one being prepared. With fewer, a slot freed near a block's end waits for
    Ray to hand over the next block and for its references (measured on the demo, 16 slots,
    16-row blocks: 2 blocks 71% slot occupancy, 4 blocks 89%). Given the input's `rows`, never
    more than each actor's share of its blocks: Ray Data hands blocks to whichever actor has
    room, so an actor that starts first would otherwise take a small job's every block while
    the others sit idle."""
    if engine.max_concurrent_blocks is not None:
        return int(engine.max_concurrent_blocks)
    cover = -(-(engine.max_rows + engine.feed_queue_rows) // rows_per_block) + 2
    if rows is None:
        return cover
    return max(1, min(cover, blocks_per_actor(rows, rows_per_block, actors)))


# cluster.max_actor_restarts null: restarts each actor may use, for deaths that are no row's
# fault (a node lost, memory pressure) ...
BASE_ACTOR_RESTARTS = 10
# ... plus what one row that kills its actor costs (crash_quarantine_after + 1 deaths before
# it is quarantined) for every this many blocks an actor takes
BLOCKS_PER_TOLERATED_CRASH = 100


def actor_restarts(cluster: dict, rows: int) -> int:
    """Restarts each actor is allowed: cluster.max_actor_restarts, or (null) a budget that grows
    with the input, so that a long job survives a few rows that crash their actor (each costs
    crash_quarantine_after + 1 deaths) while an actor that keeps dying for another reason still
    ends the job instead of restarting forever."""
    if cluster["max_actor_restarts"] is not None:
        return int(cluster["max_actor_restarts"])
    share = blocks_per_actor(rows, cluster["rows_per_block"], cluster["num_actors"])
    tolerated = max(1, math.ceil(share / BLOCKS_PER_TOLERATED_CRASH))
    return BASE_ACTOR_RESTARTS + (cluster["crash_quarantine_after"] + 1) * tolerated


# the run config's groups SynthActor receives, as their dataclasses (actors/settings.py)
ACTOR_GROUPS = ("model", "data", "engine", "long_form", "sampling", "quality")


def actor_arguments(
    cfg: DictConfig, input_dir: str | None, run_id: str, attempts: str | None = None, rows: int | None = None
) -> dict:
    """SynthActor's constructor arguments: one ActorSettings (actors/settings.py) holding the
    actor's groups as typed dataclasses (`OmegaConf.to_object`: resolved, each default from its
    dataclass), the run context and the crash settings; small, picklable and the same on every
    actor. `rows`: the input's row count, when known (see concurrent_blocks)."""
    groups = {group: settings(cfg, group) for group in ACTOR_GROUPS}
    data = groups["data"]
    if data.audio_root is not None and is_local(data.audio_root):
        groups["data"] = replace(data, audio_root=local_path(data.audio_root))
    cluster = settings(cfg, "cluster")
    engine = groups["engine"]
    blocks = concurrent_blocks(engine, cluster.rows_per_block, rows, cluster.num_actors)
    groups["engine"] = replace(engine, max_concurrent_blocks=blocks)
    run_context = RunContext(
        run_id=run_id,
        input_dir=input_dir,
        keep_codes=bool(cfg.output.keep_codes),
        threads=cluster.threads_per_actor or max(1, math.floor(cluster.cpus_per_actor)),
    )
    crash = CrashSettings(
        attempts_dir=attempts,
        quarantine_after=cluster.crash_quarantine_after,
        block_timeout_s=cluster.block_timeout_s,
        crash_on_batch=cluster.crash_on_batch,
        crash_marker=cluster.crash_marker,
        crash_on_id=cluster.crash_on_id,
    )
    return {"settings": ActorSettings(**groups, run=run_context, crash=crash)}


def build_plan(plain: dict, scan: InputScan, todo: list, arguments: dict, layout: OutputLayout, run_id: str, gate):
    from .todo_read import read_dataset

    rows_per_block = plain["cluster"]["rows_per_block"]
    chunk = readahead.chunk_rows(arguments["settings"].engine.max_concurrent_blocks, rows_per_block)
    ds = read_dataset(scan, todo, rows_per_block, chunk, gate)
    with warnings.catch_warnings():
        # Ray 2.60 has no named parameter for max_restarts / max_task_retries yet (its
        # "use the named remote parameters" warning has nothing to point to); pinned <2.61
        warnings.filterwarnings("ignore", message="`ray_remote_args` is deprecated")
        ds = _synth_stage(ds, plain, arguments, scan.total_rows)
    return ds.map_batches(
        write_block,
        fn_kwargs={"location": layout.location, "run_id": run_id},
        batch_format="pyarrow",
        batch_size=None,
        num_cpus=0.25,
    )


def _synth_stage(ds, plain: dict, arguments: dict, rows: int):
    from ray.data import ActorPoolStrategy

    from actors.synth import SynthStage

    cluster = plain["cluster"]
    blocks = arguments["settings"].engine.max_concurrent_blocks  # resolved by actor_arguments
    return ds.map_batches(
        SynthStage,
        fn_constructor_kwargs=arguments,
        # an async callable class: up to `blocks` calls run in one actor at once (Ray Data sets
        # the actor's max_concurrency to max_concurrent_calls_per_actor), and no more are sent
        # to it than that, so a waiting block never sits in one actor's queue while another idles
        compute=ActorPoolStrategy(
            size=cluster["num_actors"], max_concurrent_calls_per_actor=blocks, max_tasks_in_flight_per_actor=blocks
        ),
        # bounded: a row that kills its actor must end as an error row, not loop forever
        max_restarts=actor_restarts(cluster, rows),
        max_task_retries=cluster["max_task_retries"],
        num_cpus=cluster["cpus_per_actor"],
        num_gpus=cluster["gpus_per_actor"],
        batch_size=cluster["rows_per_block"],
        batch_format="pyarrow",
    )


def start_read_ahead(cluster: dict, arguments: dict):
    """The run's ReadAhead actor (pipeline/readahead.py), its window from the actors' blocks."""
    blocks = arguments["settings"].engine.max_concurrent_blocks  # resolved by actor_arguments
    window = readahead.window_rows(cluster["num_actors"], blocks, cluster["rows_per_block"], cluster["read_ahead_rows"])
    log.debug("read-ahead window: %d rows", window)
    return readahead.start(window)


def data_context():
    """Ray Data's settings for every plan of a run (planning and synthesis)."""
    import ray

    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False  # ours counts rows, audio and errors instead
    context.use_datasource_v2 = False  # read_parquet's V2 listing task wants a whole CPU: hangs beside actors
    return context


def synthesize(
    plain: dict, scan: InputScan, todo: list, arguments: dict, layout: OutputLayout, pending: int, run_id: str
) -> dict:
    """Stream the rows still to do through the actors (constructed with `arguments`:
    actor_arguments) into part files, showing progress. Returns what only the stream sees:
    total part-file write time and when the first finished block reached the driver (seconds
    after the plan started)."""
    import ray

    stream = {"write_s": 0.0, "first_block_s": None}
    started_ray = connect(plain["cluster"])
    try:
        _check_resources(plain["cluster"])
        data_context()
        gate = start_read_ahead(plain["cluster"], arguments)
        plan = build_plan(plain, scan, todo, arguments, layout, run_id, gate)
        output = plain["output"]
        progress = Progress(
            scan.total_rows, scan.total_rows - pending, output["progress_interval_s"], output["progress_bar"]
        )
        compaction = RunningCompaction(layout.location, run_id, output["shard_bytes"], output["shard_rows"])
        began = time.monotonic()
        try:
            for seen, stats in enumerate(plan.iter_rows(), 1):  # O(1) per block: sums, one part handed on
                gate.release.remote(stats["rows"])
                if stream["first_block_s"] is None:
                    stream["first_block_s"] = time.monotonic() - began
                if seen % TRIM_EVERY_BLOCKS == 0:
                    trim_block_stats(plan)
                stream["write_s"] += (stats["write_ms"] or 0.0) / 1000.0
                progress.update(
                    stats["rows"], stats["errors"], stats["audio_seconds"], stats["slot_rows"], stats["slot_steps"]
                )
                compaction.add(stats)
        finally:
            progress.close()
            stream.update(compaction.finish())
    finally:
        if started_ray:
            ray.shutdown()
    return stream


def run(cfg: DictConfig) -> RunReport:
    """One run: everything that can be checked is checked before Ray starts; rows already in
    the output are skipped; summary.json is rewritten at the end."""
    plain = to_plain(cfg)
    _check_settings(cfg, plain)
    started = time.monotonic()
    started_unix = time.time()
    run_id = datetime.datetime.now().strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]
    scan = scan_input(plain["data"]["path"], plain["data"]["columns"])
    output = plain["output"]
    if output_inside_input(scan, output["dir"]):
        raise ConfigError(
            f"output.dir={output['dir']!r} is inside the input directory {scan.base_dir}: its part files "
            f"would be read back as input on the next run; choose an output.dir outside it"
        )
    layout = OutputLayout(output["dir"])
    layout.check_ours()  # before the lease file goes in: a foreign directory is left untouched
    distributed = use_distributed(scan, plain["cluster"]["distributed_plan_rows"])
    started_ray = connect(plain["cluster"]) if distributed else False  # planning runs on Ray too
    try:
        if distributed:
            data_context()
        lease = Lease(layout, run_id, heartbeat_s=output["lease_heartbeat_s"], stale_s=output["lease_stale_s"])
        lease.acquire()
        try:
            return _run_leased(cfg, plain, scan, layout, lease, run_id, started, started_unix)
        finally:
            lease.release()
    finally:
        if started_ray:
            import ray

            ray.shutdown()


def plan_dir(output_location: str, run_id: str) -> str:
    """Where a distributed plan's per-fragment row lists go (beside the output when local)."""
    if is_local(output_location):
        return os.path.join(local_path(output_location), PLAN_DIR, run_id)
    return os.path.join(os.path.expanduser("~"), ".cache", "chorus", PLAN_DIR, run_id)


PLAN_DIR = "_plan"


def _run_leased(cfg, plain, scan, layout, lease, run_id, started, started_unix) -> RunReport:
    distributed = use_distributed(scan, plain["cluster"]["distributed_plan_rows"])
    layout.claim(
        _identity(plain, scan, input_ids_digest(scan, distributed)),
        overwrite=plain["output"]["overwrite"],
        run_id=run_id,
    )
    if layout.local:  # crash counts of earlier runs' blocks mean nothing to this run's blocks
        shutil.rmtree(os.path.join(layout.base, ATTEMPTS_DIR), ignore_errors=True)
        shutil.rmtree(os.path.join(layout.base, PLAN_DIR), ignore_errors=True)
    layout.write_text(CONFIG_FILE, OmegaConf.to_yaml(cfg, resolve=True))
    output = plain["output"]
    digest = settings_digest(plain, model_fingerprint(plain["model"]))
    arguments = actor_arguments(cfg, scan.root, run_id, attempts_dir(layout.location, run_id), rows=scan.total_rows)
    job = plan_job(plain, scan, layout, digest, arguments["settings"].data.audio_root)
    summary = job.summary
    rejected = rejected_rows(job.decided, run_id)
    if rejected.num_rows:
        layout.write_part(rejected, REJECTED_PART, owner=run_id)
        log.warning(
            "%d input rows rejected before synthesis (bad or duplicate ids, ref_id conflicts); they are error rows",
            rejected.num_rows,
        )
    elif layout.fs.get_file_info(f"{layout.data_dir}/{REJECTED_PART}").type == pafs.FileType.File:
        layout.fs.delete_file(f"{layout.data_dir}/{REJECTED_PART}")  # an earlier run's: none is refused now
    pending = summary.to_synthesize
    log.info(
        "input %s: %d rows in %d file(s); %d to synthesize, %d already in %s",
        scan.source,
        scan.total_rows,
        len(scan.files),
        pending,
        scan.total_rows - pending,
        layout.location,
    )
    if summary.count(P.CHANGED):
        log.warning(
            "%d rows changed since they were written (text, reference, settings or model) and are redone: %s "
            "(every id in %s)",
            summary.count(P.CHANGED),
            ", ".join(map(repr, summary.changed_examples))
            + (" ..." if summary.count(P.CHANGED) > len(summary.changed_examples) else ""),
            write_changed(job.decided, layout, run_id),
        )
    if summary.count(P.RETRY):
        log.info(
            "%d error or rejected rows are retried (%s)",
            summary.count(P.RETRY),
            "output.retry_errors / retry_rejected"
            if output["retry_errors"] or output["retry_rejected"]
            else "their errors were transient",
        )
    stream = {}
    if pending:
        todo = todo_fragments(job.decided, plan_dir(layout.location, run_id))
        stream = synthesize(plain, scan, todo, arguments, layout, pending, run_id)
    shutil.rmtree(plan_dir(layout.location, run_id), ignore_errors=True)
    shutil.rmtree(attempts_dir(layout.location, run_id), ignore_errors=True)
    if lease.lost:
        raise OutputInUse(f"{lease.lost}: this run's rows may be incomplete; rerun to resume")
    superseded = supersede.drop_superseded(layout, summary, rejected_id_array(rejected), distributed)
    if superseded:
        log.info("removed %d older copies of rows this run redid", superseded)
    packed = shards.compact_all(layout, run_id, output["shard_bytes"], output["shard_rows"])
    if packed:
        log.info("packed the last %d parts into %d shard(s)", sum(p["parts"] for p in packed), len(packed))

    wall = time.monotonic() - started
    summary = summary_of(
        layout,
        run_id,
        wall,
        {
            "output": layout.location,
            "data": f"{layout.location}/data",
            "input": scan.source,
            "input_rows": scan.total_rows,
            "model": plain["model"]["name"],
            "finished_at": datetime.datetime.now().isoformat(timespec="seconds"),
            "started_at_unix": started_unix,
            **stream,
        },
        distributed,
    )
    layout.write_text(SUMMARY_FILE, json.dumps(summary, indent=2) + "\n")
    report_began = time.monotonic()
    if is_local(layout.location):  # the page reads the local files; for a URI output: report later
        from .report import write_report

        try:
            write_report(local_path(layout.location), title=f"chorus run {run_id}")
        except Exception:  # the data is written; a broken page must not fail the run
            log.exception("could not write report.html")
    report_s = time.monotonic() - report_began
    log.info(
        "done: %d rows (%d ok, %d error), %.3f h audio, %.1f s (+ %.1f s report); output in %s",
        summary["rows_total"],
        summary["rows_ok"],
        summary["rows_error"],
        summary["audio_hours"],
        wall,
        report_s,
        layout.location,
    )
    return RunReport(output=layout.location, summary=summary, report_s=report_s)
