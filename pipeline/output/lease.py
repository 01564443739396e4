"""One driver at a time on an output directory: the lease.

A run holds a lease on the directory (`_chorus.lock`: owner, host, pid, run, heartbeat); a
second driver refuses to start, and a lease whose driver is dead (its lock free, its pid gone
on this host, or no heartbeat for `lease_stale_s`) is taken over. How the lease is held
depends on the store (`Lease`: a local lock, S3 conditional writes, or write-and-read-back;
pipeline/output/lease_holders.py). pipeline/output/layout.py's directory is what it guards.

A heartbeat that cannot fail silently: a renewal that fails is tried again (the store's calls
retried by chorus's policy, the beats themselves every heartbeat) until half of `lease_stale_s`
has passed since the last renewal; then, or when the record is found taken, the lease is lost
(`lost` says why) and the driver stops (`check` raises LeaseLost) -- with the other half of the
stale time left for it to stop before any other driver may judge the lease dead.
"""

from __future__ import annotations

import getpass
import json
import logging
import os
import socket
import threading
import time
from typing import Optional

from actors.storage import give_up_by

from ..errors import LeaseLost, OutputInUse
from ..names import LEASE_FILE
from .conditional import ConditionalObject
from .layout import OutputLayout
from .lease_holders import ExactObject, LockedFile, ReadBack, parse_record

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
      (`LockedFile`). The kernel drops the lock when the process dies, so a dead driver's lock
      is free at once, and every judgement of the record inside (whose it is, whether it is
      stale) and its replacement happen with the lock held. The record still counts where the
      lock cannot see: a live heartbeat from another host (a shared filesystem whose locks are
      not shared) is respected.
    - an S3 store that honours conditional writes: the record is created only if absent, each
      heartbeat and a takeover replace only the exact version seen, release deletes only ours
      (`ExactObject`). Two drivers can never both hold it.
    - any other store: the record is written, read back after a pause, and kept only if it is
      still ours (`ReadBack`; a second driver started within that second could slip in: the
      log says when this weaker lease is used)."""

    def __init__(self, layout: OutputLayout, run_id: str, heartbeat_s: float = 5.0, stale_s: float = 60.0):
        self.layout, self.run_id = layout, run_id
        self.heartbeat_s, self.stale_s = float(heartbeat_s), float(stale_s)
        self.path = layout.path(LEASE_FILE)
        self.renew_within_s = self.stale_s / 2  # a renewal failing for longer loses the lease
        self.lost: Optional[str] = None  # why the lease was lost mid-run, if it was
        self.took_over: Optional[dict] = None  # the stale lease this one replaced
        self.kind: Optional[str] = None  # which holder holds it: locked-file, exact-object, read-back
        self.weaker_because: Optional[str] = None  # why an object store's lease is read-back
        self._renewed = time.monotonic()  # when the record was last written
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
        self._renewed = time.monotonic()
        self._holder.take()
        self._start_heartbeat()

    def _choose_holder(self):
        if self.layout.local:
            self.kind = "locked-file"
            return LockedFile(self)
        exact = ConditionalObject.for_path(self.layout.fs, self.path)
        # the probe retries what fails for a while; only the store's own answers decide
        self.weaker_because = "not an S3 store, or boto3 not installed" if exact is None else exact.probe()
        if self.weaker_because is None:
            self.kind = "exact-object"
            return ExactObject(self, exact)
        self.kind = "read-back"
        log.warning(
            "%s: this store offers no conditional create chorus can use (%s), so the lease is written and "
            "read back (two drivers started within the same second could both run); S3 with conditional "
            "writes (and boto3 installed) makes it exact",
            self.layout.location,
            self.weaker_because,
        )
        return ReadBack(self)

    def _start_heartbeat(self) -> None:
        if self._holder is None:  # a lease never taken (tests): its beats only watch the record
            self._holder = self._choose_holder()
        self._thread = threading.Thread(target=self._beat, name="chorus-lease-heartbeat", daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            began = time.monotonic()
            deadline = self._renewed + self.renew_within_s
            try:
                with give_up_by(deadline):
                    taken_by = self._holder.beat()
            except Exception as e:  # not renewed this time
                if time.monotonic() < deadline:
                    log.warning(
                        "lease heartbeat failed (tried again until %.0f s after the last renewal): %s",
                        self.renew_within_s,
                        e,
                    )
                    continue
                since = time.monotonic() - self._renewed
                self._lose(f"the lease of {self.layout.location} could not be renewed for {since:.0f} s ({e})")
                return
            if taken_by is not None:
                self._lose(f"the lease of {self.layout.location} was taken by {taken_by}")
                return
            self._renewed = began

    def _lose(self, why: str) -> None:
        self.lost = why
        log.error("%s; this driver stops", why)

    def check(self) -> None:
        """Raise LeaseLost once the lease is lost: the driver must launch no more work."""
        if self.lost is not None:
            raise LeaseLost(
                f"stopped: {self.lost}. Past output.lease_stale_s={self.stale_s:g} s another driver may take "
                f"{self.layout.location} over, so this driver launches no more work; the parts written so far "
                f"stand. Rerun the same command to resume (once the store accepts writes again)"
            )

    def release(self) -> None:
        """Stop the heartbeat and give the lease back. A lost lease is given back only if that is
        quick (it may be another's now: the holder checks; or the store may still refuse); a
        lease that cannot be given back is taken over by the next run after lease_stale_s."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.heartbeat_s + 5)
        if self._holder is None:
            return
        holder, self._holder = self._holder, None
        try:
            with give_up_by(time.monotonic() + (self.heartbeat_s if self.lost else self.renew_within_s)):
                holder.give_back()
        except Exception as e:
            log.warning(
                "could not give the lease of %s back (%s): the next run takes it over after output.lease_stale_s",
                self.layout.location,
                e,
            )
