"""The demo job when the infrastructure fails beneath it, each driver a `python -m pipeline`
process as a user runs it:

- an S3 store (tests/object_store.py) behind a fault-injecting proxy (tests/fault_proxy.py)
  answering 10% of requests `503 SlowDown`, 10% of writes `500` after they took effect (the
  first lease write among them) and closing 5% of connections unanswered: the job and its rerun
  complete, every id once, the lease exact throughout. The driver joins a Ray of its own
  (tests/ray_nodes.py, on 127.0.0.1), so that its workers reach the store through the proxy too.
- every lease request refused for longer than the stale time: the driver stops before its
  lease could be judged dead, and a rerun resumes; the same for a local lease found taken.
- a local output on a small tmpfs that fills mid-run: a clear error naming the output and the
  space needed, nothing torn, and once space is freed the rerun completes every id once.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections import Counter

import pyarrow.parquet as pq
import pytest
from fault_proxy import AMBIGUOUS, DROP, SLOWDOWN, Rule
from ray_nodes import ray_cluster

from actors import schema as S
from actors.files import TEMP_PREFIX
from helpers import REPO, demo_copies, start_driver
from pipeline.names import LEASE_FILE, REPORT_FILE, SUMMARY_FILE
from pipeline.output.layout import OutputLayout

pytestmark = pytest.mark.slow


def settings(small_settings, source: str, output: str, *more: str) -> list[str]:
    return [*small_settings, f"data.path={source}", f"output.dir={output}", "cluster.rows_per_block=3", *more]


def finish(driver: subprocess.Popen, timeout: float = 600) -> str:
    return driver.communicate(timeout=timeout)[0]


def wait_for_parts(driver: subprocess.Popen, layout: OutputLayout, parts: int, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while len(layout.parts()) < parts:
        assert driver.poll() is None, driver.stdout.read()[-4000:]
        assert time.monotonic() < deadline, "no parts written"
        time.sleep(0.2)


def each_id_once(location: str) -> Counter:
    return Counter(r[S.ID] for r in OutputLayout(location).read([S.ID, S.STATUS], latest_only=False).to_pylist())


def test_a_job_through_a_faulty_store_and_its_rerun_complete(s3_store, fault_proxy, small_settings, tmp_path):
    ids = demo_copies(tmp_path / "in", copies=2)
    source = f"{s3_store.bucket()}/in"
    s3_store.upload(tmp_path / "in", source)
    output = f"{s3_store.bucket()}/out"
    fault_proxy.set_rates(slowdown=0.10, ambiguous=0.10, drop=0.05)
    first_lease_write = fault_proxy.add(Rule(AMBIGUOUS, r"/out/_chorus\.lock$", method="PUT", times=1))
    args = settings(small_settings, f"{source}/demo.parquet", output)
    summaries = []
    # a Ray of its own on 127.0.0.1, whose workers reach the store through the proxy too
    with ray_cluster(tmp_path, head_cpus=2, worker_cpus=[], env={"AWS_ENDPOINT_URL": fault_proxy.endpoint}) as ray:
        env = dict(ray.env, PYTHONPATH=str(REPO), RAY_ADDRESS=ray.address)
        for _ in range(2):  # the job, then its rerun
            log = finish(start_driver(args, env))
            assert "chorus: output written to" in log, log[-6000:]
            summaries.append(json.loads(s3_store.get(f"{output}/{SUMMARY_FILE}")))
    assert first_lease_write.hits == 1
    assert [s["run_rows"] for s in summaries] == [len(ids), 0]  # the rerun redoes nothing
    assert [s["infrastructure"]["lease"] for s in summaries] == ["exact-object", "exact-object"]
    assert summaries[0]["infrastructure"]["store_retries"] >= 1 and "store_retries" not in summaries[0]
    assert "no conditional create" not in log
    counts = each_id_once(output)
    assert sorted(counts) == sorted(ids) and set(counts.values()) == {1}
    keys = s3_store.keys(output)
    assert REPORT_FILE in keys and LEASE_FILE not in keys
    assert not [k for k in keys if TEMP_PREFIX in k]
    faults = fault_proxy.counts()["faults"]
    assert faults[SLOWDOWN] and faults[AMBIGUOUS] and faults[DROP], faults


def test_a_driver_whose_lease_cannot_be_renewed_stops_before_it_could_go_stale(
    s3_store, fault_proxy, driver_env, small_settings, tmp_path
):
    ids = demo_copies(tmp_path / "in", copies=3)
    source = f"{s3_store.bucket()}/in"
    s3_store.upload(tmp_path / "in", source)
    output = f"{s3_store.bucket()}/out"
    env = dict(driver_env, AWS_ENDPOINT_URL=fault_proxy.endpoint)  # the driver (and its lease) via the proxy
    lease_timing = ["output.lease_heartbeat_s=1", "output.lease_stale_s=8"]
    args = settings(small_settings, f"{source}/demo.parquet", output, *lease_timing)
    driver = start_driver(args, env)
    wait_for_parts(driver, OutputLayout(output), parts=2)
    refused = fault_proxy.add(Rule(SLOWDOWN, r"/out/_chorus\.lock$", times=None))  # every lease request
    log = finish(driver, timeout=120)
    stopped_at = time.time()
    assert driver.returncode == 4, log[-4000:]  # stopped by what lies beneath: docs/operations.md#exit-statuses
    assert "could not be renewed" in log and "launches no more work" in log and "Rerun the same command" in log
    record = json.loads(s3_store.get(f"{output}/{LEASE_FILE}"))  # its last renewal, read past the proxy
    # stopped before a driver on another host could judge its lease dead (on this host its pid,
    # gone, says so at once)
    assert stopped_at - record["heartbeat"] < 8.0
    fault_proxy.remove(refused)
    assert len(each_id_once(output)) < len(ids)  # it stopped mid-run
    log = finish(start_driver(args, env))
    assert "chorus: output written to" in log, log[-4000:]
    counts = each_id_once(output)
    assert sorted(counts) == sorted(ids) and set(counts.values()) == {1}


def test_a_driver_whose_local_lease_is_taken_stops(driver_env, small_settings, tmp_path):
    ids = demo_copies(tmp_path / "in", copies=2)
    output = tmp_path / "out"
    args = settings(small_settings, str(tmp_path / "in" / "demo.parquet"), str(output), "output.lease_heartbeat_s=1")
    driver = start_driver(args, driver_env)
    wait_for_parts(driver, OutputLayout(str(output)), parts=2)
    # a driver on a host whose locks this one cannot see (a shared filesystem) writes its record
    # (its heartbeat old: a rerun may take it over)
    other = {"owner": "x", "host": "elsewhere", "pid": 1, "run": "other-host", "heartbeat": time.time() - 3600}
    with open(output / LEASE_FILE, "r+") as f:
        f.write(json.dumps(other).ljust(1024))
    began = time.monotonic()
    log = finish(driver, timeout=120)
    assert driver.returncode == 4 and "was taken by" in log and "other-host" in log, log[-4000:]
    assert time.monotonic() - began < 20
    log = finish(start_driver(args, driver_env))
    assert "chorus: output written to" in log, log[-4000:]
    counts = each_id_once(str(output))
    assert sorted(counts) == sorted(ids) and set(counts.values()) == {1}


@pytest.fixture
def small_disk(tmp_path):
    """A 16 MB tmpfs mounted for the test (root only; skipped where the machine allows none)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(disk)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({mounted.stderr.decode().strip()}): no small filesystem to fill")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def test_a_full_disk_stops_cleanly_and_the_rerun_completes_once(driver_env, small_settings, tmp_path, small_disk):
    ids = demo_copies(tmp_path / "in", copies=2)
    output = small_disk / "out"
    ballast = small_disk / "ballast"
    ballast.write_bytes(b"\0" * (14 << 20))  # ~2 MB left: the job needs more
    args = settings(small_settings, str(tmp_path / "in" / "demo.parquet"), str(output))
    log = finish(start_driver(args, driver_env))
    assert "error: the output" in log and str(output) in log and "ran out of space" in log, log[-4000:]
    assert "needs about" in log and "then rerun the same command" in log
    layout = OutputLayout(str(output))
    done = 0
    for path in layout.live_files():  # every live file whole
        done += pq.read_table(path).num_rows
    assert done < len(ids)
    ballast.unlink()  # space freed
    log = finish(start_driver(args, driver_env))
    assert "chorus: output written to" in log, log[-4000:]
    counts = each_id_once(str(output))
    assert sorted(counts) == sorted(ids) and set(counts.values()) == {1}
    assert not [n for n in os.listdir(output / "data") if n.startswith(TEMP_PREFIX)]
