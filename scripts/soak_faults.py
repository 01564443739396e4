"""The demo job from S3 to S3 through a faulty object store, at length: every id once, the
rerun redoes nothing, and what it survived and spent.

    .venv/bin/python scripts/soak_faults.py [--rows 3000] [--slowdown 0.05] [--ambiguous 0.05]
        [--drop 0.02] [--seed 47] [--work DIR] [--out FILE.json] [overrides ...]

Everything runs on 127.0.0.1: the tests' S3 server (moto, tests/object_store.py), the tests'
fault-injecting proxy in front of it (tests/fault_proxy.py; `--slowdown` of requests answered
503 SlowDown, `--ambiguous` of writes answered 500 after they took effect, `--drop` of
connections closed unanswered; seeded), and a one-node Ray started for the soak with its node
on 127.0.0.1 and the proxy as its AWS_ENDPOINT_URL, so that the driver, the actors and the
write tasks all reach the store through the proxy. Besides the random faults, three targeted
ones: the first write of the lease record, of a part and of a shard are answered 500 after
they took effect.

The input is the demo table `--rows / 30` times over (ids made unique) with its clips, in a
bucket; the output in another. The job runs as `python -m pipeline` (the tests' short-row
settings, or the overrides given), then again (the rerun). Prints a table and writes a JSON
(default docs/bench/soak-faults.json): rows, each run's wall time and summary figures (the lease's
kind, object-store retries chorus spent), the faults the proxy injected (targeted ones included)
by kind and by method -- every one survived, at the cost of a try by the S3 SDK or by chorus --
and the checks (every id once, every row ok, the rerun's rows redone).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]
from fault_proxy import AMBIGUOUS, FaultProxy, Rule  # noqa: E402
from object_store import S3Store  # noqa: E402
from ray_nodes import ray_cluster  # noqa: E402

from helpers import demo_copies  # noqa: E402
from scripts.bench_run_end import cpu_name  # noqa: E402

# the tests' short rows (tests/conftest.py small_settings)
SHORT_ROWS = [
    "model.budget.max_frames=24",
    "model.budget.frames_per_byte=0.3",
    "model.budget.min_frames=6",
    "engine.stop_on_eos=false",
    "output.progress_bar=off",
    "output.progress_interval_s=30",
]
TARGETS = {"lease record": r"/out/_chorus\.lock$", "part": r"/out/data/part-", "shard": r"/out/data/shard-"}


def run_driver(args: list[str], env: dict) -> dict:
    began = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "pipeline", *args], cwd=REPO, env=env, capture_output=True, text=True)
    if done.returncode != 0 or "chorus: output written to" not in done.stdout:
        raise RuntimeError(f"the job failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}")
    return {"wall_s": round(time.monotonic() - began, 1)}


def output_ids(store: S3Store, output: str) -> Counter:
    """Every id in the output's live files, read past the proxy."""
    from pipeline.output.layout import OutputLayout

    os.environ["AWS_ENDPOINT_URL"] = store.endpoint
    rows = OutputLayout(output).read(["id", "status"], latest_only=False).to_pylist()
    return Counter((r["id"], r["status"]) for r in rows)


def soak(options: argparse.Namespace, work: Path) -> dict:
    store = S3Store()
    proxy = FaultProxy(store.endpoint, seed=options.seed)
    try:
        ids = demo_copies(work / "in", copies=max(1, options.rows // 30))
        source, output = f"{store.bucket()}/in", f"{store.bucket()}/out"
        store.upload(work / "in", source)
        proxy.set_rates(slowdown=options.slowdown, ambiguous=options.ambiguous, drop=options.drop)
        for key in TARGETS.values():
            proxy.add(Rule(AMBIGUOUS, key, method="PUT", times=1))
        args = [*SHORT_ROWS, f"data.path={source}/demo.parquet", f"output.dir={output}", *options.overrides]
        runs = []
        with ray_cluster(work, head_cpus=2, worker_cpus=[], env={"AWS_ENDPOINT_URL": proxy.endpoint}) as cluster:
            env = dict(cluster.env, PYTHONPATH=str(REPO), RAY_ADDRESS=cluster.address)
            for _ in range(2):  # the job, then its rerun
                figures = run_driver(args, env)
                summary = json.loads(store.get(f"{output}/summary.json"))
                runs.append({**figures, "run_rows": summary["run_rows"], **summary["infrastructure"]})
        found = output_ids(store, output)
        counts = proxy.counts()
    finally:
        proxy.stop()
        store.stop()
    once = sorted(i for i, _ in found) == sorted(ids) and set(found.values()) == {1}
    return {
        "cpu": cpu_name(),
        "date": datetime.date.today().isoformat(),
        "rows": len(ids),
        "rates": {"slowdown": options.slowdown, "ambiguous": options.ambiguous, "drop": options.drop},
        "seed": options.seed,
        "overrides": options.overrides,
        "runs": runs,
        "proxy": counts,
        "targeted": {name: rule["hits"] for name, rule in zip(TARGETS, counts["rules"])},
        # the job went on past every fault the proxy injected: each cost a try, the SDK's or chorus's
        "faults_survived": sum(counts["faults"].values()),
        "chorus_retries": sum(run["store_retries"] for run in runs),
        "checks": {
            "every_id_once": once,
            "every_row_ok": all(status == "ok" for _, status in found),
            "rerun_rows": runs[1]["run_rows"],
        },
    }


def table(result: dict) -> str:
    faults = result["proxy"]["faults"]
    lines = [
        f"soak: {result['rows']} rows S3 -> S3 through the fault proxy ({result['cpu']})",
        f"{'run':<6} {'wall s':>8} {'rows run':>9} {'lease':>13} {'store retries':>14}",
    ]
    for name, run in zip(("job", "rerun"), result["runs"]):
        lines.append(f"{name:<6} {run['wall_s']:>8} {run['run_rows']:>9} {run['lease']:>13} {run['store_retries']:>14}")
    lines.append(
        f"requests {result['proxy']['requests']}, faults injected and survived {result['faults_survived']}: "
        + ", ".join(f"{k} {v}" for k, v in faults.items())
        + f" (targeted hits {result['targeted']}); chorus's retries {result['chorus_retries']}"
    )
    lines.append(f"checks: {result['checks']}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=3000)
    parser.add_argument("--slowdown", type=float, default=0.05)
    parser.add_argument("--ambiguous", type=float, default=0.05)
    parser.add_argument("--drop", type=float, default=0.02)
    parser.add_argument("--seed", type=int, default=47)
    parser.add_argument("--work", default=None, help="scratch folder (default: a new temporary one)")
    parser.add_argument("--out", default=str(REPO / "docs" / "bench" / "soak-faults.json"))
    parser.add_argument("overrides", nargs="*", help="more `python -m pipeline` overrides")
    options = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="chorus-soak-", dir="/tmp") as scratch:
        result = soak(options, Path(options.work or scratch))
    print(table(result))
    Path(options.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {options.out}")
    ok = result["checks"]["every_id_once"] and result["checks"]["every_row_ok"] and result["checks"]["rerun_rows"] == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
