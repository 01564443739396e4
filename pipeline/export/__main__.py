"""`python -m pipeline.export output.dir=OUT [export.format=files|webdataset|lhotse|hf|nemo]
[export.dir=DEST] [export.status=[ok]] [export.min_mos=3.0] [export.min_speaker_similarity=0.86]
[export.max_wer=0.2] [export.exclude_flags=[clipping]] [export.shard_rows=N] [export.shard_bytes=N]
[export.prefix=train] [export.columns=[id,text,audio,...]] [export.splits={train: 0.98, test: 0.02}]
[export.license=cc-by-4.0] [export.language=[en]] [export.overwrite=true] [cluster.address=...]`

Keys and defaults: pipeline/config.py (ExportConfig); what each format writes: this package's
modules. Prints what it wrote and how many rows each filter removed.
"""

from __future__ import annotations

import logging
import sys
from typing import Optional

from omegaconf import OmegaConf

from actors.cli import error

from ..config import ExportConfig
from ..errors import USER_ERRORS
from .job import ExportReport, export

USAGE = (
    "usage: python -m pipeline.export output.dir=DIR [export.format=files|webdataset|lhotse|hf|nemo] "
    "[export.dir=DIR] [export.status=[ok]] [export.min_mos=X] [export.min_speaker_similarity=X] "
    "[export.max_wer=X] [export.exclude_flags=[...]] [export.columns=[...]] [export.splits={name: share}] "
    "[export.license=ID] [export.language=[...]] [export.shard_rows=N] [export.shard_bytes=N] [export.overwrite=true]"
)


def describe(report: ExportReport) -> str:
    s = report.summary
    removed = ", ".join(f"{key} {count:,}" for key, count in s["removed"].items()) or "none"
    index = "NeMo manifest(s)" if s.get("manifests") else "files.csv"
    what = f"{s['shards']} shard(s)" if s["shards"] else f"one file per row + {index}"
    lines = [
        f"chorus export: {s['rows']:,} rows ({s['audio_seconds'] / 3600:.2f} h of audio) in {report.destination}: "
        f"{what}" + (" -- already exported, nothing changed" if report.already_done else ""),
        f"  read {s['read']:,} rows; removed by filter: {removed}",
    ]
    if s.get("split_shares"):
        lines.append("  splits: " + ", ".join(f"{name} {c['rows']:,} rows" for name, c in s["splits"].items()))
    if s.get("urls"):
        lines.append(f"  read with webdataset.WebDataset({s['urls']!r})")
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    argv = sys.argv[1:] if argv is None else argv
    if {"--help", "-h"} & set(argv):  # every key with its default, range and meaning
        from ..config_page import terminal_help

        print(terminal_help("python -m pipeline.export"), end="")
        return 0
    try:
        cfg = OmegaConf.merge(OmegaConf.structured(ExportConfig), OmegaConf.from_cli(argv))
        config = OmegaConf.to_object(cfg)  # the one conversion: below here the export reads ExportConfig
    except Exception as e:  # unknown keys, wrong types, missing output.dir
        return error(f"{e}\n{USAGE}")
    try:
        config.export.validate()
        report = export(config.output.dir, config.export, config.cluster)
    except USER_ERRORS as e:
        return error(e)
    print(describe(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
