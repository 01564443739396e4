"""Planning at scale: `python -m pipeline.preview` (the run's own planning, no model or actors)
on corpus-shaped inputs of growing size.

    .venv/bin/python scripts/bench_preview.py [--sizes 200000 2000000] [--work DIR]
        [--done-rows N] [--out bench-preview.json]

For each size: an input from scripts/make_scale_input.py (kept in --work), then
`python -m pipeline.preview` on it in a fresh process. The figures are its wall time and peak
RSS (VmHWM, polled), and whether its counts equal the input's planted ones. --done-rows N first
writes N rows of the input as an earlier run's output (real content hashes, one part per input
fragment), so the plan also reads an output. Prints a table and writes JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PYTHON = sys.executable


def peak_rss_run(args: list[str], cwd: str) -> tuple[float, float, str]:
    """(wall s, peak RSS MB of the process, its stdout)."""
    env = dict(os.environ, PYTHONPATH=cwd)
    began = time.monotonic()
    proc = subprocess.Popen(args, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    peak = 0
    out_chunks = []
    while proc.poll() is None:
        try:
            with open(f"/proc/{proc.pid}/status") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        peak = max(peak, int(line.split()[1]))
        except OSError:
            pass
        time.sleep(0.2)
    out_chunks.append(proc.stdout.read())
    wall = time.monotonic() - began
    if proc.returncode:
        raise RuntimeError(f"{args[:4]} failed with status {proc.returncode}")
    return wall, peak / 1024.0, "".join(out_chunks)


def make_input(rows: int, work: str) -> tuple[str, dict]:
    path = os.path.join(work, f"input-{rows}")
    expected_file = os.path.join(path, "expected.json")
    if not os.path.exists(expected_file):
        subprocess.run([PYTHON, os.path.join(REPO, "scripts", "make_scale_input.py"), str(rows), path], check=True)
    with open(expected_file) as f:
        return path, json.load(f)


def write_done(data: str, output: str, rows: int) -> None:
    """An earlier run's output of the input's first `rows` accepted rows, ok, with the
    content hashes this tree's planning computes (so they count as done)."""
    sys.path.insert(0, REPO)
    import pyarrow as pa

    from actors import schema as S
    from pipeline.config import compose_typed
    from pipeline.output.layout import OutputLayout
    from pipeline.plan.identity import model_fingerprint, settings_digest
    from pipeline.plan.inputs import read_fragment, scan_input
    from pipeline.plan.keys import RowHasher, annotate

    config = compose_typed([f"data.path={data}"])
    scan = scan_input(data, {})
    hasher = RowHasher(settings_digest(config, model_fingerprint(config.model)), None, scan.root)
    layout = OutputLayout(output)
    layout.claim({"bench": "an earlier run"}, overwrite=False)
    written = 0
    for fragment in scan.fragments:
        keys = annotate(read_fragment(scan, fragment), fragment, hasher)
        keys = keys.filter(pa.compute.is_valid(keys.column(S.CONTENT_HASH))).slice(0, rows - written)
        n = keys.num_rows
        columns = {name: pa.nulls(n, S.OUTPUT_SCHEMA.field(name).type) for name in S.OUTPUT_SCHEMA.names}
        columns.update({S.ID: keys.column(S.ID), S.CONTENT_HASH: keys.column(S.CONTENT_HASH)})
        columns[S.STATUS] = pa.array([S.STATUS_OK] * n, pa.string())
        columns[S.RUN] = pa.array(["bench-earlier"] * n, pa.string())
        table = pa.table(columns, schema=S.OUTPUT_SCHEMA)
        layout.write_part(table, f"part-done-{fragment.index:05d}.parquet")
        written += n
        if written >= rows:
            return


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[200_000, 2_000_000])
    parser.add_argument("--work", default="/tmp/chorus-bench-preview")
    parser.add_argument("--done-rows", type=int, default=0)
    parser.add_argument("--out", default="bench-preview.json")
    args = parser.parse_args(argv)
    os.makedirs(args.work, exist_ok=True)
    results = []
    for rows in args.sizes:
        data, expected = make_input(rows, args.work)
        output = os.path.join(args.work, f"output-{rows}-{args.done_rows}")
        if args.done_rows and not os.path.exists(output):
            write_done(data, output, args.done_rows)
        overrides = [f"data.path={data}", f"output.dir={output}"]
        wall, rss, out = peak_rss_run([PYTHON, "-m", "pipeline.preview", *overrides], REPO)
        figures = json.loads(out.strip().splitlines()[-1])
        # exact: the planted rejections, and every row counted once; the earlier run's rows
        # include planted duplicate / conflict rows, which the plan rejects instead of counting
        # done (at most that many fewer done rows)
        planted_bad = expected["rejected"]["duplicate_id"] + expected["rejected"]["ref_id_conflict"]
        exact = figures["rejected"] == expected["rejected"]
        exact = exact and args.done_rows - planted_bad <= figures["done"] <= args.done_rows
        exact = exact and figures["done"] + figures["to_synthesize"] + sum(expected["rejected"].values()) == rows
        entry = {"rows": rows, "done_rows": args.done_rows, "expected": expected, "wall_s": wall}
        entry.update({"peak_rss_mb": rss, "counts_exact": exact, "figures": figures})
        results.append(entry)
        print(json.dumps(entry), flush=True)
    with open(args.out, "w") as f:
        json.dump({"cpu": "see docs/performance.md (figures with their CPU)", "results": results}, f, indent=2)
    print("| rows | done rows | wall s | peak RSS MB | counts exact |")
    print("|---:|---:|---:|---:|---|")
    for e in results:
        print(
            f"| {e['rows']:,} | {e['done_rows']:,} | {e['wall_s']:.1f} | {e['peak_rss_mb']:.0f} | {e['counts_exact']} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
