"""One driver per output directory (issue 14, finding 5): the lease and its heartbeat, a dead
driver's lease taken over by exactly one of its racers, and a released lease never shared."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from actors.files import TEMP_PREFIX
from pipeline.config import compose_typed
from pipeline.errors import OutputInUse, OutputMismatch
from pipeline.names import LEASE_FILE
from pipeline.output.layout import OutputLayout
from pipeline.output.lease import Lease
from pipeline.run.steps import run


def test_a_second_driver_is_refused_while_the_first_holds_the_lease(tmp_path):
    layout = OutputLayout(str(tmp_path / "out"))
    first = Lease(layout, "run-a", heartbeat_s=0.2, stale_s=30)
    first.acquire()
    try:
        held = json.loads((tmp_path / "out" / LEASE_FILE).read_text())
        assert held["pid"] == os.getpid() and held["host"] == socket.gethostname() and held["run"] == "run-a"
        assert held["owner"]
        time.sleep(0.6)
        assert json.loads((tmp_path / "out" / LEASE_FILE).read_text())["heartbeat"] > held["heartbeat"]
        with pytest.raises(OutputInUse, match=rf"in use by another chorus driver .*pid {os.getpid()}"):
            Lease(layout, "run-b").acquire()
        # the whole driver refuses before touching anything
        with pytest.raises(OutputInUse):
            run(compose_typed([f"output.dir={tmp_path}/out"]))
    finally:
        first.release()
    assert not (tmp_path / "out" / LEASE_FILE).exists()
    second = Lease(layout, "run-b")
    second.acquire()  # free again
    second.release()


def test_a_lease_heartbeat_caught_mid_rename_is_not_a_foreign_file(tmp_path):
    # the first driver's heartbeat writes `.tmp-<pid>-<hex>-_chorus.lock` then renames it; a
    # second driver listing the directory in between must still say "in use", not "not ours"
    layout = OutputLayout(str(tmp_path / "out"))
    os.makedirs(layout.base)
    (tmp_path / "out" / LEASE_FILE).write_text("{}")
    (tmp_path / "out" / f"{TEMP_PREFIX}123-abcd1234-{LEASE_FILE}").write_text("{}")
    assert layout.foreign_entries() == []
    (tmp_path / "out" / f"{TEMP_PREFIX}123-abcd1234-notes.txt").write_text("x")
    (tmp_path / "out" / "thesis.txt").write_text("x")
    assert layout.foreign_entries() == [f"{TEMP_PREFIX}123-abcd1234-notes.txt", "thesis.txt"]
    with pytest.raises(OutputMismatch, match="thesis.txt"):
        layout.check_ours()


def test_a_dead_drivers_lease_is_taken_over(tmp_path):
    layout = OutputLayout(str(tmp_path / "out"))
    # a driver on this host that died without releasing: its pid no longer exists
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    os.makedirs(layout.base)
    record = {"owner": "x", "host": socket.gethostname(), "pid": child.pid, "run": "dead", "heartbeat": time.time()}
    (tmp_path / "out" / LEASE_FILE).write_text(json.dumps(record))
    lease = Lease(layout, "alive")
    lease.acquire()
    assert lease.took_over["run"] == "dead"
    lease.release()
    # another host's driver that stopped its heartbeat
    record = {"owner": "x", "host": "elsewhere", "pid": 1, "run": "silent", "heartbeat": time.time() - 120}
    (tmp_path / "out" / LEASE_FILE).write_text(json.dumps(record))
    lease = Lease(layout, "alive-2", stale_s=60)
    lease.acquire()
    assert lease.took_over["run"] == "silent"
    # ... and the driver whose lease was taken notices at its next heartbeat
    usurped = Lease(layout, "usurped", heartbeat_s=0.1)
    usurped._start_heartbeat()
    time.sleep(0.5)
    assert usurped.lost and "alive-2" in usurped.lost
    lease.release()
    # a live lease from another host is not taken
    record["heartbeat"] = time.time()
    (tmp_path / "out" / LEASE_FILE).write_text(json.dumps(record))
    with pytest.raises(OutputInUse, match="host elsewhere"):
        Lease(layout, "alive-3").acquire()


_RACER = """
import sys, time
from pipeline.output.lease import Lease
from pipeline.errors import OutputInUse
from pipeline.output.layout import OutputLayout
start, out, run = float(sys.argv[1]), sys.argv[2], sys.argv[3]
lease = Lease(OutputLayout(out), run, heartbeat_s=0.05)
time.sleep(max(0.0, start - time.time()))
try:
    lease.acquire()
except OutputInUse:
    print("refused", flush=True)
    sys.exit(0)
print("holds", flush=True)
time.sleep(1.0)  # hold it while the others try
print("lost" if lease.lost else "kept", flush=True)
lease.release()
"""


@pytest.mark.slow  # > 7 s: the everyday subset stays under 5 minutes
def test_drivers_racing_for_a_dead_drivers_lease_take_it_once(tmp_path):
    # several drivers find the same dead driver's lease at the same moment: exactly one takes
    # it over and keeps it; the others refuse (before the lock, a slow taker could rename a
    # fresh taker's lease away and both ran)
    layout = OutputLayout(str(tmp_path / "out"))
    os.makedirs(layout.base)
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    for round_ in range(3):
        record = {"owner": "x", "host": socket.gethostname(), "pid": child.pid, "run": "dead", "heartbeat": time.time()}
        (tmp_path / "out" / LEASE_FILE).write_text(json.dumps(record))
        start = time.time() + 2.0  # every racer imported and waiting by then
        racers = [
            subprocess.Popen(
                [sys.executable, "-c", _RACER, str(start), layout.location, f"racer-{round_}-{i}"],
                stdout=subprocess.PIPE,
                text=True,
            )
            for i in range(4)
        ]
        outcomes = sorted(" ".join(r.communicate(timeout=60)[0].split()) for r in racers)
        assert outcomes == ["holds kept", "refused", "refused", "refused"], outcomes
        assert not (tmp_path / "out" / LEASE_FILE).exists()  # released by the one that held it


def test_a_lease_released_while_another_driver_waits_on_its_file_is_not_shared(tmp_path):
    # the holder unlinks the lock file on release: a driver that opened the old file must not
    # lock that orphan while a third locks the new file at the path
    layout = OutputLayout(str(tmp_path / "out"))
    first = Lease(layout, "first", heartbeat_s=30)
    first.acquire()
    stale_fd = os.open(first.path, os.O_RDWR)  # a second driver that opened the file in time
    first.release()
    third = Lease(layout, "third", heartbeat_s=30)
    third.acquire()
    try:
        import fcntl

        fcntl.flock(stale_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # the orphan locks (nobody holds it) ...
        assert os.fstat(stale_fd).st_ino != os.stat(first.path).st_ino  # ... but it is not the lease
        with pytest.raises(OutputInUse, match="run third"):
            Lease(layout, "second").acquire()
    finally:
        os.close(stale_fd)
        third.release()
