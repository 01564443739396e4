"""A node lost mid-run: the demo job as a Ray Job on a two-node cluster started on this machine
(tests/ray_nodes.py), an actor on each node, and the worker node killed while both are busy --
its raylet, agents and workers, by pid, as a spot machine disappears. Ray's own health checks
(their defaults) find it gone; the job finishes on the head, every id once, and its progress
and summary say what happened."""

from __future__ import annotations

import json
import secrets
import time
from collections import Counter

import pytest
from ray_nodes import job_logs, kill_node, ray_cli, ray_cluster, submit_pipeline, wait_for_job

from actors import schema as S
from helpers import demo_copies
from pipeline.names import SUMMARY_FILE
from pipeline.output.layout import OutputLayout

pytestmark = pytest.mark.slow


def nodes_in(output) -> set:
    """The nodes whose actors wrote the rows in the output's parts so far."""
    try:
        return {r[S.NODE] for r in OutputLayout(str(output)).read([S.NODE], latest_only=False).to_pylist()}
    except OSError:  # no data folder yet
        return set()


def test_a_node_lost_mid_run_the_job_finishes_on_the_rest(tmp_path, small_settings):
    ids = demo_copies(tmp_path / "in", copies=4)
    out = tmp_path / "out"
    job_id = f"chorus-node-loss-{secrets.token_hex(3)}"
    # the head has room for both actors (0.9 CPU each) and the tasks once the worker is gone;
    # Ray's scheduler puts the second actor on the idle worker node while the head is busy
    with ray_cluster(tmp_path, head_cpus=3, worker_cpus=[1]) as cluster:
        submit_pipeline(
            cluster,
            job_id,
            *small_settings,
            f"data.path={tmp_path / 'in' / 'demo.parquet'}",
            f"output.dir={out}",
            "cluster.num_actors=2",
            "cluster.cpus_per_actor=0.9",
            "cluster.rows_per_block=4",
            "output.progress_interval_s=2",
        )
        deadline = time.monotonic() + 240
        while len(nodes_in(out)) < 2:  # both actors at work
            assert time.monotonic() < deadline, job_logs(cluster, job_id)[-6000:]
            time.sleep(0.5)
        killed = kill_node(cluster.workers[0])
        final = wait_for_job(cluster.env, cluster.dashboard, job_id, timeout=420)
        logs = job_logs(cluster, job_id)
        if final != "SUCCEEDED":
            ray_cli(cluster.env, "job", "stop", f"--address={cluster.dashboard}", job_id, timeout=60)
    assert len(killed) >= 3  # its `ray start`, raylet and workers at least
    assert final == "SUCCEEDED", logs[-6000:]
    rows = OutputLayout(str(out)).read([S.ID, S.STATUS, S.NODE], latest_only=False).to_pylist()
    counts = Counter(r[S.ID] for r in rows)
    assert sorted(counts) == sorted(ids) and set(counts.values()) == {1}
    assert all(r[S.STATUS] == S.STATUS_OK for r in rows)
    assert len({r[S.NODE] for r in rows}) == 2  # the lost node's finished rows stand
    infrastructure = json.loads((out / SUMMARY_FILE).read_text())["infrastructure"]
    assert len(infrastructure["nodes_lost"]) == 1
    assert infrastructure["actors_restarted"] >= 1 and infrastructure["blocks_retried"] >= 1
    assert "was lost mid-run" in logs and "node(s) lost" in logs and "block(s) retried" in logs
