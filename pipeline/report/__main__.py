"""`python -m pipeline.report OUTPUT_DIR [--title T] [--max-audio-rows N] [--bench bench.json]`:
write OUTPUT_DIR/report.html for a chorus run, OUTPUT_DIR a local path or a URI
(pipeline/report/page.py)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Optional

from .page import write_report


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m pipeline.report", description="Write OUTPUT_DIR/report.html for a chorus run."
    )
    ap.add_argument(
        "output_dir", help="the run's output directory, a local path or a URI (holds data/ and summary.json)"
    )
    ap.add_argument("--title", default="chorus run")
    ap.add_argument("--max-audio-rows", type=int, default=12, help="ok rows with playable audio (default 12)")
    ap.add_argument("--bench", help="a benchmark JSON file whose 'configs' list is shown as a table")
    args = ap.parse_args(argv)
    bench = None
    if args.bench:
        try:
            bench = json.loads(Path(args.bench).read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            ap.error(f"--bench {args.bench!r}: {exc}")
        if not isinstance(bench, dict):
            ap.error(f"--bench {args.bench!r}: expected a JSON object")
    try:
        path = write_report(args.output_dir, title=args.title, max_audio_rows=args.max_audio_rows, bench=bench)
    except FileNotFoundError as exc:
        ap.error(str(exc))
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
