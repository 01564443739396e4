"""What reading an output costs as block parts and as shards, side by side in one run.

    .venv/bin/python scripts/bench_shards.py ROWS OUT [--audio-bytes B] [--block-rows R]

Writes ROWS synthetic output rows (random, incompressible `audio` bytes of B each) as
R-row block parts named as the job's write stage names them, then packs a linked copy of them
into shards at the defaults (output.shard_bytes / output.shard_rows) and measures the reads a
rerun, a summary and an export make over both, interleaved, each in a fresh process so its
peak RSS is its own. Prints a table; writes OUT/bench_shards.json.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

READS = {
    # what a rerun's resume reads, what the summary reads, and an export's pass over the audio
    "resume": "layout.read([S.ID, S.STATUS, S.RETRYABLE, S.CONTENT_HASH]).num_rows",
    "summary": "layout.read(SUMMARY_COLUMNS).num_rows",
    "export_scan": "sum(t.num_rows for u in plan_units(layout, Bounds(4096, 1 << 62)).units "
    "for t in read_slices(layout.location, u, [S.ID, S.STATUS, S.AUDIO]))",
    "list": "len(layout.live_files())",
}


def write_parts(out: Path, rows: int, audio_bytes: int, block_rows: int) -> float:
    import numpy as np
    import pyarrow.parquet as pq

    from actors import schema as S
    from pipeline.names import part_name
    from pipeline.output import hf_features
    from pipeline.output.layout import OutputLayout

    layout = OutputLayout(str(out))
    layout.claim({"bench": rows}, overwrite=True, run_id="bench")
    rng = np.random.default_rng(0)
    began = time.perf_counter()
    for start in range(0, rows, block_rows):
        block = [
            {
                S.ID: f"spk{k % 97}/utt{k:09d}",
                S.STATUS: S.STATUS_OK,
                S.AUDIO: {S.AUDIO_BYTES: rng.bytes(audio_bytes), S.AUDIO_PATH: None},
                S.SAMPLE_RATE: 44100,
                S.AUDIO_SECONDS: 1.0,
                S.N_FRAMES: 21,
                S.TEXT: "a sentence of the corpus, about this long " * 2,
                S.RUN: "bench",
                S.FINISHED_AT: float(k),
                S.CONTENT_HASH: f"{k:032x}",
                S.RETRYABLE: False,
            }
            for k in range(start, min(rows, start + block_rows))
        ]
        # the files write_block makes (name, features), without its per-file fsync: set-up, not measured
        table = hf_features.with_features(S.output_table(block))
        pq.write_table(table, f"{layout.data_dir}/{part_name(table.column(S.ID).to_pylist(), 'bench')}")
    return time.perf_counter() - began


def measure_read(out: Path, read: str) -> dict:
    """One read in a fresh interpreter: its wall time and the process's peak RSS."""
    code = (
        "import json, sys, time\n"
        f"sys.path.insert(0, {str(REPO)!r})\n"
        "from actors import schema as S\n"
        "from pipeline.export.formats import Bounds\n"
        "from pipeline.export.plan import plan_units\n"
        "from pipeline.export.task import read_slices\n"
        "from pipeline.output.layout import OutputLayout\n"
        "from pipeline.report.summary_figures import SUMMARY_COLUMNS\n"
        f"layout = OutputLayout({str(out)!r})\n"
        "began = time.perf_counter()\n"
        f"value = {READS[read]}\n"
        "seconds = time.perf_counter() - began\n"
        # VmHWM, not ru_maxrss: the latter carries the forking parent's peak across exec
        "rss = [int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('VmHWM')][0] / 1024\n"
        "print(json.dumps({'value': value, 's': seconds, 'peak_rss_mb': rss}))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def files_in(out: Path) -> int:
    return sum(1 for p in (out / "data").iterdir() if not p.name.startswith("."))


def median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("rows", type=int)
    parser.add_argument("out", type=Path)
    parser.add_argument("--audio-bytes", type=int, default=4096)
    parser.add_argument("--block-rows", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    from actors.synth.job_settings import OutputSettings
    from pipeline.output import shards
    from pipeline.output.layout import OutputLayout

    parts, packed_dir = args.out / f"rows-{args.rows}-parts", args.out / f"rows-{args.rows}-shards"
    result = {"rows": args.rows, "audio_bytes": args.audio_bytes, "block_rows": args.block_rows}
    result["write_parts_s"] = write_parts(parts, args.rows, args.audio_bytes, args.block_rows)
    subprocess.run(["rm", "-rf", str(packed_dir)], check=True)
    subprocess.run(["cp", "-al", str(parts), str(packed_dir)], check=True)  # the same files, linked
    defaults = OutputSettings()
    began = time.perf_counter()
    packed = shards.compact_all(OutputLayout(str(packed_dir)), "bench-end", defaults.shard_bytes, defaults.shard_rows)
    result["compact_s"] = time.perf_counter() - began
    result["compact_peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    result["files"] = {"parts": files_in(parts), "shards": files_in(packed_dir), "packed": len(packed)}
    runs = {layout: {read: [] for read in READS} for layout in ("parts", "shards")}
    for _ in range(args.repeats):  # interleaved: the machine's drift hits both alike
        for read in READS:
            for layout, where in (("parts", parts), ("shards", packed_dir)):
                runs[layout][read].append(measure_read(where, read))
    result["reads"] = {
        layout: {
            read: {
                "s": median([m["s"] for m in ms]),
                "peak_rss_mb": median([m["peak_rss_mb"] for m in ms]),
                "value": ms[0]["value"],
            }
            for read, ms in by_read.items()
        }
        for layout, by_read in runs.items()
    }

    print(f"{args.rows} rows, {args.audio_bytes} B audio each, {args.block_rows}-row blocks; medians of {args.repeats}")
    print(f"{'read':<12} {'parts s':>9} {'shards s':>9} {'ratio':>7} {'parts MB':>9} {'shards MB':>10}")
    for read in READS:
        p, s = result["reads"]["parts"][read], result["reads"]["shards"][read]
        print(
            f"{read:<12} {p['s']:9.3f} {s['s']:9.3f} {p['s'] / max(s['s'], 1e-9):6.1f}x "
            f"{p['peak_rss_mb']:9.0f} {s['peak_rss_mb']:10.0f}"
        )
    files = result["files"]
    print(
        f"files: {files['parts']} parts -> {files['shards']} files; compaction {result['compact_s']:.1f} s, "
        f"peak RSS {result['compact_peak_rss_mb']:.0f} MB"
    )
    (args.out / "bench_shards.json").write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
