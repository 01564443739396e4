"""One driver at a time on an output directory: the lease.

A run holds a lease on the directory (`_chorus.lock`: owner, host, pid, run, heartbeat;
locally also an exclusive `flock` for the run's life); a second driver refuses to start, and
a lease whose driver is dead (its lock free, its pid gone on this host, or no heartbeat for
`lease_stale_s`) is taken over. pipeline/output/layout.py's directory is what it guards.
"""

from __future__ import annotations

import fcntl
import getpass
import json
import logging
import os
import socket
import threading
import time
from typing import Optional

from ..errors import OutputInUse
from ..names import LEASE_FILE
from .layout import OutputLayout

log = logging.getLogger("chorus")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: it exists
        return True
    return True


class Lease:
    """An exclusive lease on an output directory for one driver (see the module doc).

    Local directories: the driver holds an exclusive `flock` on the lock file for its whole run.
    The kernel drops the lock when the process dies, so a dead driver's lock is free at once,
    and every judgement of the record inside (whose it is, whether it is stale) and its
    replacement happen with the lock held: two drivers taking over the same stale lease cannot
    both win. The record still counts where the lock cannot see: a live heartbeat from another
    host (a shared filesystem whose locks are not shared) is respected. Object stores have no
    lock or exclusive create here: the lease is written, read back after a pause, and kept only
    if it is still ours (a second driver started in the same second could still slip in)."""

    RECORD_BYTES = 1024  # records are rewritten in place, padded to one size: never seen torn

    def __init__(self, layout: OutputLayout, run_id: str, heartbeat_s: float = 5.0, stale_s: float = 60.0):
        self.layout, self.run_id = layout, run_id
        self.heartbeat_s, self.stale_s = float(heartbeat_s), float(stale_s)
        self.path = layout.path(LEASE_FILE)
        self.lost: Optional[str] = None  # why the lease was lost mid-run, if it was
        self.took_over: Optional[dict] = None  # the stale lease this one replaced
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._fd: Optional[int] = None  # the locked lock file (local directories)

    def record(self) -> dict:
        try:
            owner = getpass.getuser()
        except Exception:  # no user name in some containers
            owner = str(os.getuid()) if hasattr(os, "getuid") else "unknown"
        return {
            "owner": owner,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "run": self.run_id,
            "heartbeat": time.time(),
        }

    def held_by(self) -> Optional[dict]:
        """The lease's current record; {} for a lock file that cannot be parsed (torn or empty)."""
        text = self.layout.read_text(LEASE_FILE)
        return None if text is None else _parse_record(text)

    def stale_reason(self, record: dict) -> Optional[str]:
        """Why a lease record is dead (None while its driver lives)."""
        heartbeat = record.get("heartbeat")
        if not isinstance(heartbeat, (int, float)):
            info = self.layout.fs.get_file_info(self.path)
            mtime = info.mtime.timestamp() if info.mtime else 0.0
            if time.time() - mtime > self.stale_s:
                return "an unreadable lock file untouched for longer than output.lease_stale_s"
            return None
        if record.get("host") == socket.gethostname() and isinstance(record.get("pid"), int):
            if not _pid_alive(record["pid"]):
                return f"its driver (pid {record['pid']} on this host) is gone"
        age = time.time() - heartbeat
        if age > self.stale_s:
            return f"its last heartbeat was {age:.0f} s ago (output.lease_stale_s={self.stale_s:g})"
        return None

    def _in_use(self, held: dict) -> OutputInUse:
        return OutputInUse(
            f"{self.layout.location} is in use by another chorus driver (owner {held.get('owner')}, "
            f"host {held.get('host')}, pid {held.get('pid')}, run {held.get('run')}); wait for it to "
            f"finish or choose another output.dir. A lease whose driver died is taken over "
            f"automatically (at once on the same host, else after output.lease_stale_s)"
        )

    def acquire(self) -> None:
        self.layout.fs.create_dir(self.layout.base, recursive=True)
        if self.layout.local:
            self._acquire_locked()
        else:
            self._acquire_by_record()
        self._start_heartbeat()

    def _acquire_locked(self) -> None:
        for _ in range(10):
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise self._in_use(self.held_by() or {}) from None
            try:
                # the holder before us unlinks the file on release while holding the lock: the
                # inode we locked must still be the one at the path, else a newcomer's is
                if os.fstat(fd).st_ino != os.stat(self.path).st_ino:
                    os.close(fd)
                    continue
            except FileNotFoundError:
                os.close(fd)
                continue
            held = _parse_record(os.pread(fd, 1 << 16, 0).decode("utf-8", "replace"))
            if held:  # a record nobody locks: its driver died, or it lives on a host whose locks we cannot see
                reason = self.stale_reason(held) if held.get("run") != self.run_id else "it is this run's own"
                if reason is None:
                    os.close(fd)
                    raise self._in_use(held)
                log.warning("taking over the lease of %s: %s (%s)", self.layout.location, reason, held)
                self.took_over = held
            self._fd = fd
            self._write_locked()
            return
        raise OutputInUse(f"could not take the lease of {self.layout.location}: other drivers keep taking it")

    def _write_locked(self) -> None:
        data = json.dumps(self.record()).encode("utf-8").ljust(self.RECORD_BYTES)
        os.pwrite(self._fd, data, 0)
        os.ftruncate(self._fd, len(data))
        os.fsync(self._fd)

    def _acquire_by_record(self) -> None:
        for _ in range(3):
            if self._try_create():
                return
            held = self.held_by()
            if held is None:  # released meanwhile: try again
                continue
            reason = self.stale_reason(held)
            if reason is None:
                raise self._in_use(held)
            self.layout.fs.delete_file(self.path)
            log.warning("taking over the lease of %s: %s (%s)", self.layout.location, reason, held)
            self.took_over = held
        raise OutputInUse(f"could not take the lease of {self.layout.location}: other drivers keep taking it")

    def _try_create(self) -> bool:
        if self.held_by() is not None:
            return False
        data = (json.dumps(self.record()) + "\n").encode("utf-8")
        with self.layout.fs.open_output_stream(self.path) as f:
            f.write(data)
        time.sleep(1.0)  # let a concurrent writer's object land, then see whose survived
        held = self.held_by() or {}
        return held.get("run") == self.run_id

    def _start_heartbeat(self) -> None:
        self._thread = threading.Thread(target=self._beat, name="chorus-lease-heartbeat", daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            held = self.held_by()
            if not held or held.get("run") != self.run_id:
                self.lost = f"the lease of {self.layout.location} was taken by {held}"
                log.error("%s; this driver's further writes may be superseded", self.lost)
                return
            try:
                if self._fd is not None:
                    self._write_locked()
                else:
                    self.layout.write_text(LEASE_FILE, json.dumps(self.record()) + "\n")
            except OSError as e:  # a transient write failure: the next beat tries again
                log.warning("lease heartbeat failed: %r", e)

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.heartbeat_s + 5)
        if self._fd is not None:
            # unlinked while still locked: a driver that opened the old file finds its inode
            # gone from the path and starts over (see _acquire_locked)
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass
            os.close(self._fd)
            self._fd = None
            return
        held = self.held_by()
        if held and held.get("run") == self.run_id:
            self.layout.fs.delete_file(self.path)


def _parse_record(text: str) -> dict:
    try:
        record = json.loads(text) if text.strip() else {}
    except ValueError:
        return {}
    return record if isinstance(record, dict) else {}
