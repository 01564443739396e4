"""What the cluster did to a run, seen from the driver while it streams: nodes lost, actors
restarted, and the blocks they held, which Ray runs again.

A node lost mid-run (a spot node reclaimed, a raylet killed) takes its actors, its tasks and
the Ray objects in its store with it. Ray restarts the actors where the cluster has room
(`max_restarts`), retries the blocks they held on them (`max_task_retries`), and recomputes
the lost objects from their lineage (a block's write task runs again and rewrites the same
part, whole); the driver's read-ahead actor lives on the driver's own node.

`ClusterEvents.poll` runs every second on the driver: `ray.nodes()` (every NODES_EVERY_S) for
nodes that were alive and are not, and the counters of the run's RunEvents actor, which the
synthesis actors tell (actors/synth/run_events.py): each actor process once it is built (a
second start of the same Ray actor id is a restart), and each block it begins that was running
on an actor that died (the crash guard's attempts ledger says so: actors/synth/guard.py).
Public Ray APIs and chorus's own counters only; O(nodes) per poll.
"""

from __future__ import annotations

import logging
import time

from actors.synth.run_events import events_actor_name

log = logging.getLogger("chorus")

NODES_EVERY_S = 5.0
LAST_READ_S = 10.0  # the closing read of the counters waits at most this long


def _alive_nodes() -> dict[str, str]:
    import ray

    return {n["NodeID"]: n.get("NodeManagerAddress", "") for n in ray.nodes() if n.get("Alive")}


class RunEvents:
    """A run's counters of what its synthesis actors tell (a Ray actor, one per run, on the
    driver's node): restarted actor processes and blocks run again after their actor died.
    Keeps one entry per synthesis actor of the run (not per block)."""

    def __init__(self):
        self.actors_restarted = 0
        self.blocks_retried = 0
        self._started: set[str] = set()  # the actor ids that started once

    def started(self, actor: str) -> None:
        if actor in self._started:
            self.actors_restarted += 1
        self._started.add(actor)

    def retried(self) -> None:
        self.blocks_retried += 1

    def counts(self) -> tuple[int, int]:
        return self.actors_restarted, self.blocks_retried


def start_counters(run_id: str):
    """The run's RunEvents actor, named for the synthesis actors to find (no CPU: it only
    counts), on the driver's own node: a node lost mid-run must not take the counts with it."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
    options = dict(num_cpus=0, max_restarts=0, scheduling_strategy=here, name=events_actor_name(run_id))
    return ray.remote(**options)(RunEvents).remote()


class ClusterEvents:
    def __init__(self, run_id: str):
        self.nodes = _alive_nodes()
        self.nodes_lost: list[dict] = []
        self.actors_restarted = 0
        self.blocks_retried = 0
        self._next_nodes_check = time.monotonic() + NODES_EVERY_S
        self._counters = start_counters(run_id)
        self._asked = None  # the counts asked for and not read yet

    def poll(self) -> None:
        if time.monotonic() >= self._next_nodes_check:
            self._next_nodes_check = time.monotonic() + NODES_EVERY_S
            self._check_nodes()
        self._check_counters()

    def _check_nodes(self) -> None:
        alive = _alive_nodes()
        for node, address in self.nodes.items():
            if node not in alive:
                self.nodes_lost.append({"node": node, "address": address, "at": time.time()})
                log.warning(
                    "node %s (%s) was lost mid-run: Ray restarts its actors where the cluster has room, runs the "
                    "blocks they held again and recomputes the data it held",
                    node,
                    address,
                )
        self.nodes = alive

    def _check_counters(self) -> None:
        """Take the counts asked for last time if they are in (never waits), and ask again."""
        import ray

        if self._asked is not None:
            ready, _ = ray.wait([self._asked], timeout=0)
            if not ready:
                return
            self._take(*ray.get(ready[0]))
        self._asked = self._counters.counts.remote()

    def _take(self, restarted: int, retried: int) -> None:
        if restarted > self.actors_restarted:
            log.warning(
                "%d actor(s) died (a crash, out of memory, its node lost) and Ray restarted them",
                restarted - self.actors_restarted,
            )
        if retried > self.blocks_retried:
            log.warning("%d block(s) that were running on an actor that died ran again", retried - self.blocks_retried)
        self.actors_restarted = max(self.actors_restarted, restarted)
        self.blocks_retried = max(self.blocks_retried, retried)

    def close(self, read: bool = True) -> None:
        """Read the counters a last time (`read`: not for a stopped run) and end the counting actor."""
        import ray

        try:
            if read:
                self._take(*ray.get(self._counters.counts.remote(), timeout=LAST_READ_S))
            ray.kill(self._counters)
        except Exception as e:  # the figures so far stand
            log.debug("the run's last event counts could not be read: %r", e)

    def figures(self) -> dict:
        return {
            "nodes_lost": self.nodes_lost,
            "actors_restarted": self.actors_restarted,
            "blocks_retried": self.blocks_retried,
        }

    def text(self) -> str:
        """For the progress line: what happened so far, or "" when nothing did."""
        said = []
        if self.nodes_lost:
            said.append(f"{len(self.nodes_lost)} node(s) lost")
        if self.actors_restarted or self.blocks_retried:
            said.append(f"{self.actors_restarted} actor restart(s), {self.blocks_retried} block(s) retried")
        return ", ".join(said)
