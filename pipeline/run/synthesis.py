"""The synthesis stream of a run: Ray Data datasets (the chosen rows' read, admitted by the
read-ahead window -> the actor pool, whose actors write their rows as parts as they finish),
one after another, each of at most cluster.blocks_per_dataset blocks (executor_stats.py: Ray
Data's bookkeeping stays bounded), and the driver's loop: every second the parts written since
(their stats, from the read-ahead actor that is the run's inbox) for progress and compaction,
each O(1) per part or block."""

from __future__ import annotations

import contextlib
import inspect
import logging
import math
import threading
import time
import warnings

from actors.storage import retries_spent
from actors.synth.job_settings import ClusterSettings

from ..errors import Interrupted
from ..output import space
from ..output.compaction import RunningCompaction
from ..output.parts import PartSink
from . import readahead
from .actor_settings import blocks_per_actor
from .chosen_rows import Chunk, chunks, read_chunks
from .cluster_events import ClusterEvents
from .context import Job
from .executor_stats import segments
from .progress import Progress
from .watch import watched

log = logging.getLogger("chorus")


# cluster.max_actor_restarts null: restarts each actor may use, for deaths that are no row's
# fault (a node lost, memory pressure) ...
BASE_ACTOR_RESTARTS = 10
# ... plus what one row that kills its actor costs (crash_quarantine_after + 1 deaths before
# it is quarantined) for every this many blocks an actor takes
BLOCKS_PER_TOLERATED_CRASH = 100


def actor_restarts(cluster: ClusterSettings, rows: int) -> int:
    """Restarts each actor is allowed: cluster.max_actor_restarts, or (null) a budget that grows
    with the input, so that a long job survives a few rows that crash their actor (each costs
    crash_quarantine_after + 1 deaths) while an actor that keeps dying for another reason still
    ends the job instead of restarting forever."""
    if cluster.max_actor_restarts is not None:
        return int(cluster.max_actor_restarts)
    share = blocks_per_actor(rows, cluster.rows_per_block, cluster.num_actors)
    tolerated = max(1, math.ceil(share / BLOCKS_PER_TOLERATED_CRASH))
    return BASE_ACTOR_RESTARTS + (cluster.crash_quarantine_after + 1) * tolerated


def read_work(job: Job, todo: list, arguments: dict) -> list[Chunk]:
    """The run's rows to synthesize as read chunks (chosen_rows.py), numbered for the run."""
    blocks = arguments["settings"].engine.max_concurrent_blocks  # resolved by actor_arguments
    return chunks(todo, readahead.chunk_rows(blocks, job.config.cluster.rows_per_block))


def build_dataset(job: Job, work: list[Chunk], arguments: dict, gate):
    """A Ray Data dataset of these chunks: read (admitted by `gate`) -> actors, which write their
    rows as parts as they finish (PartSink: their stats reach `gate`) and return a row per block."""
    cluster, scan, run_id = job.config.cluster, job.scan, job.run_id
    ds = read_chunks(scan, work, cluster.rows_per_block, gate, scope=run_id)
    arguments = {**arguments, "sink": PartSink(job.layout.location, run_id, gate)}
    with warnings.catch_warnings():
        # max_restarts / max_task_retries reach the actors only through **ray_remote_args: Ray
        # 2.60's map_batches names label_selector, fallback_strategy, max_calls, resources,
        # accelerator_type and runtime_env, not these, and its warning ("use the named remote
        # parameters") has nothing to point to; ActorPoolStrategy and DataContext have no such
        # setting either. Ray Data itself reads them from ray_remote_args (its actors default to
        # restarting forever). 2.49 does not warn; pyproject's <2.61 stays below the removal (2.64)
        warnings.filterwarnings("ignore", message="`ray_remote_args` is deprecated")
        return _synth_stage(ds, cluster, arguments, scan.total_rows)


def _synth_stage(ds, cluster: ClusterSettings, arguments: dict, rows: int):
    from actors.synth import SynthStage

    blocks = arguments["settings"].engine.max_concurrent_blocks  # resolved by actor_arguments
    return ds.map_batches(
        SynthStage,
        fn_constructor_kwargs=arguments,
        # an async callable class: up to `blocks` calls run in one actor at once (Ray Data sets
        # the actor's max_concurrency to max_concurrent_calls_per_actor), and no more are sent
        # to it than that, so a waiting block never sits in one actor's queue while another idles
        compute=_actor_pool(cluster.num_actors, blocks),
        # bounded restarts: a row that kills its actor must end as an error row, not loop forever;
        # a block's own retries (null: unbounded) then end with its actor's, and outlast the
        # tries Ray spends at an actor on a lost node before it notices (config.py)
        max_restarts=actor_restarts(cluster, rows),
        max_task_retries=-1 if cluster.max_task_retries is None else cluster.max_task_retries,
        num_cpus=cluster.cpus_per_actor,
        num_gpus=cluster.gpus_per_actor,
        batch_size=cluster.rows_per_block,
        batch_format="pyarrow",
        **_concurrency_options(blocks),
    )


def _actor_pool(actors: int, blocks: int):
    """Ray Data's actor pool of `actors` taking `blocks` calls at once each. Ray 2.60 sets the
    actor's concurrency from max_concurrent_calls_per_actor; before it (2.49), max_concurrency in
    the actor's options does (_concurrency_options)."""
    from ray.data import ActorPoolStrategy

    if "max_concurrent_calls_per_actor" in inspect.signature(ActorPoolStrategy).parameters:
        return ActorPoolStrategy(
            size=actors, max_concurrent_calls_per_actor=blocks, max_tasks_in_flight_per_actor=blocks
        )
    return ActorPoolStrategy(size=actors, max_tasks_in_flight_per_actor=blocks)


