"""The run's Ray: one connection per run, the resources driver-side work asks for, and the one
choice of where per-row driver work (planning, the run's end, the summary) runs -- in this
process for a small job, as Ray Data work for a large one. A leaf: imports nothing of the
driver; Ray itself is imported only when a connection is made.

The choice is made once, by `Cluster.for_rows`, and handed down to everything that branches on
it; the connection is made at most once, by whichever step first needs Ray, and closed at the
run's end if this run started it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Union

from actors.errors import ConfigError

if TYPE_CHECKING:
    from actors.synth.job_settings import ClusterSettings

    from .config import ExportCluster

log = logging.getLogger("chorus")

# every driver-side Ray task and read asks for this much CPU: a whole-CPU request never
# schedules beside actors that hold part of every node's CPU, and the run hangs (DESIGN §6)
TASK_CPUS = 0.25
# keys per hash-shuffle partition (~40 MB of Arrow): one task's share of a distributed pass
PARTITION_ROWS = 250_000

# Ray keeps at most ~num_cpus workers around and kills the rest once idle for 1 s. The actors
# hold workers for the whole run, so on a small node every write task found its worker killed
# and booted a fresh Python (~1 CPU-second each, every ~1.3 s: measured 23 worker boots in one
# 80 s run on 2 CPUs, CPU taken from the actors). Idle workers now live for a minute. For a
# `ray start` cluster set RAY_idle_worker_killing_time_threshold_ms=60000 on the nodes.
LOCAL_RAY_SYSTEM_CONFIG = {"idle_worker_killing_time_threshold_ms": 60_000}


@dataclass
class Cluster:
    """The run's Ray connection and its in-process / distributed choice.

    settings: the `cluster` config group (a run's ClusterSettings, or an export's
    ExportCluster: connect reads only what both have). distributed: planning, the run's end
    and the summary run as Ray Data work (a job of at least cluster.distributed_plan_rows rows)."""

    settings: Union[ClusterSettings, ExportCluster]
    distributed: bool
    started: bool = False  # this run started Ray, so it stops it
    connected: bool = False

    @classmethod
    def for_rows(cls, settings: ClusterSettings, rows: int) -> Cluster:
        return cls(settings, distributed=rows >= settings.distributed_plan_rows)

    def connect(self) -> None:
        """Join or start Ray (once per run) and set Ray Data's context for every dataset of
        the run. cluster.address null: RAY_ADDRESS (a Ray Job sets it) or else a new local Ray;
        "auto": Ray's discovery of a `ray start` cluster on this machine; else that address."""
        if self.connected:
            return
        import ray

        if not ray.is_initialized():
            address = self.settings.address or os.environ.get("RAY_ADDRESS") or "local"
            options = {}
            if address == "local":
                options = {
                    "num_cpus": self.settings.num_cpus,
                    "include_dashboard": False,
                    "_system_config": LOCAL_RAY_SYSTEM_CONFIG,
                }
            # Ray's INFO lines (its start, each dataset's plan) describe its machinery: a run says
            # what it does in its own log
            with _deaf_to_ctrl_c(started_here=address == "local"):
                ray.init(address=address, logging_level=logging.WARNING, **options)
            self.started = True
        import ray.data  # noqa: F401  (~0.7 s: once per driver, with the cluster, not inside a run's clock)

        logging.getLogger("ray.data").setLevel(logging.WARNING)

        data_context()
        self.connected = True

    def check_resources(self) -> None:
        """Refuse actors that would hold every CPU (reads and writes need some: the run would
        hang); on a GPU cluster only warn, since it may still be scaling up."""
        import ray

        cluster = self.settings
        cpus = ray.cluster_resources().get("CPU", 0.0)
        wanted = cluster.num_actors * cluster.cpus_per_actor
        if cpus and wanted >= cpus:
            message = (
                f"{cluster.num_actors} actors x {cluster.cpus_per_actor} CPU = {wanted:g} CPU of the "
                f"cluster's {cpus:g}: nothing is left for reading and writing, and the run would "
                f"hang; lower cluster.cpus_per_actor or cluster.num_actors"
            )
            if cluster.gpus_per_actor == 0:
                raise ConfigError(message)
            log.warning(message)

    def close(self) -> None:
        if self.started:
            import ray

            # a stream stopped early (Ctrl-C, a lost lease) leaves Ray Data's threads running into
            # the shutdown, and they log that Ray is gone: nothing a user can act on
            for name in ("ray", "ray.data"):
                logging.getLogger(name).setLevel(logging.CRITICAL)
            ray.shutdown()
        self.started = self.connected = False

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@contextlib.contextmanager
def _deaf_to_ctrl_c(started_here: bool):
    """Ray's processes started here ignore SIGINT: a terminal's Ctrl-C reaches the whole
    foreground process group, and a raylet or GCS killed by it under the driver crashes the
    driver mid-stream (a segfault). The driver alone takes the signal and stops the run in
    order; `close()` then shuts them down (pipeline/cli/interrupt.py). The disposition is
    inherited through exec, by Ray's workers and their children too."""
    if not started_here or threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def data_context():
    """Ray Data's settings for every dataset of a run (planning, synthesis, the run's end)."""
    import ray
    from ray.data.context import ShuffleStrategy

    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False  # ours counts rows, audio and errors instead
    # the planning's and the run end's shuffles by id are key-based repartitions, which need a
    # hash shuffle: Ray 2.60's default (SHUFFLE_V2) is one, Ray 2.49's (a sort shuffle) refuses them
    if context.shuffle_strategy in (ShuffleStrategy.SORT_SHUFFLE_PULL_BASED, ShuffleStrategy.SORT_SHUFFLE_PUSH_BASED):
        context.shuffle_strategy = ShuffleStrategy.HASH_SHUFFLE
    return context


def connect(settings: ClusterSettings) -> Cluster:
    """A connected Cluster for work outside a run (the benchmark's one Ray for every
    configuration); close() stops Ray only if this call started it."""
    cluster = Cluster(settings, distributed=True)
    cluster.connect()
    return cluster
