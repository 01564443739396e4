"""The demo as a Ray Job on a real two-node cluster started on this machine.

`ray start --head` and a second `ray start --address` (own ports and temp dir, so nothing
else running here is touched), `ray job submit --working-dir . -- python -m pipeline ...`,
wait for SUCCEEDED, check the output. Both nodes run with `--block`: stopping them is a
SIGTERM to the two processes this test started (`ray stop` would stop every Ray on the
machine).

Token auth: Ray 2.60 turns it on for a cluster whose starter finds a token; clients that
connect by explicit address only use it with RAY_AUTH_MODE=token. So every command here
gets RAY_AUTH_MODE=token and one fresh RAY_AUTH_TOKEN, and ~/.ray/auth_token is neither
read nor written.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from actors import schema as S
from pipeline.output.layout import OutputLayout
from tests.helpers import REPO

pytestmark = pytest.mark.slow

VENV_BIN = Path(sys.executable).parent
STARTED = "Ray runtime started"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def node_ports() -> list[str]:
    """Every port a node opens, chosen free: two nodes share this machine."""
    flags = [
        "--node-manager-port",
        "--object-manager-port",
        "--dashboard-agent-listen-port",
        "--dashboard-agent-grpc-port",
        "--metrics-export-port",
        "--runtime-env-agent-port",
    ]
    return [arg for flag in flags for arg in (flag, str(free_port()))]


def start_node(args: list[str], env: dict, log: Path) -> subprocess.Popen:
    with open(log, "w") as out:
        node = subprocess.Popen(
            [str(VENV_BIN / "ray"), "start", "--block", *args, *node_ports()],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    deadline = time.monotonic() + 120
    while STARTED not in log.read_text():
        assert node.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.3)
    return node


def stop_node(node: subprocess.Popen) -> None:
    node.send_signal(signal.SIGTERM)  # --block: the node drains and stops the processes it started
    try:
        node.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(node.pid, signal.SIGKILL)  # its own session: only what this test started
        node.wait()


@pytest.fixture
def two_node_cluster(tmp_path):
    env = dict(
        os.environ,
        RAY_AUTH_MODE="token",
        RAY_AUTH_TOKEN=secrets.token_hex(32),
        PATH=f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}",
        RAY_USAGE_STATS_ENABLED="0",
        # the job is over when the nodes stop: no 30 s drain on SIGTERM
        RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S="0",
    )
    env.pop("RAY_ADDRESS", None)
    # a short temp dir: Ray's unix socket paths must stay under ~107 characters
    temp_dir = Path("/tmp") / f"chorus-ray-{secrets.token_hex(3)}"
    gcs_port, dashboard_port = free_port(), free_port()
    head = start_node(
        [
            "--head",
            f"--port={gcs_port}",
            "--num-cpus=1",
            "--include-dashboard=true",
            "--dashboard-host=127.0.0.1",
            f"--dashboard-port={dashboard_port}",
            f"--ray-client-server-port={free_port()}",
            f"--temp-dir={temp_dir}",
            "--disable-usage-stats",
        ],
        env,
        tmp_path / "head.log",
    )
    nodes = [head]
    try:
        nodes.append(start_node([f"--address=127.0.0.1:{gcs_port}", "--num-cpus=1"], env, tmp_path / "worker.log"))
        yield env, f"http://127.0.0.1:{dashboard_port}"
    finally:
        for node in reversed(nodes):
            stop_node(node)
        shutil.rmtree(temp_dir, ignore_errors=True)


def ray_cli(env: dict, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(VENV_BIN / "ray"), *args], env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout
    )


def wait_for_job(env: dict, dashboard: str, job_id: str, timeout: float = 240) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = ray_cli(env, "job", "status", f"--address={dashboard}", job_id, timeout=60).stdout
        for final in ("SUCCEEDED", "FAILED", "STOPPED"):
            if f"Job '{job_id}' {final.lower()}" in status or f"status: {final}" in status:
                return final
        time.sleep(2)
    return "TIMEOUT"


def test_demo_as_a_ray_job_on_two_nodes(two_node_cluster, tmp_path):
    env, dashboard = two_node_cluster
    out = tmp_path / "job-output"
    job_id = f"chorus-test-{secrets.token_hex(4)}"
    submit = ray_cli(
        env,
        "job",
        "submit",
        "--no-wait",
        f"--address={dashboard}",
        f"--submission-id={job_id}",
        "--working-dir",
        ".",
        "--",
        "python",
        "-m",
        "pipeline",
        f"output.dir={out}",
        "cluster.num_actors=2",
        "cluster.cpus_per_actor=0.6",
        "cluster.rows_per_block=5",
        "engine.max_frames=24",
        # the codec in the actor's process: a codec child per actor slows an actor's start on
        # a 1-CPU node enough that the first actor up can finish the small demo alone (seen once
        # in CI), and this test is about both nodes taking part
        "engine.codec_process=false",
        "output.progress_interval_s=2",
    )
    assert submit.returncode == 0, submit.stdout[-2000:] + submit.stderr[-2000:]
    final = wait_for_job(env, dashboard, job_id)
    logs = ray_cli(env, "job", "logs", f"--address={dashboard}", job_id, timeout=60).stdout
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
    # Hydra's logs went next to the output, not into the job's temporary working directory
    assert any((out / "_runs").iterdir())
