"""One driver at a time on an output directory: the lease.

A run holds a lease on the directory (`_chorus.lock`: owner, host, pid, run, heartbeat); a
second driver refuses to start, and a lease whose driver is dead (its lock free, its pid gone
on this host, or no heartbeat for `lease_stale_s`) is taken over. How the lease is held
depends on the store (`Lease`: a local lock, S3 conditional writes, or write-and-read-back). pipeline/output/layout.py's directory is what it guards.
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
from .conditional import ConditionalObject
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
    """An exclusive lease on an output directory for one driver (see the module doc), held by
    the strongest means the directory's store offers:

    - a local directory: an exclusive `flock` on the lock file for the driver's whole run
      (`_LockedFile`). The kernel drops the lock when the process dies, so a dead driver's lock
      is free at once, and every judgement of the record inside (whose it is, whether it is
      stale) and its replacement happen with the lock held. The record still counts where the
      lock cannot see: a live heartbeat from another host (a shared filesystem whose locks are
      not shared) is respected.
    - an S3 store that honours conditional writes: the record is created only if absent, each
      heartbeat and a takeover replace only the exact version seen, release deletes only ours
      (`_ExactObject`). Two drivers can never both hold it.
    - any other store: the record is written, read back after a pause, and kept only if it is
      still ours (`_ReadBack`; a second driver started within that second could slip in: the
      log says when this weaker lease is used)."""

    def __init__(self, layout: OutputLayout, run_id: str, heartbeat_s: float = 5.0, stale_s: float = 60.0):
        self.layout, self.run_id = layout, run_id
        self.heartbeat_s, self.stale_s = float(heartbeat_s), float(stale_s)
        self.path = layout.path(LEASE_FILE)
        self.lost: Optional[str] = None  # why the lease was lost mid-run, if it was
        self.took_over: Optional[dict] = None  # the stale lease this one replaced
        self.kind: Optional[str] = None  # which holder holds it: locked-file, exact-object, read-back
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._holder = None

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

    def encoded(self) -> bytes:
        return (json.dumps(self.record()) + "\n").encode("utf-8")

    def held_by(self) -> Optional[dict]:
        """The lease's current record; {} for a lock file that cannot be parsed (torn or empty)."""
        text = self.layout.read_text(LEASE_FILE)
        return None if text is None else parse_record(text)

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

    def take_over_or_refuse(self, held: dict) -> None:
        """A live holder's lease: refuse (OutputInUse). A dead one's: log, note, go on."""
        reason = self.stale_reason(held) if held.get("run") != self.run_id else "it is this run's own"
        if reason is None:
            raise self.in_use(held)
        log.warning("taking over the lease of %s: %s (%s)", self.layout.location, reason, held)
        self.took_over = held

    def in_use(self, held: dict) -> OutputInUse:
        return OutputInUse(
            f"{self.layout.location} is in use by another chorus driver (owner {held.get('owner')}, "
            f"host {held.get('host')}, pid {held.get('pid')}, run {held.get('run')}); wait for it to "
            f"finish or choose another output.dir. A lease whose driver died is taken over "
            f"automatically (at once on the same host, else after output.lease_stale_s)"
        )

    def contended(self) -> OutputInUse:
        return OutputInUse(f"could not take the lease of {self.layout.location}: other drivers keep taking it")

    def acquire(self) -> None:
        self.layout.fs.create_dir(self.layout.base, recursive=True)
        self._holder = self._choose_holder()
        self._holder.take()
        self._start_heartbeat()

    def _choose_holder(self):
        if self.layout.local:
            self.kind = "locked-file"
            return _LockedFile(self)
        exact = ConditionalObject.for_path(self.layout.fs, self.path)
        if exact is not None and exact.probe():
            self.kind = "exact-object"
            return _ExactObject(self, exact)
        self.kind = "read-back"
        log.warning(
            "%s: this store offers no conditional create chorus can use, so the lease is written and read "
            "back (two drivers started within the same second could both run); S3 with conditional writes "
            "(and boto3 installed) makes it exact",
            self.layout.location,
        )
        return _ReadBack(self)

    def _start_heartbeat(self) -> None:
        if self._holder is None:  # a lease never taken (tests): its beats only watch the record
            self._holder = self._choose_holder()
        self._thread = threading.Thread(target=self._beat, name="chorus-lease-heartbeat", daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            try:
                lost = self._holder.beat()
            except OSError as e:  # a transient write failure: the next beat tries again
                log.warning("lease heartbeat failed: %r", e)
                continue
            if lost:
                self.lost = f"the lease of {self.layout.location} was taken by {lost}"
                log.error("%s; this driver's further writes may be superseded", self.lost)
                return

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.heartbeat_s + 5)
        if self._holder is not None:
            self._holder.give_back()
            self._holder = None


