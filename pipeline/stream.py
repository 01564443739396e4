"""The synthesis stream of a run: connect to Ray, build the Ray Data plan (the chosen rows'
read, admitted by the read-ahead window -> the actor pool -> the block writer) and consume its
per-block stats: progress, compaction, the read-ahead's release and Ray Data's stats trim, each
O(1) per block."""

from __future__ import annotations

import logging
import math
import os
import time
import warnings

from . import readahead
from .compaction import RunningCompaction
from .config import ConfigError
from .executor_stats import TRIM_EVERY_BLOCKS, trim_block_stats
from .inputs import InputScan
from .output import OutputLayout, write_block
from .progress import Progress

log = logging.getLogger("chorus")


def blocks_per_actor(rows: int, rows_per_block: int, actors: int) -> int:
    """Each actor's share of an input's blocks (rounded up)."""
    return math.ceil(math.ceil(rows / rows_per_block) / max(1, actors))


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


def check_resources(cluster: dict) -> None:
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


def build_plan(plain: dict, scan: InputScan, todo: list, arguments: dict, layout: OutputLayout, run_id: str, gate):
    from .todo_read import read_dataset

    rows_per_block = plain["cluster"]["rows_per_block"]
    chunk = readahead.chunk_rows(arguments["settings"].engine.max_concurrent_blocks, rows_per_block)
    ds = read_dataset(scan, todo, rows_per_block, chunk, gate, scope=run_id)
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
        check_resources(plain["cluster"])
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
