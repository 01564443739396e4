"""`python -m pipeline.export output.dir=D [export.dir=E] [export.overwrite=false]`

Writes one audio file per ok row of a chorus output, named after the row id
(schema.audio_file_stem: plain ids as they are, anything else reduced to safe characters plus
a hash, so no id can climb out of the directory or collide with another), and `files.csv`
mapping each id to its file. Errors rows are listed in files.csv without a file.
"""

from __future__ import annotations

import csv
import io
import logging
import sys
from dataclasses import dataclass, field
from typing import Optional

import pyarrow.fs as pafs
import pyarrow.parquet as pq
from omegaconf import MISSING, OmegaConf

from actors import schema as S
from actors.cli import error

from .output import OutputLayout, open_location

log = logging.getLogger("chorus.export")
INDEX_FILE = "files.csv"


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


@dataclass
class ExportReport:
    directory: str
    written: int
    skipped: int
    errors: int


class FileNames:
    """Stems for the ids of one export, distinct on case-insensitive filesystems too."""

    def __init__(self):
        self.taken: set[str] = set()

    def __call__(self, row_id: str) -> str:
        stem = S.audio_file_stem(row_id)
        if stem.lower() in self.taken:  # 'A' after 'a': only a case apart
            stem = S.audio_file_stem(row_id, with_hash=True)
        self.taken.add(stem.lower())
        return stem


EXPORT_BATCH_ROWS = 256  # rows of audio in memory at once: a shard's audio may not fit


def _rows(layout: OutputLayout, columns: list[str]):
    """The live files' rows, a few hundred at a time, only `columns` read."""
    for path in layout.live_files():
        with layout.fs.open_input_file(path) as handle:
            source = pq.ParquetFile(handle)
            # one row group at a time: over a whole file, iter_batches held every row group's
            # audio at once (a 200 MB shard: 203 MB of Arrow memory; by row group: 19 MB)
            for group in range(source.num_row_groups):
                batches = source.iter_batches(EXPORT_BATCH_ROWS, row_groups=[group], columns=columns, use_threads=False)
                for batch in batches:
                    yield from batch.to_pylist()


def export(output_dir: str, target: Optional[str] = None, overwrite: bool = False) -> ExportReport:
    layout = OutputLayout(output_dir)
    target = target or f"{layout.location}/audio"
    fs, base = open_location(target)
    fs.create_dir(base, recursive=True)
    index = io.StringIO()
    writer = csv.writer(index)
    writer.writerow([S.ID, S.STATUS, "file", S.AUDIO_SECONDS, S.ERROR])
    written = skipped = errors = 0
    names = FileNames()
    columns = [S.ID, S.STATUS, S.ERROR, S.AUDIO, S.AUDIO_SECONDS]
    for row in _rows(layout, columns):
        if row[S.STATUS] != S.STATUS_OK:
            errors += 1
            writer.writerow([row[S.ID], row[S.STATUS], "", "", row[S.ERROR]])
            continue
        name = names(row[S.ID]) + ".flac"
        path = f"{base}/{name}"
        if not overwrite and fs.get_file_info(path).type == pafs.FileType.File:
            skipped += 1
        else:
            with fs.open_output_stream(path) as f:
                f.write(row[S.AUDIO][S.AUDIO_BYTES])
            written += 1
        writer.writerow([row[S.ID], row[S.STATUS], name, row[S.AUDIO_SECONDS], ""])
    with fs.open_output_stream(f"{base}/{INDEX_FILE}") as f:
        f.write(index.getvalue().encode("utf-8"))
    return ExportReport(directory=target, written=written, skipped=skipped, errors=errors)


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
        f"{report.errors} error rows, in {report.directory} (index: {report.directory}/{INDEX_FILE})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
