"""Compaction while the job runs: the driver hands each finished block's stats to
`RunningCompaction` (O(1) per block); each time this run's parts fill a shard, a Ray task
packs them (pipeline/output/shards.py `compact`: O(shard) work, none of it on the driver). The
parts left when the stream ends are packed by the driver at the run's end (`compact_all`),
with any an earlier, killed run left behind."""

from __future__ import annotations

import logging

from ..cluster import TASK_CPUS
from . import shards

log = logging.getLogger("chorus")


class RunningCompaction:
    def __init__(self, location: str, run_id: str, shard_bytes: int, shard_rows: int):
        import ray

        self.location, self.run_id = location, run_id
        self.packer = shards.Packer(shard_bytes, shard_rows)
        # no retries: a failed compaction leaves its parts, which the end of the run packs
        self._task = ray.remote(num_cpus=TASK_CPUS, max_retries=0)(shards.compact)
        self.in_flight: list = []
        self.shards = 0  # committed by this run's tasks
        self.failed = 0
        self.store_retries = 0  # the object-store calls its tasks retried

    def add(self, stats: dict) -> None:
        """One finished block (write_block's stats row)."""
        group = self.packer.add(stats["part"], stats["bytes"] or 0, stats["rows"])
        if group:
            self.in_flight.append(self._task.remote(self.location, group, self.run_id))
        self.poll()

    def poll(self, wait: bool = False) -> None:
        import ray

        if not self.in_flight:
            return
        ready, self.in_flight = ray.wait(
            self.in_flight, num_returns=len(self.in_flight), timeout=None if wait else 0, fetch_local=False
        )
        for ref in ready:
            try:
                result = ray.get(ref)
            except Exception as e:  # its parts stay and are packed at the end
                self.failed += 1
                log.warning("a shard compaction failed (its blocks stay as parts until the run's end): %r", e)
                continue
            self.shards += 1
            self.store_retries += result.get("store_retries", 0)
            log.debug("packed %d parts (%d rows) into %s", result["parts"], result["rows"], result["shard"])

    def finish(self, wait: bool = True) -> dict:
        """Wait for the compactions in flight (or only collect those done); what the run's
        figures say about them."""
        self.poll(wait=wait)
        return {"shards_while_running": self.shards, "shard_failures": self.failed, "store_retries": self.store_retries}
