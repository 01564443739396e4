"""Rows written as they finish against rows written with their block (issue 57): the demo job on
blocks that each hold one long row beside short ones, run with `output.write_within_s` at its
default and at a value no block reaches (every block one part at its end: how runs wrote before),
alternating. The output's live files are polled while each run goes on, so what is measured is
what a user -- or a crash -- would find on disk: for each short row, the seconds from its
finishing (its `finished_at`) to its being in a live file; the longest stretch without a new row
on disk, from the first; parts written; the run's wall time and rows/s. Prints a table, writes JSON.

    python scripts/bench_head_of_line.py --blocks 4 --rounds 2 --json docs/bench/head-of-line-spr.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from actors import schema as S  # noqa: E402
from pipeline.cluster import Cluster  # noqa: E402
from pipeline.config import compose_typed  # noqa: E402
from pipeline.output.layout import OutputLayout  # noqa: E402
from pipeline.run.steps import run  # noqa: E402
from tests.helpers import watching_output  # noqa: E402

SENTENCE = "The long row goes on and on, one clause after another, until the very end. "
VARIANTS = {"as they finish": "5", "with the block": "1e9"}


def table(blocks: int, rows_per_block: int, long_repeats: int) -> pa.Table:
    ids, texts = [], []
    for b in range(blocks):
        ids.append(f"b{b}-long")
        texts.append(SENTENCE * long_repeats)
        for k in range(rows_per_block - 1):
            ids.append(f"b{b}-short{k}")
            texts.append(f"Short sentence {k} of block {b}.")
    return pa.table({S.ID: ids, S.TEXT: texts})


def one_run(source: Path, out: Path, rows_per_block: int, within: str) -> dict:
    settings = [
        f"data.path={source}",
        f"output.dir={out}",
        f"cluster.rows_per_block={rows_per_block}",
        f"output.write_within_s={within}",
        "engine.stop_on_eos=false",  # every row runs to its budget: the same work each run
        "output.progress_bar=off",
        "output.progress_interval_s=0",
    ]
    with watching_output(str(out)) as seen:
        report = run(compose_typed(settings))
    rows = OutputLayout(str(out)).read([S.ID, S.FINISHED_AT, S.BATCH]).to_pylist()
    finished = {r[S.ID]: r[S.FINISHED_AT] for r in rows}
    waits = [seen[i] - finished[i] for i in finished if "short" in i and i in seen]
    on_disk = sorted(seen.values())  # from the first row on disk: the start-up is the same either way
    return {
        "wall_s": report.summary["wall_s"],
        "rows_per_s": report.summary["rows_per_s"],
        "parts": len({r[S.BATCH][S.BATCH_ID] for r in rows}),
        "short_wait_median_s": statistics.median(waits),
        "short_wait_max_s": max(waits),
        "longest_gap_s": max(b - a for a, b in zip(on_disk, on_disk[1:])),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--blocks", type=int, default=4)
    parser.add_argument("--rows-per-block", type=int, default=8)
    parser.add_argument("--long-repeats", type=int, default=12, help="the long row: this many sentences")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="chorus-hol-"))
    source = work / "in.parquet"
    pq.write_table(table(args.blocks, args.rows_per_block, args.long_repeats), source)
    results: dict = {name: [] for name in VARIANTS}
    with Cluster.for_rows(compose_typed([]).cluster, 1) as cluster:
        cluster.connect()  # one Ray for every run (each run alone would start and stop its own)
        for r in range(args.rounds):
            for name, within in VARIANTS.items():  # alternating: the VM's drift hits both alike
                results[name].append(one_run(source, work / f"out-{r}-{within}", args.rows_per_block, within))
    keys = ["wall_s", "rows_per_s", "parts", "short_wait_median_s", "short_wait_max_s", "longest_gap_s"]
    summary = {name: {k: statistics.median(run[k] for run in runs) for k in keys} for name, runs in results.items()}
    base = summary["with the block"]
    print(f"| rows written | {' | '.join(keys)} |")
    print("|---|" + "---:|" * len(keys))
    for name, figures in summary.items():
        print(f"| {name} | " + " | ".join(f"{figures[k]:.2f}" for k in keys) + " |")
    print(
        f"rows/s ratio (as they finish / with the block): {summary['as they finish']['rows_per_s'] / base['rows_per_s']:.3f}"
    )
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "machine": platform.processor() or platform.machine(),
                    "args": vars(args) | {"json": str(args.json)},
                    "runs": results,
                    "median": summary,
                },
                indent=2,
            )
            + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
