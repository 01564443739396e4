"""Bounded read-ahead: the job's read never runs more than a window of rows ahead of the rows
the driver has seen written.

Ray Data holds back a producer by object-store bytes, and a block of 16 rows of text is a few
KB: left alone, the read of a large input runs to its end long before the actors do, and the
driver's executor keeps a RefBundle, its metadata and stats for every block queued (measured
on the demo, 1M input rows: about 7 KB per queued block, 15 MB more every minute, for as long
as the read runs: O(rows) on the driver). So the read is cut into chunks of READ_CHUNK_ROWS rows
(or one actor's blocks, if more), and each read task is admitted by a `ReadAhead` actor before it reads: at most
`window` rows admitted and not yet written (at the defaults 3 x 4,096 rows: ~770 queued
blocks, ~5 MB on the driver, whatever the job's size). Each part an actor writes releases its
rows here (`written`), and waits here for the driver's next `drain`: the run's inbox.

A chunk whose read task Ray retries (its worker died) is admitted once: the last
RECENT_CHUNKS admitted chunk numbers are remembered, a bound the retry of a chunk read one at a
time always falls within.
"""

from __future__ import annotations

import asyncio

from actors.lru import LRU

RECENT_CHUNKS = 4096
# rows per read task, at least: every read task is an entry in the driver's plan (~1-2 KB with
# its metadata), so a 100M-row job has ~25k of them, not millions
READ_CHUNK_ROWS = 4096
# the window in chunks, at least: one being read, one queued, one in the actors
MIN_WINDOW_CHUNKS = 3


def window_rows(actors: int, blocks_per_actor: int, rows_per_block: int, configured: int | None = None) -> int:
    """Rows admitted at most: `configured` (cluster.read_ahead_rows), or enough to keep every
    actor's blocks full with as many again queued and finishing (three times what the actors
    hold), never fewer than MIN_WINDOW_CHUNKS chunks."""
    chunk = chunk_rows(blocks_per_actor, rows_per_block)
    if configured is not None:
        return max(int(configured), chunk)
    return max(3 * actors * blocks_per_actor * rows_per_block, MIN_WINDOW_CHUNKS * chunk)


def chunk_rows(blocks_per_actor: int, rows_per_block: int) -> int:
    """Rows per read task: READ_CHUNK_ROWS, or one actor's blocks when that is more."""
    return max(READ_CHUNK_ROWS, max(1, blocks_per_actor) * rows_per_block)


class ReadAhead:
    """Async Ray actor (`start`, called by pipeline/run/synthesis.py): `admit` waits for room,
    `release` makes it."""

    def __init__(self, window: int):
        self.window = int(window)
        self.in_flight = 0
        self.admitted_rows = self.released_rows = 0
        self._recent: LRU[bool] = LRU(RECENT_CHUNKS)  # chunk numbers admitted last
        self._room = asyncio.Condition()
        self._written: list[dict] = []  # parts' stats, until the driver drains them

    async def admit(self, chunk: int, rows: int) -> None:
        """Return once `rows` more fit the window (a chunk larger than the window waits for an
        empty one); a chunk admitted before returns at once."""
        async with self._room:
            if self._recent.get(str(chunk)):
                return
            await self._room.wait_for(lambda: self.in_flight == 0 or self.in_flight + rows <= self.window)
            self.in_flight += rows
            self.admitted_rows += rows
            self._recent.put(str(chunk), True)

    async def release(self, rows: int) -> None:
        async with self._room:
            self.in_flight = max(0, self.in_flight - int(rows))
            self.released_rows += int(rows)
            self._room.notify_all()

    async def written(self, stats: dict) -> None:
        """A part an actor wrote (pipeline/output/parts.py PartSink): its rows leave the window
        at once, its stats wait for the driver's next `drain`."""
        self._written.append(stats)
        await self.release(stats["rows"])

    def drain(self) -> list[dict]:
        """The parts written since the last drain (the driver calls it every second)."""
        out, self._written = self._written, []
        return out

    def state(self) -> dict:
        return {
            "window": self.window,
            "in_flight": self.in_flight,
            "admitted_rows": self.admitted_rows,
            "released_rows": self.released_rows,
            "remembered_chunks": len(self._recent),
        }


def start(window: int):
    """The job's ReadAhead actor (no CPU: it only counts), on the driver's own node: a node
    lost mid-run must not take the window with it (the driver's node lost ends the run anyway)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
    return ray.remote(num_cpus=0, max_restarts=0, scheduling_strategy=here)(ReadAhead).remote(window)
