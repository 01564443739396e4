"""deploy/kuberay/rayjob.yaml: a RayJob with what the README asks of a cluster (token auth on every
pod, the S3 environment, a GPU worker group, the cluster deleted after the job), and its own
`entrypoint`, with the checkpoint and S3 values replaced by the demo's, run through `ray job
submit` against a Ray started here (kubectl is not needed): the manifest cannot drift from the
command line."""

from __future__ import annotations

import secrets
import shlex

import pytest
import yaml
from ray_nodes import job_logs, ray_cli, ray_cluster, wait_for_job

from actors import schema as S
from helpers import REPO
from pipeline.config import compose_typed
from pipeline.output.layout import OutputLayout

MANIFEST = REPO / "deploy" / "kuberay" / "rayjob.yaml"


def manifest() -> dict:
    return yaml.safe_load(MANIFEST.read_text())


def containers(spec: dict) -> list[dict]:
    cluster = spec["rayClusterSpec"]
    pods = [cluster["headGroupSpec"], *cluster["workerGroupSpecs"], {"template": spec["submitterPodTemplate"]}]
    return [c for pod in pods for c in pod["template"]["spec"]["containers"]]


def test_the_manifest_is_a_rayjob_as_the_readme_asks():
    job = manifest()
    assert (job["apiVersion"], job["kind"]) == ("ray.io/v1", "RayJob")
    spec = job["spec"]
    assert spec["shutdownAfterJobFinishes"] is True and spec["ttlSecondsAfterFinished"] > 0
    assert spec["rayClusterSpec"]["rayVersion"].startswith("2.60")
    (gpu,) = spec["rayClusterSpec"]["workerGroupSpecs"]
    (worker,) = gpu["template"]["spec"]["containers"]
    assert worker["resources"]["limits"]["nvidia.com/gpu"] == "1"
    for container in containers(spec):
        env = {e["name"]: e for e in container["env"]}
        assert env["RAY_AUTH_MODE"]["value"] == "token", container["name"]
        assert env["RAY_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == "chorus-ray-token"
    ray_pods = [c for c in containers(spec) if c["name"] != "ray-job-submitter"]
    assert all(c["envFrom"] == [{"secretRef": {"name": "chorus-s3"}}] for c in ray_pods)
    command = shlex.split(spec["entrypoint"])
    assert command[:2] == ["chorus", "run"]  # the installed command
    compose_typed(command[2:])  # every override is a key of the run's schema, in range


def demo_entrypoint(entrypoint: str, table: str, output: str, small_settings: list[str]) -> list[str]:
    """The manifest's command with the demo's checkpoint and S3 values (and CPU in place of GPUs);
    `chorus run` as `python -m pipeline run`, the same command run from the job's working_dir
    upload (this checkout) rather than from an installed wheel (tests/test_wheel.py runs that)."""
    replaced = {
        "model": "model=demo",
        "model.checkpoint": None,  # the demo's own
        "data.path": f"data.path={table}",
        "output.dir": f"output.dir={output}",
        "engine": "engine=cpu",
        "cluster": "cluster=local",
        "cluster.num_actors": "cluster.num_actors=1",
    }
    tokens = shlex.split(entrypoint)
    assert tokens[:2] == ["chorus", "run"], tokens
    command = ["python", "-m", "pipeline", "run"]
    for token in tokens[2:]:
        key = token.split("=", 1)[0]
        if key in replaced:
            if replaced[key] is not None:
                command.append(replaced[key])
        else:
            command.append(token)
    return [*command, *small_settings, "cluster.cpus_per_actor=0.5"]


@pytest.mark.slow
def test_the_manifests_entrypoint_runs_as_a_ray_job(s3_store, small_settings, tmp_path):
    table = f"{s3_store.bucket()}/texts/demo.parquet"
    s3_store.upload(REPO / "data" / "demo" / "demo.parquet", table)
    s3_store.upload(REPO / "data" / "demo" / "refs", table.replace("demo.parquet", "refs"))
    output = f"{s3_store.bucket()}/speech/run-1"
    command = demo_entrypoint(manifest()["spec"]["entrypoint"], table, output, small_settings)
    job_id = f"chorus-rayjob-{secrets.token_hex(4)}"
    # one node started here with the S3 environment in it, as the pods get it from the secret
    with ray_cluster(tmp_path, head_cpus=2, worker_cpus=[]) as cluster:
        submitted = ray_cli(
            cluster.env, "job", "submit", "--no-wait", f"--address={cluster.dashboard}",
            f"--submission-id={job_id}", "--working-dir", ".", "--", *command,
        )  # fmt: skip
        assert submitted.returncode == 0, submitted.stdout[-2000:] + submitted.stderr[-2000:]
        final = wait_for_job(cluster.env, cluster.dashboard, job_id, timeout=300)
        logs = job_logs(cluster, job_id)
    assert final == "SUCCEEDED", logs[-6000:]
    assert f"output written to {output}" in logs
    rows = OutputLayout(output).read([S.ID, S.STATUS]).to_pylist()
    assert len(rows) == 30 and {r[S.STATUS] for r in rows} == {S.STATUS_OK}
