"""The demo job's synthesis speed on a large input against a small one: each run is stopped
after the same wall time of synthesis, and the rows/s (and codec frames/s) of the two are compared.

    .venv/bin/python scripts/bench_job_scale.py [--sizes 2000 2000000] [--window-s 120]
        [--work DIR] [--out bench-job-scale.json] [--tree DIR] [overrides ...]

Inputs come from scripts/make_scale_input.py (no reference clips: both inputs cost the same per
row). For each: `python -m pipeline` on a fresh output, in its own process group; the clock
starts when the first part file lands (planning and Ray's start are not in the window), the
rows in the part files are counted after --window-s seconds, then the run's process group is
stopped. rows/s = rows in the window / window; frames/s the same for the rows' codec frames
(rows differ in length between the two inputs: frames are the work). --tree runs another
tree (an older commit's).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pyarrow.parquet as pq

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def part_files(data_dir: str) -> list[str]:
    """The synthesized rows' part files (not the rejected part)."""
    names = os.listdir(data_dir) if os.path.isdir(data_dir) else []
    return [
        os.path.join(data_dir, name)
        for name in names
        if name.startswith("part-") and name.endswith(".parquet") and name != "part-rejected.parquet"
    ]


def rows_written(data_dir: str) -> int:
    """Rows in the part files, from their footers (the poll for the first part)."""
    total = 0
    for path in part_files(data_dir):
        try:
            total += pq.ParquetFile(path).metadata.num_rows
        except Exception:  # a file being replaced this instant: counted next time
            pass
    return total


def work_written(data_dir: str) -> dict:
    """Rows, codec frames and audio seconds in the part files: rows differ in length between
    two inputs, so frames per second is the fairer rate of work."""
    rows = frames = audio = 0
    for path in part_files(data_dir):
        try:
            t = pq.read_table(path, columns=["n_frames", "audio_seconds"])
        except Exception:  # a file being replaced this instant: counted next time
            continue
        rows += t.num_rows
        frames += sum(v or 0 for v in t.column("n_frames").to_pylist())
        audio += sum(v or 0.0 for v in t.column("audio_seconds").to_pylist())
    return {"rows": rows, "frames": frames, "audio_s": audio}


def stop_process_group(proc: subprocess.Popen, wait_s: float) -> None:
    """Stop a job started with start_new_session=True, its Ray processes with it: SIGTERM to
    the group, SIGKILL if it has not exited within `wait_s`."""
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=wait_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def windowed_run(tree: str, data: str, output: str, window_s: float, overrides: list[str]) -> dict:
    shutil.rmtree(output, ignore_errors=True)
    env = dict(os.environ, PYTHONPATH=tree)
    began = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "pipeline", f"data.path={data}", f"output.dir={output}", *overrides],
        cwd=tree,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    data_dir = os.path.join(output, "data")
    try:
        while rows_written(data_dir) == 0:
            if proc.poll() is not None:
                raise RuntimeError(f"the run on {data} ended before writing a row (status {proc.returncode})")
            time.sleep(0.5)
        first = time.monotonic()
        start = work_written(data_dir)
        time.sleep(window_s)
        end = work_written(data_dir)
    finally:
        stop_process_group(proc, 30)
    done = {k: end[k] - start[k] for k in end}
    return {
        "to_first_part_s": first - began,
        "window_s": window_s,
        "rows_in_window": done["rows"],
        "rows_per_s": done["rows"] / window_s,
        "frames_per_s": done["frames"] / window_s,
        "audio_s_per_s": done["audio_s"] / window_s,
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[2_000, 2_000_000])
    parser.add_argument("--window-s", type=float, default=120.0)
    parser.add_argument("--work", default="/tmp/chorus-bench-job-scale")
    parser.add_argument("--tree", default=REPO)
    parser.add_argument("--out", default="bench-job-scale.json")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(argv)
    results = []
    for rows in args.sizes:
        data = os.path.join(args.work, f"input-{rows}-norefs")
        if not os.path.exists(os.path.join(data, "expected.json")):
            make = [sys.executable, os.path.join(REPO, "scripts", "make_scale_input.py"), str(rows), data]
            subprocess.run([*make, "--ref-fraction", "0"], check=True, stdout=subprocess.DEVNULL)
        output = os.path.join(args.work, f"output-{rows}")
        entry = {"rows": rows, **windowed_run(args.tree, data, output, args.window_s, args.overrides)}
        results.append(entry)
        print(json.dumps(entry), flush=True)
    small, large = min(results, key=lambda e: e["rows"]), max(results, key=lambda e: e["rows"])
    ratios = {k: large[k] / small[k] if small[k] else None for k in ("rows_per_s", "frames_per_s")}
    with open(args.out, "w") as f:
        json.dump(
            {"tree": args.tree, "results": results, "large_over_small": ratios["rows_per_s"], "ratios": ratios},
            f,
            indent=2,
        )
    print("| input rows | s to first part | rows in window | rows/s | frames/s |")
    print("|---:|---:|---:|---:|---:|")
    for e in results:
        print(
            f"| {e['rows']:,} | {e['to_first_part_s']:.1f} | {e['rows_in_window']} | {e['rows_per_s']:.2f} "
            f"| {e['frames_per_s']:.1f} |"
        )
    for k, ratio in ratios.items():
        print(f"large / small {k}: {ratio:.2f}" if ratio else f"no work in the small run's window ({k})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
