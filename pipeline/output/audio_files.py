"""One audio file per ok row of a chorus output, named after the row id
(schema.audio_file_stem: plain ids as they are, anything else reduced to safe characters plus
a hash, so no id can climb out of the directory or collide with another), and `files.csv`
mapping each id to its file and its turns (who speaks when, as JSON); error rows are listed in
files.csv without a file. A file is the row's audio as written: a dialogue row's of
output.channels=per_speaker has one channel per voice. Reads the live
files a row group at a time. `python -m pipeline.export` is its command line."""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass
from typing import Optional

import pyarrow.fs as pafs
import pyarrow.parquet as pq

from actors import schema as S

from ..location import open_location
from ..names import EXPORT_DIR, EXPORT_INDEX_FILE
from .layout import OutputLayout


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


def live_rows(layout: OutputLayout, columns: list[str]):
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


def turns_cell(turns: Optional[list]) -> str:
    """A row's turns for files.csv: a JSON list of {speaker, text, start_s, end_s,
    speaker_similarity} (empty for output written before turns existed)."""
    return json.dumps(turns, ensure_ascii=False) if turns else ""


def export(output_dir: str, target: Optional[str] = None, overwrite: bool = False) -> ExportReport:
    """One FLAC file per ok row of the output at `output_dir` (local or URI) into `target`
    (default <output>/audio), and the index file mapping every row id to its file."""
    layout = OutputLayout(output_dir)
    target = target or f"{layout.location}/{EXPORT_DIR}"
    fs, base = open_location(target)
    fs.create_dir(base, recursive=True)
    index = io.StringIO()
    writer = csv.writer(index)
    writer.writerow([S.ID, S.STATUS, "file", S.AUDIO_SECONDS, S.TURNS, S.ERROR])
    written = skipped = errors = 0
    names = FileNames()
    columns = [S.ID, S.STATUS, S.ERROR, S.AUDIO, S.AUDIO_SECONDS, S.TURNS]
    for row in live_rows(layout, columns):
        if row[S.STATUS] != S.STATUS_OK:
            errors += 1
            writer.writerow([row[S.ID], row[S.STATUS], "", "", "", row[S.ERROR]])
            continue
        name = names(row[S.ID]) + ".flac"
        path = f"{base}/{name}"
        if not overwrite and fs.get_file_info(path).type == pafs.FileType.File:
            skipped += 1
        else:
            with fs.open_output_stream(path) as f:
                f.write(row[S.AUDIO][S.AUDIO_BYTES])
            written += 1
        writer.writerow([row[S.ID], row[S.STATUS], name, row[S.AUDIO_SECONDS], turns_cell(row.get(S.TURNS)), ""])
    with fs.open_output_stream(f"{base}/{EXPORT_INDEX_FILE}") as f:
        f.write(index.getvalue().encode("utf-8"))
    return ExportReport(directory=target, written=written, skipped=skipped, errors=errors)
