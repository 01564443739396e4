"""Each export format's throughput on the same rows, in process (no Ray), the variants interleaved
and repeated, the median kept; plus the Lhotse Shar writing chorus did before (lhotse's
SharWriter, which decodes every row's FLAC and encodes it again) on the same cuts. Prints a
table and writes JSON.

    .venv/bin/python scripts/bench_export_formats.py [--rows 300] [--seconds 3.0] [--repeats 3]
        [--formats webdataset lhotse lhotse_reencode hf nemo files] [--json docs/bench/export-formats.json]

The rows: a finished output of `--rows` ok rows, each `--seconds` of 44.1 kHz 16-bit FLAC (a
tone under noise, so FLAC's sizes are speech-like), written as block parts as a run leaves them.
"""

from __future__ import annotations

import argparse
import io
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench_export import cpu_name  # noqa: E402

from actors import schema as S  # noqa: E402

RATE = 44_100


def make_source(folder: Path, rows: int, seconds: float) -> str:
    import soundfile as sf

    from pipeline.names import IDENTITY_FILE, SUMMARY_FILE
    from pipeline.output.layout import OutputLayout
    from pipeline.output.parts import write_block

    rng = np.random.default_rng(0)
    t = np.arange(int(seconds * RATE)) / RATE
    layout = OutputLayout(str(folder))
    layout.ensure()
    layout.write_text(IDENTITY_FILE, json.dumps({"model": "bench", "checkpoint": None}))
    block = []
    for k in range(rows):
        wave = 0.2 * np.sin(2 * np.pi * (120 + k % 50) * t) + 0.02 * rng.standard_normal(len(t))
        buffer = io.BytesIO()
        sf.write(buffer, wave.astype(np.float32), RATE, format="FLAC", subtype="PCM_16")
        block.append(
            {
                S.ID: f"spk{k % 20:02d}/utt{k:06d}",
                S.STATUS: S.STATUS_OK,
                S.AUDIO: {S.AUDIO_BYTES: buffer.getvalue(), S.AUDIO_PATH: None},
                S.SAMPLE_RATE: RATE,
                S.AUDIO_SECONDS: len(t) / RATE,
                S.TEXT: f"Sentence number {k} of the benchmark.",
                S.SPEAKER: f"spk{k % 20:02d}",
            }
        )
        if len(block) == 64 or k == rows - 1:
            write_block(S.output_table(block), layout.location)
            block = []
    layout.write_text(SUMMARY_FILE, json.dumps({"rows_total": rows}))
    return layout.location


def export_once(source: str, dest: Path, fmt: str) -> dict:
    from pipeline.config import ExportCluster, export_settings
    from pipeline.export.job import export

    settings = export_settings(format=fmt, dir=str(dest), progress_interval_s=1e9)
    began = time.perf_counter()
    summary = export(source, settings, ExportCluster(distributed_rows=1 << 62)).summary
    return {"seconds": time.perf_counter() - began, "rows": summary["rows"], "audio_seconds": summary["audio_seconds"]}


def reencode_once(source: str, dest: Path) -> dict:
    """What chorus's Lhotse export did before: each row a cut of its FLAC, written by lhotse's
    SharWriter with a `flac` recording field (decoded and encoded again)."""
    from lhotse import MonoCut, Recording, SupervisionSegment
    from lhotse.shar import SharWriter

    from pipeline.output.layout import OutputLayout

    table = OutputLayout(source).read([S.ID, S.AUDIO, S.TEXT, S.SPEAKER], latest_only=False)
    began = time.perf_counter()
    dest.mkdir(parents=True)
    with SharWriter(str(dest), fields={"recording": "flac"}, shard_size=1000) as writer:
        for row in table.to_pylist():
            key = S.sample_key(row[S.ID])
            recording = Recording.from_bytes(row[S.AUDIO][S.AUDIO_BYTES], recording_id=key)
            supervision = SupervisionSegment(
                key, key, 0.0, recording.duration, text=row[S.TEXT], speaker=row[S.SPEAKER]
            )
            cut = MonoCut(key, 0.0, recording.duration, 0, recording=recording, supervisions=[supervision])
            writer.write(cut)
    return {"seconds": time.perf_counter() - began, "rows": table.num_rows, "audio_seconds": None}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=300)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--formats", nargs="+", default=["webdataset", "lhotse", "lhotse_reencode", "hf", "nemo", "files"]
    )
    parser.add_argument("--json", default=str(REPO / "docs" / "bench" / "export-formats.json"))
    args = parser.parse_args()
    import lhotse  # noqa: F401  (its import, torch's among it, is not the export's time)

    work = Path(tempfile.mkdtemp(prefix="chorus-bench-formats-"))
    try:
        source = make_source(work / "out", args.rows, args.seconds)
        times: dict[str, list] = {fmt: [] for fmt in args.formats}
        for repeat in range(args.repeats):  # interleaved: each repeat runs every variant once
            for fmt in args.formats:
                dest = work / f"{fmt}-{repeat}"
                run = reencode_once(source, dest) if fmt == "lhotse_reencode" else export_once(source, dest, fmt)
                times[fmt].append(run["seconds"])
                shutil.rmtree(dest, ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    base = statistics.median(times["webdataset"]) if "webdataset" in times else None
    results = []
    print(f"{args.rows} rows x {args.seconds} s of 44.1 kHz FLAC, median of {args.repeats}, {cpu_name()}")
    print("| format | s | rows/s | audio s/s | x webdataset's time |")
    print("|---|---|---|---|---|")
    for fmt, runs in times.items():
        median = statistics.median(runs)
        row = {
            "format": fmt,
            "seconds": round(median, 3),
            "runs": [round(r, 3) for r in runs],
            "rows_per_s": round(args.rows / median, 1),
            "audio_s_per_s": round(args.rows * args.seconds / median, 1),
            "vs_webdataset": round(median / base, 2) if base else None,
        }
        results.append(row)
        print(
            f"| {fmt} | {row['seconds']} | {row['rows_per_s']:,} | {row['audio_s_per_s']:,} | {row['vs_webdataset']} |"
        )
    record = {"cpu": cpu_name(), "rows": args.rows, "seconds_per_row": args.seconds, "results": results}
    Path(args.json).write_text(json.dumps(record, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
