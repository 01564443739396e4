"""One audio file per exported row, named after its id (`schema.audio_file_stem`: plain ids as
they are, any other its safe characters plus a hash), and `files.csv` mapping each id to its
file, its split (with export.splits) and export.columns (by default text, audio_seconds, speaker,
asr_language; a list or struct column such as turns as JSON). A file is the row's audio as
stored: a dialogue row's of output.channels=per_speaker has a channel per voice.

Each Ray task writes its rows' files straight under their final names (each whole: a temporary
name renamed, or an object store's upload) and its part of the index as a piece; the index is
joined in plan order once every task is done. A name found taken by other bytes (an id that
differs from another only in letter case, on a case-insensitive filesystem) takes the hashed
form instead, so no row overwrites another's file.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
from typing import Optional

import pyarrow.fs as pafs

from actors import schema as S
from actors.files import atomic_open

from ..names import EXPORT_DIR, EXPORT_INDEX_FILE, EXPORT_RECORD
from .formats import Format, audio_bytes, selected

INDEX_PIECE = "index.csv"
FILE_COLUMN, SPLIT_COLUMN = "file", "split"
OWNED = re.compile(rf"[^/]+\.flac|{re.escape(EXPORT_INDEX_FILE)}")


def index_header(columns: list, named_split: bool) -> list:
    """files.csv's columns: id, the file, the split (with export.splits), the other columns."""
    return [S.ID, FILE_COLUMN, *([SPLIT_COLUMN] if named_split else []), *selected(columns, S.ID)]


def cell(value) -> str:
    """A value as a CSV cell: a list or struct (turns, quality_flags) as JSON, null as empty."""
    if value is None:
        return ""
    if isinstance(value, (list, dict)):
        return json.dumps(value, ensure_ascii=False)
    return str(value)


class FilesPiece:
    """Rows' audio under their file names (in `subdir` of the destination), and the piece's part
    of the index."""

    def __init__(self, folder: str, context, subdir: str = ""):
        self.destination, self.subdir = context.destination, subdir
        self.columns, self.context = selected(context.columns, S.ID), context
        self.open_index(folder)

    def open_index(self, folder: str) -> None:
        self.index = open(f"{folder}/{INDEX_PIECE}", "w", newline="", encoding="utf-8")
        self.rows = csv.writer(self.index)

    def _holds(self, path: str, data: bytes) -> Optional[bool]:
        """None: no file there; True: these very bytes (a rerun); False: another row's."""
        fs = self.destination.fs
        info = fs.get_file_info(path)
        if info.type != pafs.FileType.File:
            return None
        if info.size != len(data):
            return False
        with fs.open_input_stream(path, compression=None) as f:
            return f.read() == data

    def _write(self, path: str, data: bytes) -> None:
        if self.destination.local:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with atomic_open(path, "wb") as f:
                f.write(data)
        else:  # an object appears whole when its upload completes
            with self.destination.fs.open_output_stream(path, compression=None) as f:
                f.write(data)

    def place(self, row_id: str, data: bytes) -> str:
        """The file name the row's audio is under, written unless it is there already."""
        for stem in (S.audio_file_stem(row_id), S.audio_file_stem(row_id, with_hash=True)):
            name = f"{self.subdir}{stem}.flac"
            path = self.destination.path(name)
            held = self._holds(path, data)
            if held is None:
                self._write(path, data)
            if held is not False:
                return name
        raise FileExistsError(f"{self.destination.path(name)} holds another row's audio than {row_id!r}'s")

    def add(self, table) -> None:
        split = [self.context.split] if self.context.named_split else []
        values = table.select([S.ID, *self.columns]).to_pylist()
        for row, data in zip(values, audio_bytes(table).to_pylist()):
            name = self.place(row[S.ID], data)
            self.rows.writerow([row[S.ID], name, *split, *(cell(row[c]) for c in self.columns)])

    def close(self) -> None:
        self.index.close()


class FilesFormat(Format):
    name = "files"
    default_dir = EXPORT_DIR
    # no shards: a work unit of at most this many rows writes their files and its index piece
    shard_rows = 4_096
    shard_bytes = 1 << 62
    sharded = False
    library = None
    owned = OWNED
    record_name = EXPORT_RECORD

    @staticmethod
    def open_piece(folder: str, context) -> FilesPiece:
        return FilesPiece(folder, context)

    @staticmethod
    def final_names(number: int, total: int, split, prefix: str) -> dict:
        return {}  # the files are in place already; the index pieces are joined by finish

    @staticmethod
    def finish(destination, pieces: list, summary: dict) -> None:
        header = io.StringIO()
        csv.writer(header).writerow(index_header(summary["columns"], bool(summary["split_shares"])))
        join_pieces(destination, EXPORT_INDEX_FILE, header.getvalue().encode("utf-8"), pieces, INDEX_PIECE)


def join_pieces(destination, name: str, header: bytes, pieces: list, piece_file: str) -> None:
    """`name`: the header, then each piece's `piece_file` in plan order, streamed (never whole)."""
    with destination.open_output(name) as out:
        out.write(header)
        for piece in pieces:
            with destination.fs.open_input_stream(destination.staged(piece, piece_file), compression=None) as f:
                while chunk := f.read(1 << 20):
                    out.write(chunk)
