"""The export at scale: a generated finished output (scripts/make_scale_output.py) of each size
exported to WebDataset as Ray Data work, each in a fresh driver process on a new local Ray;
prints a table and writes JSON.

    .venv/bin/python scripts/bench_export.py [--rows 20000 200000] [--shard-rows 10000] [--cpus 2]
        [--work /tmp/chorus-bench-export] [--json docs/bench/export-scale-spr.json]

Per size: the export's wall time (plan, the Ray Data pass, publish, finish; Ray's start not
counted), the driver's resident memory before the export and its peak growth during it
(VmRSS sampled every 20 ms), the units (Ray tasks) and the distinct worker processes that ran
them, and the rows and shards written.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024


class PeakRss:
    """The process's highest VmRSS while the block runs, sampled in a thread."""

    def __init__(self, every_s: float = 0.02):
        self.every_s, self.peak, self._stop = every_s, 0.0, threading.Event()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, rss_mb())
            time.sleep(self.every_s)

    def __enter__(self) -> PeakRss:
        self.peak = rss_mb()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def measure_export(source: str, dest: str, shard_rows: int, cpus: int) -> dict:
    """One export in this process (a fresh one): Ray started first, then the export measured."""
    import ray
    import ray.data  # noqa: F401

    from pipeline.cluster import LOCAL_RAY_SYSTEM_CONFIG
    from pipeline.config import ExportCluster, export_settings
    from pipeline.export.job import export

    ray.init(address="local", num_cpus=cpus, include_dashboard=False, _system_config=LOCAL_RAY_SYSTEM_CONFIG)
    settings = export_settings(format="webdataset", dir=dest, shard_rows=shard_rows, progress_interval_s=30.0)
    before = rss_mb()
    began = time.perf_counter()
    with PeakRss() as peak:
        report = export(source, settings, ExportCluster(num_cpus=cpus, distributed_rows=0))
    seconds = time.perf_counter() - began
    ray.shutdown()
    s = report.summary
    return {
        "seconds": round(seconds, 2),
        "driver_rss_before_mb": round(before, 1),
        "driver_rss_growth_mb": round(peak.peak - before, 1),
        "units": s["units"],
        "workers": s["workers"],
        "rows_read": s["read"],
        "rows_exported": s["rows"],
        "shards": s["shards"],
        "rows_per_s": round(s["read"] / seconds),
    }


def cpu_name() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        return next(line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name"))
    except (OSError, StopIteration):
        return platform.processor()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, nargs="+", default=[20_000, 200_000])
    parser.add_argument("--shard-rows", type=int, default=10_000)
    parser.add_argument("--cpus", type=int, default=2)
    parser.add_argument("--work", default="/tmp/chorus-bench-export")
    parser.add_argument("--json", default=str(REPO / "docs" / "bench" / "export-scale-spr.json"))
    parser.add_argument("--one", nargs=2, help=argparse.SUPPRESS)  # SOURCE DEST: one measurement
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure_export(args.one[0], args.one[1], args.shard_rows, args.cpus)))
        return 0
    from make_scale_output import make

    results = []
    for rows in args.rows:
        source, dest = f"{args.work}/out-{rows}", f"{args.work}/wds-{rows}"
        if not os.path.isdir(source):
            make(rows, source)
        shutil.rmtree(dest, ignore_errors=True)
        command = [sys.executable, __file__, "--one", source, dest, "--shard-rows", str(args.shard_rows)]
        done = subprocess.run([*command, "--cpus", str(args.cpus)], capture_output=True, text=True, check=True)
        results.append({"rows": rows, **json.loads(done.stdout.strip().splitlines()[-1])})
    print(
        "| rows | export s | rows/s | driver RSS before MB | driver RSS growth MB | units (tasks) | workers | shards |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        print(
            f"| {r['rows']:,} | {r['seconds']} | {r['rows_per_s']:,} | {r['driver_rss_before_mb']} | "
            f"{r['driver_rss_growth_mb']} | {r['units']} | {r['workers']} | {r['shards']} |"
        )
    record = {"cpu": cpu_name(), "cpus": args.cpus, "shard_rows": args.shard_rows, "results": results}
    Path(args.json).write_text(json.dumps(record, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