def _concurrency_options(blocks: int) -> dict:
    """The actor options that let one actor run `blocks` calls at once on a Ray before 2.60."""
    from ray.data import ActorPoolStrategy

    if "max_concurrent_calls_per_actor" in inspect.signature(ActorPoolStrategy).parameters:
        return {}
    return {"max_concurrency": blocks}


def start_read_ahead(cluster: ClusterSettings, arguments: dict):
    """The run's ReadAhead actor (pipeline/run/readahead.py), its window from the actors' blocks."""
    blocks = arguments["settings"].engine.max_concurrent_blocks  # resolved by actor_arguments
    window = readahead.window_rows(cluster.num_actors, blocks, cluster.rows_per_block, cluster.read_ahead_rows)
    log.debug("read-ahead window: %d rows", window)
    return readahead.start(window)


class _Driver:
    """The driver's side of the stream, O(1) per block: progress, compaction, the read-ahead's
    release, what the cluster did (cluster_events.py), and the figures only the stream sees."""

    def __init__(self, job: Job, pending: int, gate):
        output, total = job.output, job.scan.total_rows
        self.gate = gate
        self.events = ClusterEvents(job.run_id)
        self.store_retries = 0  # the write tasks' and compactions' (the driver's own: steps.py)
        self.driver_retries_from = retries_spent()
        self.progress = Progress(
            total, total - pending, output.progress_interval_s, output.progress_bar, status=self.status
        )
        self.compaction = RunningCompaction(job.layout.location, job.run_id, output.shard_bytes, output.shard_rows)
        self.stream = {"write_s": 0.0, "first_block_s": None, "last_block_at": None}
        self.began = time.monotonic()
        self.draining = threading.Lock()

    def status(self) -> str:
        said = self.events.text()
        retries = self.store_retries + retries_spent() - self.driver_retries_from
        return ", ".join(filter(None, [said, f"{retries} store retries" if retries else ""]))

    def drain(self) -> None:
        """The parts the actors wrote since the last drain (the gate holds their stats). The
        checks' thread drains every second and the main thread once a dataset's blocks are in;
        the lock keeps a check still running at that moment from taking parts alongside."""
        import ray

        with self.draining:
            for stats in ray.get(self.gate.drain.remote()):
                self.take(stats)

    def take(self, stats: dict) -> None:
        """One part written (pipeline/output/parts.py PartSink's stats; its rows already left
        the read-ahead window)."""
        stream = self.stream
        if stream["first_block_s"] is None:
            stream["first_block_s"] = time.monotonic() - self.began
        stream["write_s"] += (stats["write_ms"] or 0.0) / 1000.0
        stream["last_block_at"] = time.time()
        self.store_retries += stats["store_retries"] or 0
        self.progress.update(
            stats["rows"], stats["errors"], stats["audio_seconds"], stats["slot_rows"], stats["slot_steps"]
        )
        self.compaction.add(stats)

    def close(self, wait: bool) -> dict:
        """The stream's figures; a stopped run (wait=False) does not wait for its compactions."""
        self.progress.close()
        self.events.close(read=wait)
        compacted = self.compaction.finish(wait=wait)
        self.store_retries += compacted.pop("store_retries", 0)
        return {**self.stream, **compacted, "cluster": self.events.figures(), "store_retries": self.store_retries}


def synthesize(job: Job, todo: list, arguments: dict, pending: int, check=lambda: None) -> dict:
    """Stream the `pending` rows still to do (`todo`, per fragment) through the actors
    (constructed with `arguments`: pipeline/run/actor_settings.py) into part files, showing
    progress; `check()` runs every second and stops the stream by raising (the lease's).
    Returns what only the stream sees: total part-file write time, when the first finished
    block reached the driver (seconds after the stream started) and when the last one did
    (unix time: its part was written; the run's end, shards and summary, comes after), what
    the cluster did (`cluster`), the object-store retries of its tasks."""
    job.cluster.connect()
    job.cluster.check_resources()
    gate = start_read_ahead(job.config.cluster, arguments)
    cluster = job.config.cluster
    datasets = segments(read_work(job, todo, arguments), cluster.rows_per_block, cluster.blocks_per_dataset)
    driver = _Driver(job, pending, gate)

    def every_second() -> None:
        check()
        driver.events.poll()
        driver.drain()

    ended = False
    try:
        for work in datasets:  # one after another: each one's bookkeeping goes when it ends
            # closed here, whatever ends it: Ray Data's execution stops before Ray does (watch.py)
            with contextlib.closing(
                watched(build_dataset(job, work, arguments, gate).iter_rows(), every_second)
            ) as blocks:
                for _block in blocks:  # a row per block call; its rows came as parts (drain)
                    pass
        driver.drain()  # the last parts (in the gate before their blocks' calls returned)
        ended = True
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM (pipeline/cli/interrupt.py): the rows written so far
        raise Interrupted(driver.progress.rows) from None
    except Exception as e:
        full = space.full_disk(e)  # a task's or an actor's write beside a local output
        if full is None or not job.layout.local:
            raise
        raise space.output_full(job.layout, full, pending - driver.progress.rows) from e
    finally:
        stream = driver.close(wait=ended)
    return stream
