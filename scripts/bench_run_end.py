"""The end of a run at scale -- dropping superseded copies, then summary.json -- as a large run
does it (distributed), on outputs of growing size.

    .venv/bin/python scripts/bench_run_end.py [--sizes 200000 2000000] [--redo 0.05] [--work DIR]
        [--out bench-run-end.json]

For each size: an output of that many rows (no audio: the steps never read it) in files of
100k rows (output.shard_rows' default) written by an earlier run, plus, in the "redo" case, a
share (--redo) of those ids written again by this run in 16k-row files (so that every file of
the earlier run holds copies to drop); the "clean" case has no second copies. Both steps run
in a fresh driver process with a local Ray up (a run's driver has it up at that size), on its
own copy of the output: pipeline/output/supersede.py drop_superseded, then
pipeline/report/summary.py summary_of, distributed (what a run above
cluster.distributed_plan_rows does). The figures: wall seconds of each step and the driver's
peak RSS over them (VmHWM, reset after Ray starts; Ray's workers are other processes). Prints
a table and writes JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PYTHON = sys.executable
EARLIER, THIS = "20260101-000000-earlie", "20260102-000000-thisrn"
FILE_ROWS, REDO_FILE_ROWS = 100_000, 16_384


def _status_mb(key: str) -> float:
    with open("/proc/self/status") as f:
        return [int(line.split()[1]) / 1024 for line in f if line.startswith(key)][0]


def steps(out: str, accepted: int, redone: int, run: str) -> dict:
    """The run's end on the output at `out`, in this (fresh) process: Ray up first, then the
    peak RSS reset and both steps timed."""
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    import ray.data  # noqa: F401

    from pipeline.cluster import data_context
    from pipeline.output import supersede
    from pipeline.output.layout import OutputLayout
    from pipeline.report.summary import summary_of

    data_context()
    layout = OutputLayout(out)
    planned = supersede.PlannedRows(accepted=accepted, redone=redone)
    rss_before = _status_mb("VmRSS:")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # the peak from here on
    began = time.perf_counter()
    removed = supersede.drop_superseded(layout, planned, 0, distributed=True)  # refused ids: none
    dropped = time.perf_counter()
    figures = summary_of(layout, run, 100.0, {}, distributed=True)
    done = time.perf_counter()
    return {
        "supersede_s": dropped - began,
        "summary_s": done - dropped,
        "removed": removed,
        "rows_total": figures["rows_total"],
        "rss_before_mb": rss_before,
        "peak_rss_mb": _status_mb("VmHWM:"),
        "percentiles": figures.get("percentiles", "exact"),
    }


def _file(first: int, n: int, run: str, seed: int):
    """n rows of ids u{first..}: statuses, errors, timings, actors, batches, quality columns."""
    import numpy as np
    import pyarrow as pa

    from actors import schema as S
    from pipeline.output.reading import conform

    rng = np.random.default_rng(seed)
    ids = pa.array([f"u{k:09d}" for k in range(first, first + n)], pa.string())
    status = np.where(rng.random(n) < 0.05, S.STATUS_ERROR, S.STATUS_OK)
    messages = np.array([f"engine: failure of kind {k}" for k in range(20)], dtype=object)[rng.integers(0, 20, n)]
    block = np.arange(n) // 16
    batch = pa.StructArray.from_arrays(
        [
            pa.array([f"{run}:{seed}:{b}" for b in block], pa.string()),
            pa.array(rng.uniform(100, 900, n)),
            pa.array(rng.uniform(10, 60, n)),
            pa.array(rng.uniform(50, 500, n)),
            pa.array(np.full(n, 16, np.int32)),
        ],
        names=[S.BATCH_ID, S.BATCH_ENGINE_MS, S.BATCH_ENGINE_STEPS, S.BATCH_SLOT_ROWS, S.BATCH_SLOTS],
    )
    columns = {
        S.ID: ids,
        S.STATUS: pa.array(status, pa.string()),
        S.ERROR: pa.array(np.where(status == S.STATUS_ERROR, messages, None), pa.string()),
        S.AUDIO_SECONDS: pa.array(rng.uniform(0.5, 9.0, n)),
        S.N_FRAMES: pa.array(rng.integers(5, 400, n).astype(np.int32)),
        S.TOTAL_MS: pa.array(rng.uniform(50, 5000, n)),
        S.RTF: pa.array(rng.lognormal(-2.0, 0.8, n)),
        S.ACTOR: pa.array([f"actor-{k}" for k in rng.integers(0, 8, n)], pa.string()),
        S.NODE: pa.array(["node-0"] * n, pa.string()),
        S.DEVICE: pa.array(["cpu"] * n, pa.string()),
        S.RUN: pa.array([run] * n, pa.string()),
        S.FINISHED_AT: pa.array(1.7e9 + first + np.arange(n, dtype=np.float64)),
        S.BATCH: batch,
        S.ATTEMPTS: pa.array(rng.integers(1, 3, n).astype(np.int32)),
        S.DISCARDED_FRAMES: pa.array(rng.integers(0, 30, n).astype(np.int32)),
        S.LOUDNESS_LUFS: pa.array(rng.normal(-23.0, 4.0, n)),
        S.SILENCE_RATIO: pa.array(rng.uniform(0.0, 0.3, n)),
    }
    return conform(pa.table(columns))


def make_output(rows: int, redo: float, work: str) -> tuple[str, str, int]:
    """(clean template, redo template, rows redone), written once per size and share."""
    import pyarrow.parquet as pq

    clean, redone_dir = os.path.join(work, f"out-{rows}-clean"), os.path.join(work, f"out-{rows}-redo{redo}")
    redone = int(rows * redo)
    if not os.path.exists(clean):
        os.makedirs(f"{clean}.tmp/data")
        for i, first in enumerate(range(0, rows, FILE_ROWS)):
            table = _file(first, min(FILE_ROWS, rows - first), EARLIER, i)
            pq.write_table(table, f"{clean}.tmp/data/part-{EARLIER}-{i:05d}.parquet")
        os.rename(f"{clean}.tmp", clean)
    if not os.path.exists(redone_dir):
        shutil.copytree(clean, f"{redone_dir}.tmp")
        step = max(1, rows // max(1, redone))  # every step-th id: copies in every earlier file
        ids = list(range(0, rows, step))[:redone]
        for i, start in enumerate(range(0, len(ids), REDO_FILE_ROWS)):
            table = _redo_file(ids[start : start + REDO_FILE_ROWS], 10_000 + i)
            pq.write_table(table, f"{redone_dir}.tmp/data/part-{THIS}-{i:05d}.parquet")
        os.rename(f"{redone_dir}.tmp", redone_dir)
    return clean, redone_dir, redone


def _redo_file(ids: list[int], seed: int):
    import pyarrow as pa

    from actors import schema as S

    table = _file(0, len(ids), THIS, seed)
    return table.set_column(0, S.ID, pa.array([f"u{k:09d}" for k in ids], pa.string()))


def measure(template: str, rows: int, redone: int, work: str) -> dict:
    """Both steps on a fresh copy of `template`, in a fresh process (this script's --step)."""
    copy = os.path.join(work, "scratch")
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(template, copy)
    done = subprocess.run(
        [PYTHON, os.path.abspath(__file__), "--step", copy, str(rows), str(redone), THIS],
        cwd=REPO,
        env=dict(os.environ, PYTHONPATH=REPO, RAY_DATA_DISABLE_PROGRESS_BARS="1"),
        capture_output=True,
        text=True,
    )
    if done.returncode:
        raise RuntimeError(f"the run's end at {rows} rows failed:\n{done.stderr[-3000:]}")
    shutil.rmtree(copy, ignore_errors=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def cpu_name() -> str:
    try:
        lines = subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines()
        model = next(line.split(":", 1)[1].strip() for line in lines if line.startswith("Model name"))
        return f"{model}, {os.cpu_count()} CPUs"
    except (OSError, StopIteration):
        return platform.processor() or "unknown"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[200_000, 2_000_000])
    parser.add_argument("--redo", type=float, default=0.05, help="share of the ids this run wrote again")
    parser.add_argument("--work", default="/tmp/chorus-bench-run-end")
    parser.add_argument("--out", default="bench-run-end.json")
    parser.add_argument("--step", nargs=4, help=argparse.SUPPRESS)  # OUT ACCEPTED REDONE RUN: one measurement
    args = parser.parse_args(argv)
    sys.path.insert(0, REPO)
    if args.step:
        out, accepted, redone, run = args.step
        print(json.dumps(steps(out, int(accepted), int(redone), run)), flush=True)
        return 0
    os.makedirs(args.work, exist_ok=True)
    results = []
    for rows in args.sizes:
        clean, redo, redone = make_output(rows, args.redo, args.work)
        for case, template, copies in (("redo", redo, redone), ("clean", clean, 0)):
            entry = {"rows": rows, "case": case, "redone": copies}
            entry.update(measure(template, rows, copies, args.work))
            print(json.dumps(entry), flush=True)
            results.append(entry)
    with open(args.out, "w") as f:
        json.dump({"cpu": cpu_name(), "results": results}, f, indent=2)
    print(f"\nCPU: {cpu_name()}")
    print("| rows | case | supersede s | summary s | removed | driver RSS before MB | driver peak RSS MB |")
    print("|---:|---|---:|---:|---:|---:|---:|")
    for e in results:
        print(
            f"| {e['rows']:,} | {e['case']} | {e['supersede_s']:.1f} | {e['summary_s']:.1f} | "
            f"{e['removed']:,} | {e['rss_before_mb']:.0f} | {e['peak_rss_mb']:.0f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
