"""`python -m pipeline.export output.dir=D [export.dir=E] [export.overwrite=false]`

Writes one audio file per ok row of a chorus output and `files.csv` mapping each id to its
file (pipeline/output/audio_files.py does the work).
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass, field
from typing import Optional

from omegaconf import MISSING, OmegaConf

from actors.cli import error

from .names import EXPORT_INDEX_FILE
from .output.audio_files import export


@dataclass
class ExportSource:
    # the chorus output directory (local or URI), as given to the run's output.dir
    dir: str = MISSING


@dataclass
class ExportTarget:
    # where the files go; null = <output.dir>/audio
    dir: Optional[str] = None
    # replace files that are already there (else they are left as they are)
    overwrite: bool = False


@dataclass
class ExportConfig:
    output: ExportSource = field(default_factory=ExportSource)
    export: ExportTarget = field(default_factory=ExportTarget)


def main(argv: Optional[list[str]] = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        cfg = OmegaConf.merge(
            OmegaConf.structured(ExportConfig), OmegaConf.from_cli(sys.argv[1:] if argv is None else argv)
        )
        source = cfg.output.dir
    except Exception as e:  # unknown keys, wrong types, missing output.dir
        return error(f"{e}\nusage: python -m pipeline.export output.dir=DIR [export.dir=DIR] [export.overwrite=true]")
    report = export(source, cfg.export.dir, cfg.export.overwrite)
    print(
        f"chorus export: {report.written} files written, {report.skipped} already there, "
        f"{report.errors} error rows, in {report.directory} (index: {report.directory}/{EXPORT_INDEX_FILE})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