class _LockedFile:
    """A local directory's lease: the lock file flock'ed for the run (see Lease)."""

    RECORD_BYTES = 1024  # records are rewritten in place, padded to one size: never seen torn

    def __init__(self, lease: Lease):
        self.lease = lease
        self.fd: Optional[int] = None

    def take(self) -> None:
        path = self.lease.path
        for _ in range(10):
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise self.lease.in_use(self.lease.held_by() or {}) from None
            try:
                # the holder before us unlinks the file on release while holding the lock: the
                # inode we locked must still be the one at the path, else a newcomer's is
                if os.fstat(fd).st_ino != os.stat(path).st_ino:
                    os.close(fd)
                    continue
            except FileNotFoundError:
                os.close(fd)
                continue
            held = parse_record(os.pread(fd, 1 << 16, 0).decode("utf-8", "replace"))
            if held:  # a record nobody locks: its driver died, or it lives on a host whose locks we cannot see
                try:
                    self.lease.take_over_or_refuse(held)
                except OutputInUse:
                    os.close(fd)
                    raise
            self.fd = fd
            self._write()
            return
        raise self.lease.contended()

    def _write(self) -> None:
        data = json.dumps(self.lease.record()).encode("utf-8").ljust(self.RECORD_BYTES)
        os.pwrite(self.fd, data, 0)
        os.ftruncate(self.fd, len(data))
        os.fsync(self.fd)

    def beat(self) -> Optional[dict]:
        held = self.lease.held_by()
        if not held or held.get("run") != self.lease.run_id:
            return held
        self._write()
        return None

    def give_back(self) -> None:
        if self.fd is None:  # never taken
            return
        # unlinked while still locked: a driver that opened the old file finds its inode gone
        # from the path and starts over (see take)
        try:
            os.unlink(self.lease.path)
        except FileNotFoundError:
            pass
        os.close(self.fd)
        self.fd = None


class _ExactObject:
    """An S3 store's lease by conditional writes (see Lease): create if absent, replace and
    delete only the version seen."""

    def __init__(self, lease: Lease, obj: ConditionalObject):
        self.lease, self.obj = lease, obj
        self.etag: Optional[str] = None

    def take(self) -> None:
        for _ in range(10):
            self.etag = self.obj.create(self.lease.encoded())
            if self.etag is not None:
                return
            seen = self.obj.read()
            if seen is None:  # released meanwhile
                continue
            body, etag = seen
            self.lease.take_over_or_refuse(parse_record(body.decode("utf-8", "replace")))
            self.etag = self.obj.replace(self.lease.encoded(), etag)
            if self.etag is not None:
                return
            self.lease.took_over = None  # another driver replaced it first: judge its record anew
        raise self.lease.contended()

    def beat(self) -> Optional[dict]:
        etag = self.obj.replace(self.lease.encoded(), self.etag)
        if etag is None:
            return self.lease.held_by() or {}
        self.etag = etag
        return None

    def give_back(self) -> None:
        self.obj.delete(self.etag)


class _ReadBack:
    """A store without conditional writes: write the record, wait, read it back (see Lease)."""

    SETTLE_S = 1.0  # let a concurrent writer's object land, then see whose survived

    def __init__(self, lease: Lease):
        self.lease = lease

    def take(self) -> None:
        lease = self.lease
        for _ in range(3):
            held = lease.held_by()
            if held is None:
                lease.layout.write_text(LEASE_FILE, lease.encoded().decode("utf-8"))
                time.sleep(self.SETTLE_S)
                if (lease.held_by() or {}).get("run") == lease.run_id:
                    return
                continue
            lease.take_over_or_refuse(held)
            lease.layout.fs.delete_file(lease.path)
        raise lease.contended()

    def beat(self) -> Optional[dict]:
        held = self.lease.held_by()
        if not held or held.get("run") != self.lease.run_id:
            return held
        self.lease.layout.write_text(LEASE_FILE, self.lease.encoded().decode("utf-8"))
        return None

    def give_back(self) -> None:
        held = self.lease.held_by()
        if held and held.get("run") == self.lease.run_id:
            self.lease.layout.fs.delete_file(self.lease.path)


def parse_record(text: str) -> dict:
    try:
        record = json.loads(text) if text.strip() else {}
    except ValueError:
        return {}
    return record if isinstance(record, dict) else {}
