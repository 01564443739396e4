"""What the cluster did to a run, seen from the driver while it streams: nodes lost, actors
restarted, and the blocks they held, which Ray runs again.

A node lost mid-run (a spot node reclaimed, a raylet killed) takes its actors, its tasks and
the Ray objects in its store with it. Ray restarts the actors where the cluster has room
(`max_restarts`), retries the blocks they held on them (`max_task_retries`), and recomputes
the lost objects from their lineage (a block's write task runs again and rewrites the same
part, whole); the driver's read-ahead actor lives on the driver's own node. Until a lost
actor finds room its blocks wait: the progress line says so.

`ClusterEvents.poll` runs every second on the driver: `ray.nodes()` (every NODES_EVERY_S) for
nodes that were alive and are not, and Ray Data's actor pool for actors restarting and the
blocks in flight on them -- Ray Data attributes looked up softly, as executor_stats.py does:
on a Ray without them the actor figures stay 0. O(nodes + actors) per poll.
"""

from __future__ import annotations

import logging
import time

log = logging.getLogger("chorus")

NODES_EVERY_S = 5.0


def _alive_nodes() -> dict[str, str]:
    import ray

    return {n["NodeID"]: n.get("NodeManagerAddress", "") for n in ray.nodes() if n.get("Alive")}


def _pool_actors(dataset):
    """(actor handle, its pool state) of every actor pool in `dataset`'s running execution."""
    executor = getattr(dataset, "_current_executor", None)
    for operator in getattr(executor, "_topology", None) or {}:
        running = getattr(getattr(operator, "_actor_pool", None), "_running_actors", None)
        if isinstance(running, dict):
            yield from list(running.items())


class ClusterEvents:
    def __init__(self):
        self.nodes = _alive_nodes()
        self.nodes_lost: list[dict] = []
        self.actors_restarted = 0
        self.blocks_retried = 0
        self._restarting: set = set()
        self._next_nodes_check = time.monotonic() + NODES_EVERY_S

    def poll(self, dataset) -> None:
        if time.monotonic() >= self._next_nodes_check:
            self._next_nodes_check = time.monotonic() + NODES_EVERY_S
            self._check_nodes()
        self._check_actors(dataset)

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

    def _check_actors(self, dataset) -> None:
        for actor, state in _pool_actors(dataset):
            if not getattr(state, "is_restarting", False):
                self._restarting.discard(actor)
                continue
            if actor in self._restarting:
                continue
            self._restarting.add(actor)
            blocks = int(getattr(state, "num_tasks_in_flight", 0) or 0)
            self.actors_restarted += 1
            self.blocks_retried += blocks
            log.warning(
                "an actor died (its node lost, or its process) and is restarting; its %d block(s) in flight run "
                "again once it is back (it waits for room on the cluster)",
                blocks,
            )

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
        if self.actors_restarted:
            said.append(f"{self.actors_restarted} actor restart(s), {self.blocks_retried} block(s) retried")
        if self._restarting:
            said.append(f"{len(self._restarting)} actor(s) restarting")
        return ", ".join(said)
