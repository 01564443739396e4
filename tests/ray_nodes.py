"""A real multi-node Ray cluster started on this machine for a test: `ray start --head` and
`ray start --address` (own ports and temp dir, so nothing else running here is touched), every
node bound to 127.0.0.1 and run with `--block` in a session of its own, so that stopping a node
is a SIGTERM to the process the test started and losing one is a SIGKILL to each process of its
session, by pid (`ray stop` would stop every Ray on the machine).

Token auth: Ray 2.60 turns it on for a cluster whose starter finds a token; clients that
connect by explicit address only use it with RAY_AUTH_MODE=token. So every command gets
RAY_AUTH_MODE=token and one fresh RAY_AUTH_TOKEN, and ~/.ray/auth_token is neither read nor
written.
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
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from helpers import REPO

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
            [str(VENV_BIN / "ray"), "start", "--block", "--node-ip-address=127.0.0.1", *args, *node_ports()],
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


def _session(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[3])
    except (OSError, ValueError, IndexError):
        return None


def kill_node(node: subprocess.Popen) -> list[int]:
    """Lose a node as a spot machine is lost: SIGKILL, by pid, to every process of its session
    (its raylet, its agents, its workers, the `ray start` itself). The pids killed."""
    victims = [int(p) for p in os.listdir("/proc") if p.isdigit() and _session(int(p)) == node.pid]
    for pid in victims:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    node.wait()
    return victims


@dataclass
class Cluster:
    env: dict  # what a client of the cluster runs with
    address: str  # the head's GCS, for RAY_ADDRESS
    dashboard: str
    head: subprocess.Popen
    workers: list = field(default_factory=list)


@contextmanager
def ray_cluster(tmp_path: Path, head_cpus: int, worker_cpus: list[int], env: dict | None = None):
    """A head with `head_cpus` CPUs and a worker node per entry of `worker_cpus`, for the block;
    `env` adds to every node's environment (Ray settings such as RAY_health_check_*)."""
    env = dict(
        os.environ,
        RAY_AUTH_MODE="token",
        RAY_AUTH_TOKEN=secrets.token_hex(32),
        PATH=f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}",
        RAY_USAGE_STATS_ENABLED="0",
        # the job is over when the nodes stop: no 30 s drain on SIGTERM
        RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S="0",
        **(env or {}),
    )
    env.pop("RAY_ADDRESS", None)
    # a short temp dir: Ray's unix socket paths must stay under ~107 characters
    temp_dir = Path("/tmp") / f"chorus-ray-{secrets.token_hex(3)}"
    gcs_port, dashboard_port = free_port(), free_port()
    head = start_node(
        [
            "--head",
            f"--port={gcs_port}",
            f"--num-cpus={head_cpus}",
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
    cluster = Cluster(env, f"127.0.0.1:{gcs_port}", f"http://127.0.0.1:{dashboard_port}", head)
    try:
        for k, cpus in enumerate(worker_cpus):
            node = start_node(
                [f"--address=127.0.0.1:{gcs_port}", f"--num-cpus={cpus}"], env, tmp_path / f"worker{k}.log"
            )
            cluster.workers.append(node)
        yield cluster
    finally:
        for node in reversed([head, *cluster.workers]):
            if node.poll() is None:
                stop_node(node)
        shutil.rmtree(temp_dir, ignore_errors=True)


def ray_cli(env: dict, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(VENV_BIN / "ray"), *args], env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout
    )


def submit_pipeline(cluster: Cluster, job_id: str, *overrides: str) -> None:
    """`ray job submit --no-wait --working-dir . -- python -m pipeline <overrides>`."""
    done = ray_cli(
        cluster.env,
        "job",
        "submit",
        "--no-wait",
        f"--address={cluster.dashboard}",
        f"--submission-id={job_id}",
        "--working-dir",
        ".",
        "--",
        "python",
        "-m",
        "pipeline",
        *overrides,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]


def wait_for_job(env: dict, dashboard: str, job_id: str, timeout: float = 240) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = ray_cli(env, "job", "status", f"--address={dashboard}", job_id, timeout=60).stdout
        for final in ("SUCCEEDED", "FAILED", "STOPPED"):
            if f"Job '{job_id}' {final.lower()}" in status or f"status: {final}" in status:
                return final
        time.sleep(2)
    return "TIMEOUT"


def job_logs(cluster: Cluster, job_id: str) -> str:
    return ray_cli(cluster.env, "job", "logs", f"--address={cluster.dashboard}", job_id, timeout=60).stdout
