"""The end of a run at scale -- dropping superseded copies, then summary.json -- in this tree
against an older one, side by side in one run.

    .venv/bin/python scripts/bench_run_end.py [--base DIR | --base-commit REV] [--sizes 200000 2000000]
        [--redo 0.05] [--work DIR] [--out bench-run-end.json]

For each size: an output of that many rows (no audio: the steps never read it) in files of
100k rows (output.shard_rows' default) written by an earlier run, plus, in the "redo" case, a
share (--redo) of those ids written again by this run in 16k-row files (so that every file of
the earlier run holds copies to drop); the "clean" case has no second copies. Each step runs
in a fresh driver process with a local Ray up (a run's driver has it up at that size), on its
own copy of the output:
  new:  pipeline/supersede.py drop_superseded + pipeline/summary.py summary_of, distributed
        (what a run above cluster.distributed_plan_rows does);
  base: the tree at --base: OutputLayout.drop_superseded + summarize(layout.read(...)).
The figures: wall seconds of each step and the driver's peak RSS over them (VmHWM, reset
after Ray starts; Ray's workers are other processes). Prints a table and writes JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PYTHON = sys.executable
EARLIER, THIS = "20260101-000000-earlie", "20260102-000000-thisrn"
FILE_ROWS, REDO_FILE_ROWS = 100_000, 16_384

# run in the measured tree (argv: output dir, rows accepted, rows redone, "new" | "base", this run's id)
STEPS = """
import json, sys, time
import pyarrow as pa
import ray
ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
import ray.data
from pipeline.output import OutputLayout
out, accepted, redone, which, run = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
def status(key):
    return [int(l.split()[1]) / 1024 for l in open('/proc/self/status') if l.startswith(key)][0]
layout, refused = OutputLayout(out), pa.array([], pa.string())
if which == 'new':
    from pipeline import supersede
    from pipeline.stream import data_context
    from pipeline.resume import PlanSummary
    from pipeline.summary import summary_of
    data_context()
    plan = PlanSummary(rows_total=accepted, counts={'done': accepted - redone, 'changed': redone})
    drop = lambda: supersede.drop_superseded(layout, plan, 0, distributed=True)  # refused ids: none
    summary = lambda: summary_of(layout, run, 100.0, {}, distributed=True)
else:
    from pipeline.output import SUMMARY_COLUMNS, summarize
    drop = lambda: layout.drop_superseded(also_drop=refused)
    summary = lambda: summarize(layout.read(SUMMARY_COLUMNS), run, 100.0, {})
rss_before = status('VmRSS:')
open('/proc/self/clear_refs', 'w').write('5')  # the peak from here on
began = time.perf_counter()
removed = drop()
dropped = time.perf_counter()
figures = summary()
done = time.perf_counter()
print(json.dumps({'supersede_s': dropped - began, 'summary_s': done - dropped, 'removed': removed,
                  'rows_total': figures['rows_total'], 'rss_before_mb': rss_before, 'peak_rss_mb': status('VmHWM:'),
                  'percentiles': figures.get('percentiles', 'exact')}))
"""


def _file(first: int, n: int, run: str, seed: int):
    """n rows of ids u{first..}: statuses, errors, timings, actors, batches, quality columns."""
    import numpy as np
    import pyarrow as pa

    from actors import schema as S
    from pipeline.shards import conform

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


def measure(tree: str, template: str, rows: int, redone: int, which: str, work: str) -> dict:
    copy = os.path.join(work, "scratch")
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(template, copy)
    done = subprocess.run(
        [PYTHON, "-c", STEPS, copy, str(rows), str(redone), which, THIS],
        cwd=tree,
        env=dict(os.environ, PYTHONPATH=tree, RAY_DATA_DISABLE_PROGRESS_BARS="1"),
        capture_output=True,
        text=True,
    )
    if done.returncode:
        raise RuntimeError(f"{which} at {rows} rows failed:\n{done.stderr[-3000:]}")
    shutil.rmtree(copy, ignore_errors=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def cpu_name() -> str:
    try:
        lines = subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines()
        model = next(line.split(":", 1)[1].strip() for line in lines if line.startswith("Model name"))
        return f"{model}, {os.cpu_count()} CPUs"
    except (OSError, StopIteration):
        return platform.processor() or "unknown"


def base_tree(args) -> str | None:
    if args.base or not args.base_commit:
        return args.base
    tree = os.path.join(args.work, f"base-{args.base_commit}")
    if not os.path.exists(tree):
        os.makedirs(tree)
        archive = subprocess.run(["git", "-C", REPO, "archive", args.base_commit], capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", tree], input=archive.stdout, check=True)
    return tree


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[200_000, 2_000_000])
    parser.add_argument("--redo", type=float, default=0.05, help="share of the ids this run wrote again")
    parser.add_argument("--base", default=None, help="a tree of the older commit")
    parser.add_argument("--base-commit", default=None, help="or a commit, extracted with git archive into --work")
    parser.add_argument("--work", default="/tmp/chorus-bench-run-end")
    parser.add_argument("--out", default="bench-run-end.json")
    args = parser.parse_args(argv)
    os.makedirs(args.work, exist_ok=True)
    sys.path.insert(0, REPO)
    base = base_tree(args)
    results = []
    for rows in args.sizes:
        clean, redo, redone = make_output(rows, args.redo, args.work)
        for case, template, copies in (("redo", redo, redone), ("clean", clean, 0)):
            for which, tree in (("base", base), ("new", REPO)):
                if tree is None:
                    continue
                entry = {"rows": rows, "case": case, "redone": copies, "tree": which}
                entry.update(measure(tree, template, rows, copies, which, args.work))
                print(json.dumps(entry), flush=True)
                results.append(entry)
    with open(args.out, "w") as f:
        json.dump({"cpu": cpu_name(), "base": base, "results": results}, f, indent=2)
    print(f"\nCPU: {cpu_name()}")
    print("| rows | case | tree | supersede s | summary s | removed | driver RSS before MB | driver peak RSS MB |")
    print("|---:|---|---|---:|---:|---:|---:|---:|")
    for e in results:
        print(
            f"| {e['rows']:,} | {e['case']} | {e['tree']} | {e['supersede_s']:.1f} | {e['summary_s']:.1f} | "
            f"{e['removed']:,} | {e['rss_before_mb']:.0f} | {e['peak_rss_mb']:.0f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
