"""The output's lease on a real S3 endpoint (tests/object_store.py), no Ray: drivers started at
the same instant (exactly one holds it), a dead driver's lease taken over by a conditional
replace of the exact version seen (and by one of several contenders only), a heartbeat that
notices its lease was taken, a release that deletes only its own record; and the logged
write-and-read-back fallback on a store without conditional writes."""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import textwrap
import time

import pyarrow.fs as pafs
import pytest

from helpers import REPO
from pipeline.errors import OutputInUse
from pipeline.names import LEASE_FILE
from pipeline.output import layout as output_layout
from pipeline.output.layout import OutputLayout
from pipeline.output.lease import Lease

# One contender: everything imported and the store reached first, then it waits for the common
# instant and takes the lease; the holder keeps it until its stdin closes (the test says so
# once every contender has answered), so no contender can win after a release.
_CONTENDER = textwrap.dedent(
    """
    import json, sys, time
    from pipeline.errors import OutputInUse
    from pipeline.output.layout import OutputLayout
    from pipeline.output.lease import Lease

    location, run_id, start_at = sys.argv[1], sys.argv[2], float(sys.argv[3])
    layout = OutputLayout(location)
    layout.fs.create_dir(layout.base, recursive=True)
    time.sleep(max(0.0, start_at - time.time()))
    lease = Lease(layout, run_id, heartbeat_s=0.5)
    try:
        lease.acquire()
    except OutputInUse as refused:
        print(json.dumps({"run": run_id, "held": False, "why": str(refused)}), flush=True)
        sys.exit(0)
    print(json.dumps({"run": run_id, "held": True, "kind": lease.kind, "took_over": lease.took_over}), flush=True)
    sys.stdin.read()
    lease.release()
    """
)


def contend(location: str, contenders: int) -> list[dict]:
    """`contenders` processes take the lease of `location` at the same instant; their answers."""
    start_at = time.time() + 4.0  # after every interpreter has started and imported
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _CONTENDER, location, f"run-{k}", str(start_at)],
            cwd=REPO,
            env=dict(os.environ, PYTHONPATH=str(REPO)),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for k in range(contenders)
    ]
    answers = []
    try:
        for proc in procs:
            line = proc.stdout.readline()
            assert line, proc.stderr.read()[-3000:]
            answers.append(json.loads(line))
        assert time.time() > start_at
    finally:
        for proc in procs:
            proc.stdin.close()  # the holder releases
            assert proc.wait(timeout=60) == 0, proc.stderr.read()[-3000:]
    return answers


def lease_record(s3_store, location: str) -> dict:
    return json.loads(s3_store.get(f"{location}/{LEASE_FILE}"))


def dead_record(run: str) -> dict:
    """A lease record of a driver on this host that has exited."""
    finished = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return {
        "owner": "someone",
        "host": socket.gethostname(),
        "pid": int(finished.stdout),
        "run": run,
        "heartbeat": time.time(),
    }


@pytest.mark.slow  # > 7 s: the everyday subset stays under 5 minutes
def test_drivers_started_together_one_holds_the_lease(s3_store):
    for _ in range(3):
        location = f"{s3_store.bucket()}/out"
        answers = contend(location, contenders=4)
        holders = [a for a in answers if a["held"]]
        assert len(holders) == 1, answers
        assert holders[0]["kind"] == "exact-object"
        refused = [a for a in answers if not a["held"]]
        assert all("in use by another chorus driver" in a["why"] for a in refused)
        assert all(f"run {holders[0]['run']}" in a["why"] for a in refused)  # they name the holder
    assert s3_store.keys(location) == []  # released: the record is gone, and no probe object is left


def test_a_dead_drivers_lease_is_taken_over_by_exactly_one(s3_store):
    location = f"{s3_store.bucket()}/out"
    stale = dead_record("killed-run")
    s3_store.put(f"{location}/{LEASE_FILE}", json.dumps(stale).encode())
    answers = contend(location, contenders=3)
    holders = [a for a in answers if a["held"]]
    assert len(holders) == 1, answers
    assert holders[0]["took_over"] == stale


def test_a_live_lease_is_refused_and_a_taken_lease_is_noticed(s3_store, caplog):
    location = f"{s3_store.bucket()}/out"
    layout = OutputLayout(location)
    first = Lease(layout, "first-run", heartbeat_s=0.2)
    first.acquire()
    assert first.kind == "exact-object" and lease_record(s3_store, location)["run"] == "first-run"
    with pytest.raises(OutputInUse, match="run first-run"):
        Lease(layout, "second-run").acquire()
    # another driver overwrites the record (a store without our precondition would let it):
    # the next heartbeat's conditional replace fails, and the run knows its lease is lost
    intruder = {**dead_record("intruder"), "pid": os.getpid()}
    s3_store.put(f"{location}/{LEASE_FILE}", json.dumps(intruder).encode())
    deadline = time.monotonic() + 10
    while first.lost is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert first.lost is not None and "intruder" in first.lost
    first.release()  # deletes only the version it wrote: the intruder's record stays
    assert lease_record(s3_store, location) == intruder


def test_a_released_lease_can_be_taken_again(s3_store):
    location = f"{s3_store.bucket()}/out"
    for run in ("a", "b"):
        lease = Lease(OutputLayout(location), run)
        lease.acquire()
        assert lease_record(s3_store, location)["run"] == run and lease.took_over is None
        lease.release()
        assert s3_store.keys(location) == []


def test_a_store_without_conditional_writes_gets_the_logged_fallback(tmp_path, monkeypatch, caplog):
    # a filesystem that is not S3 (a real directory behind pyarrow's SubTreeFileSystem, under a
    # URI scheme of the test's own) has no conditional create chorus can use
    real = output_layout.open_location
    store = pafs.SubTreeFileSystem(str(tmp_path), pafs.LocalFileSystem())

    def open_location(location: str):
        return (store, location.removeprefix("teststore://")) if location.startswith("teststore://") else real(location)

    monkeypatch.setattr(output_layout, "open_location", open_location)
    layout = OutputLayout("teststore://bucket/out")
    assert not layout.local
    lease = Lease(layout, "first-run")
    with caplog.at_level(logging.WARNING, logger="chorus"):
        lease.acquire()
    assert lease.kind == "read-back"
    assert "no conditional create" in caplog.text and "teststore://bucket/out" in caplog.text
    assert json.loads((tmp_path / "bucket" / "out" / LEASE_FILE).read_text())["run"] == "first-run"
    with pytest.raises(OutputInUse, match="run first-run"):
        Lease(layout, "second-run").acquire()
    lease.release()
    assert not (tmp_path / "bucket" / "out" / LEASE_FILE).exists()
