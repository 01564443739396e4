"""One audio file per exported row, named after its id (`schema.audio_file_stem`: plain ids as
they are, any other its safe characters plus a hash), and `files.csv` mapping each id to its
file, status, length and turns (who speaks when, as JSON). A file is the row's audio as stored:
a dialogue row's of output.channels=per_speaker has a channel per voice.

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
import re
from typing import Optional

import pyarrow.fs as pafs

from actors import schema as S
from actors.files import atomic_open

from ..names import EXPORT_DIR, EXPORT_INDEX_FILE, EXPORT_RECORD
from .formats import Format, audio_bytes

INDEX_PIECE = "index.csv"
INDEX_HEADER = [S.ID, S.STATUS, "file", S.AUDIO_SECONDS, S.TURNS]
OWNED = re.compile(rf"[^/]+\.flac|{re.escape(EXPORT_INDEX_FILE)}")


def turns_cell(turns: Optional[list]) -> str:
    """A row's turns for files.csv: a JSON list of {speaker, text, start_s, end_s,
    speaker_similarity} (empty for output written before turns existed)."""
    return json.dumps(turns, ensure_ascii=False) if turns else ""


class FilesPiece:
    def __init__(self, folder: str, destination):
        self.destination = destination
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
            with atomic_open(path, "wb") as f:
                f.write(data)
        else:  # an object appears whole when its upload completes
            with self.destination.fs.open_output_stream(path, compression=None) as f:
                f.write(data)

    def place(self, row_id: str, data: bytes) -> str:
        """The file name the row's audio is under, written unless it is there already."""
        for stem in (S.audio_file_stem(row_id), S.audio_file_stem(row_id, with_hash=True)):
            name = f"{stem}.flac"
            path = self.destination.path(name)
            held = self._holds(path, data)
            if held is None:
                self._write(path, data)
            if held is not False:
                return name
        raise FileExistsError(f"{self.destination.path(name)} holds another row's audio than {row_id!r}'s")

    def add(self, table) -> None:
        columns = table.select([S.ID, S.STATUS, S.AUDIO_SECONDS, S.TURNS]).to_pylist()
        for row, data in zip(columns, audio_bytes(table).to_pylist()):
            name = self.place(row[S.ID], data)
            self.rows.writerow([row[S.ID], row[S.STATUS], name, row[S.AUDIO_SECONDS], turns_cell(row[S.TURNS])])

    def close(self) -> None:
        self.index.close()


class FilesFormat(Format):
    name = "files"
    default_dir = EXPORT_DIR
    # no shards: a work unit of at most this many rows writes their files and its index piece
    shard_rows = 4_096
    shard_bytes = 1 << 62
    library = None
    columns = [S.ID, S.STATUS, S.AUDIO, S.AUDIO_SECONDS, S.TURNS]
    owned = OWNED
    record_name = EXPORT_RECORD

    @staticmethod
    def open_piece(folder: str, destination) -> FilesPiece:
        return FilesPiece(folder, destination)

    @staticmethod
    def final_names(number: int, total: int, prefix: str) -> dict:
        return {}  # the files are in place already; the index pieces are joined by finish

    @staticmethod
    def finish(destination, pieces: list, summary: dict) -> None:
        """files.csv: the header, then each piece's rows in plan order, streamed (never whole)."""
        with destination.open_output(EXPORT_INDEX_FILE) as out:
            header = io.StringIO()
            csv.writer(header).writerow(INDEX_HEADER)
            out.write(header.getvalue().encode("utf-8"))
            for piece in pieces:
                with destination.fs.open_input_stream(destination.staged(piece, INDEX_PIECE), compression=None) as f:
                    while chunk := f.read(1 << 20):
                        out.write(chunk)
