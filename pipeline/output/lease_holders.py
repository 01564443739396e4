"""How a lease (pipeline/output/lease.py) is held, one class per kind of store: a local lock
file, an S3 object written with preconditions, or a record written and read back. Each
`take`s the lease (or raises OutputInUse), `beat`s (renews it; returns the record of whoever
took it instead, else None) and `give_back`s it; the `Lease` judges records and runs the
heartbeat. Each holder is made by its Lease and given it (`lease`: no import back, the
layering allows no cycle)."""

from __future__ import annotations

import fcntl
import json
import logging
import os
import time
from typing import Optional

from ..errors import OutputInUse
from ..names import LEASE_FILE
from .conditional import ConditionalObject

log = logging.getLogger("chorus")


def parse_record(text: str) -> dict:
    try:
        record = json.loads(text) if text.strip() else {}
    except ValueError:
        return {}
    return record if isinstance(record, dict) else {}


class LockedFile:
    """A local directory's lease: the lock file flock'ed for the run (see Lease)."""

    RECORD_BYTES = 1024  # records are rewritten in place, padded to one size: never seen torn

    def __init__(self, lease):
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


class ExactObject:
    """An S3 store's lease by conditional writes (see Lease): create if absent, replace and
    delete only the version seen. A record holding this run's id is this run's own, whatever
    an error said about the write that put it there."""

    def __init__(self, lease, obj: ConditionalObject):
        self.lease, self.obj = lease, obj
        self.etag: Optional[str] = None

    def _seen(self) -> Optional[tuple[dict, str]]:
        seen = self.obj.read()
        return None if seen is None else (parse_record(seen[0].decode("utf-8", "replace")), seen[1])

    def take(self) -> None:
        for _ in range(10):
            self.etag = self.obj.create(self.lease.encoded())
            if self.etag is not None:
                return
            seen = self._seen()
            if seen is None:  # released meanwhile
                continue
            held, etag = seen
            if held.get("run") == self.lease.run_id:  # an earlier try of this run's took effect
                self.etag = etag
                return
            self.lease.take_over_or_refuse(held)
            self.etag = self.obj.replace(self.lease.encoded(), etag)
            if self.etag is not None:
                return
            self.lease.took_over = None  # another driver replaced it first: judge its record anew
        raise self.lease.contended()

    def beat(self) -> Optional[dict]:
        etag = self.obj.replace(self.lease.encoded(), self.etag)
        if etag is None:
            seen = self._seen()
            if seen is None or seen[0].get("run") != self.lease.run_id:
                return {} if seen is None else seen[0]
            # ours, written by an earlier beat whose answer was lost: renew from that version
            etag = self.obj.replace(self.lease.encoded(), seen[1])
            if etag is None:  # replaced again since: by another driver
                return (self._seen() or ({}, ""))[0]
        self.etag = etag
        return None

    def give_back(self) -> None:
        self.obj.delete(self.etag)


class ReadBack:
    """A store without conditional writes: write the record, wait, read it back (see Lease)."""

    SETTLE_S = 1.0  # let a concurrent writer's object land, then see whose survived

    def __init__(self, lease):
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
