"""The demo as a Ray Job on a real two-node cluster started on this machine (tests/ray_nodes.py):
`ray job submit --working-dir . -- python -m pipeline ...`, wait for SUCCEEDED, check the output.
"""

from __future__ import annotations

import secrets

import pyarrow.parquet as pq
import pytest
from ray_nodes import job_logs, ray_cli, ray_cluster, submit_pipeline, wait_for_job

from actors import schema as S
from pipeline.output.layout import OutputLayout
from tests.helpers import REPO

pytestmark = pytest.mark.slow


@pytest.fixture
def two_node_cluster(tmp_path):
    with ray_cluster(tmp_path, head_cpus=1, worker_cpus=[1]) as cluster:
        yield cluster


def test_demo_as_a_ray_job_on_two_nodes(two_node_cluster, tmp_path):
    cluster = two_node_cluster
    env, dashboard = cluster.env, cluster.dashboard
    out = tmp_path / "job-output"
    job_id = f"chorus-test-{secrets.token_hex(4)}"
    submit_pipeline(
        cluster,
        job_id,
        f"output.dir={out}",
        "cluster.num_actors=2",
        "cluster.cpus_per_actor=0.6",
        "cluster.rows_per_block=5",
        "model.budget.max_frames=24",
        # the codec in the actor's process: a codec child per actor slows an actor's start on
        # a 1-CPU node enough that the first actor up can finish the small demo alone (seen once
        # in CI), and this test is about both nodes taking part
        "engine.codec_process=false",
        "output.progress_interval_s=2",
    )
    final = wait_for_job(env, dashboard, job_id)
    logs = job_logs(cluster, job_id)
    if final != "SUCCEEDED":
        ray_cli(env, "job", "stop", f"--address={dashboard}", job_id, timeout=60)
    assert final == "SUCCEEDED", logs[-6000:]
    assert f"output written to {out}" in logs
    assert "progress:" in logs  # no terminal in a job: periodic progress lines
    rows = OutputLayout(str(out)).read([S.ID, S.STATUS, S.NODE]).to_pylist()
    expected = pq.read_table(REPO / "data" / "demo" / "demo.parquet", columns=["id"]).column("id").to_pylist()
    assert sorted(r[S.ID] for r in rows) == sorted(expected)
    # 0.6 CPU actors do not fit twice on a 1-CPU node: one ran on each node
    assert len({r[S.NODE] for r in rows}) == 2
    # the run's log is the job's (`ray job logs`): chorus leaves no Hydra run folder beside the output
    assert not (out / "_runs").exists()
