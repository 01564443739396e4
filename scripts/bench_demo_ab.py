"""The demo job (`python -m pipeline`, 30 rows) in this tree and in a tree of an older commit,
alternating, each run on a fresh output: process wall time and the run's own wall_s
(summary.json). Prints a table and writes JSON.

    .venv/bin/python scripts/bench_demo_ab.py --base DIR [--runs 3] [--out bench-demo-ab.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def one_run(tree: str, output: str, overrides: list[str]) -> dict:
    env = dict(os.environ, PYTHONPATH=tree)
    began = time.monotonic()
    subprocess.run(
        [sys.executable, "-m", "pipeline", f"output.dir={output}", *overrides],
        cwd=tree,
        env=env,
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wall = time.monotonic() - began
    with open(os.path.join(output, "summary.json")) as f:
        summary = json.load(f)
    return {"process_s": wall, "wall_s": summary["wall_s"], "rows": summary["rows_total"]}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--base", required=True)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", default="bench-demo-ab.json")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(argv)
    trees = {"new": REPO, "base": os.path.abspath(args.base)}
    runs: dict[str, list] = {name: [] for name in trees}
    with tempfile.TemporaryDirectory(prefix="chorus-demo-ab-") as work:
        for k in range(args.runs):
            for name, tree in trees.items():
                result = one_run(tree, os.path.join(work, f"{name}-{k}"), args.overrides)
                runs[name].append(result)
                print(json.dumps({"tree": name, "run": k, **result}), flush=True)
    medians = {
        name: {key: statistics.median(r[key] for r in rs) for key in ("process_s", "wall_s")}
        for name, rs in runs.items()
    }
    ratio = {key: medians["new"][key] / medians["base"][key] for key in ("process_s", "wall_s")}
    with open(args.out, "w") as f:
        json.dump({"runs": runs, "medians": medians, "new_over_base": ratio}, f, indent=2)
    print("| tree | process s (each run) | run wall_s (each run) | median process s | median wall_s |")
    print("|---|---|---|---:|---:|")
    for name, rs in runs.items():
        each_p = ", ".join(f"{r['process_s']:.1f}" for r in rs)
        each_w = ", ".join(f"{r['wall_s']:.1f}" for r in rs)
        print(f"| {name} | {each_p} | {each_w} | {medians[name]['process_s']:.1f} | {medians[name]['wall_s']:.1f} |")
    print(f"new / base: process {ratio['process_s']:.2f}, wall_s {ratio['wall_s']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
