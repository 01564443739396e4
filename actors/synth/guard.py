"""The actor's crash guard: what keeps one row that kills its process (a segfault, out of
memory, a hang) from killing the job. An attempts ledger outlives the process and counts the
deaths each block caused; a block that killed actors `cluster.crash_quarantine_after` times runs row by row,
alone in the actor, until the row that does it is quarantined as an error row. A watchdog
turns a block stuck past block_timeout_s into such a death. The fault-injection hooks the
reliability tests use (crash_on_batch, crash_on_id) live here too."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import threading
from collections.abc import Callable

import pyarrow as pa

from actors import schema as S
from actors.files import write_atomically
from actors.synth.run_events import RunEventsClient, actor_id
from actors.synth.settings import ActorSettings

log = logging.getLogger(f"chorus.{__name__}")  # one namespace: configuring "chorus" reaches every module


class AttemptLedger:
    """Which blocks and rows were being processed when an actor process died, kept in files
    that outlive the process (the run's attempts directory): a counter is raised when work
    starts and removed when it ends, so a counter still there at the next start counts the
    deaths it caused. Local to one machine or a shared filesystem."""

    def __init__(self, directory: str):
        self.directory = directory
        os.makedirs(directory, exist_ok=True)

    def count(self, key: str) -> int:
        """How many actors died while `key` was running."""
        try:
            with open(os.path.join(self.directory, key), encoding="ascii") as f:
                return int(f.read().strip() or 0)
        except (OSError, ValueError):
            return 0

    def begin(self, key: str) -> int:
        before = self.count(key)
        write_atomically(os.path.join(self.directory, key), str(before + 1))
        return before

    def end(self, key: str) -> None:
        try:
            os.unlink(os.path.join(self.directory, key))
        except FileNotFoundError:
            pass


def ids_key(ids: list[str]) -> str:
    digest = hashlib.blake2b(digest_size=12)
    for row_id in ids:
        digest.update(row_id.encode("utf-8", "surrogatepass") + b"\x00")
    return digest.hexdigest()


class SuspectLock:
    """Blocks share the actor; a suspect block (one that killed actors before) runs alone, so
    the ledger blames only its rows. Shared holders wait while an exclusive one waits."""

    def __init__(self):
        self._cond = threading.Condition()
        self._shared = 0
        self._exclusive = False
        self._waiting = 0

    @contextlib.contextmanager
    def shared(self):
        with self._cond:
            self._cond.wait_for(lambda: not self._exclusive and not self._waiting)
            self._shared += 1
        try:
            yield
        finally:
            with self._cond:
                self._shared -= 1
                self._cond.notify_all()

    @contextlib.contextmanager
    def exclusive(self):
        with self._cond:
            self._waiting += 1
            self._cond.wait_for(lambda: not self._exclusive and not self._shared)
            self._waiting -= 1
            self._exclusive = True
        try:
            yield
        finally:
            with self._cond:
                self._exclusive = False
                self._cond.notify_all()


Process = Callable[[pa.Table, int], pa.Table]  # a block's rows -> their output rows
Quarantined = Callable[[pa.Table, str], pa.Table]  # a one-row batch and why -> its error row


class CrashGuard:
    def __init__(self, settings: ActorSettings, actor: str, quarantined: Quarantined):
        # the run config's cluster group itself: crash_quarantine_after, block_timeout_s, the hooks
        self.cluster, self.actor, self._quarantined = settings.cluster, actor, quarantined
        attempts = settings.run.attempts_dir
        self.ledger = AttemptLedger(attempts) if attempts else None
        self._lock = SuspectLock()
        # the driver counts restarts and retried blocks from these (pipeline/run/cluster_events.py)
        self.events = RunEventsClient(settings.run.run_id)
        self.events.started(actor_id())

    def run(self, batch: pa.Table, number: int, process: Process) -> pa.Table:
        """`process(batch, number)` under the guard."""
        if self.ledger is None or batch.num_rows == 0:
            self._maybe_crash(number)
            with self._lock.shared():
                return self._watched(batch, number, process)
        ids = [i if isinstance(i, str) else "" for i in batch.column(S.ID).to_pylist()]
        block_key = "block-" + ids_key(ids)
        # a block is counted as running (begin) only once past the lock: one waiting for a
        # suspect block to finish alone is not blamed if that one kills the actor
        if self.ledger.count(block_key) < self.cluster.crash_quarantine_after:
            with self._lock.shared():
                self._begin(block_key)
                self._maybe_crash(number)  # after begin: the hook's death is counted as a real one's
                table = self._watched(batch, number, process)
        else:
            # this block killed the actor that often: run its rows alone -- no other block in
            # the actor meanwhile -- so the one that does it is found (it dies once more,
            # alone) and quarantined on the next try
            log.warning("block of %d rows killed the actor before; running its rows alone", len(ids))
            with self._lock.exclusive():
                self._begin(block_key)
                table = pa.concat_tables(
                    [self._row_alone(batch.slice(i, 1), ids[i], number, process) for i in range(len(ids))]
                )
        self.ledger.end(block_key)
        return table

    def _begin(self, block_key: str) -> None:
        if self.ledger.begin(block_key) >= 1:  # it was running on an actor that died
            self.events.retried()

    def _row_alone(self, row_batch: pa.Table, row_id: str, number: int, process: Process) -> pa.Table:
        row_key = "row-" + ids_key([row_id])
        if self.ledger.begin(row_key) >= 1:  # it was running alone when the actor died
            self.ledger.end(row_key)
            return self._quarantined(
                row_batch,
                f"quarantined: this row's block killed its actor (the process exited: a crash or "
                f"out of memory) {self.cluster.crash_quarantine_after} times, then the row did so alone",
            )
        table = self._watched(row_batch, number, process)
        self.ledger.end(row_key)
        return table

    def _watched(self, batch: pa.Table, number: int, process: Process) -> pa.Table:
        if self.cluster.crash_on_id is not None and self.cluster.crash_on_id in batch.column(S.ID).to_pylist():
            log.warning("crash_on_id=%r: actor %s exits now", self.cluster.crash_on_id, self.actor)
            os._exit(71)  # test hook: a row that kills its process (segfault, OOM)
        if not self.cluster.block_timeout_s:
            return process(batch, number)
        # the block's clock includes its wait for slots behind the other blocks in flight:
        # block_timeout_s must cover max_concurrent_blocks blocks' work
        watchdog = threading.Timer(float(self.cluster.block_timeout_s), self._watchdog_fires, args=(batch.num_rows,))
        watchdog.daemon = True
        watchdog.start()
        try:
            return process(batch, number)
        finally:
            watchdog.cancel()

    def _watchdog_fires(self, rows: int) -> None:
        """A block that runs past cluster.block_timeout_s is stuck (a hung device call, a loop
        that never ends): nothing in-process can stop it, so the actor exits. Ray starts a new
        one and retries the block, and the block's crash count (see run) makes a block that
        keeps hanging run row by row until the row that hangs is quarantined."""
        log.error(
            "watchdog: a block of %d rows ran past cluster.block_timeout_s=%g s; actor %s exits",
            rows,
            float(self.cluster.block_timeout_s),
            self.actor,
        )
        for handler in logging.getLogger().handlers:
            handler.flush()
        os._exit(72)

    def _maybe_crash(self, number: int) -> None:
        """Test hook for the fault-tolerance test: exit hard (no cleanup, as a killed process
        would) on the N-th batch; the marker file makes it happen once per run."""
        on_batch = int(self.cluster.crash_on_batch or 0)
        if not on_batch or number != on_batch:
            return
        if self.cluster.crash_marker:
            try:
                os.close(os.open(self.cluster.crash_marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:
                return
        log.warning("crash_on_batch=%d: actor %s exits now", on_batch, self.actor)
        os._exit(70)
