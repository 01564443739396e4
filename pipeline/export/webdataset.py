"""WebDataset: tar shards `<prefix>-000000.tar`, ... (brace notation reads them all:
`<prefix>-{000000..000041}.tar`; with export.splits each split's own, `<split>-000000.tar`),
each sample two members in a row, `<key>.flac` (the row's audio as stored: mono, or a channel
per voice) and `<key>.json` (export.columns: by default id, text, audio_seconds, speaker,
asr_language; any other output column on request). Keys are `schema.sample_key`: no dot
(WebDataset splits a member name at its first dot into key and extension), safe in a tar, and
unique when ids are.

Written with the standard library's tarfile, not Ray Data's `write_webdataset`: that writes a
file per Ray block under a name of its own, in place (a killed write leaves a torn tar under
its final name) and with block bounds rather than shard bounds. Headers carry fixed owner,
mode and time, so a shard written twice is the same bytes.
"""

from __future__ import annotations

import io
import re
import tarfile

from actors import schema as S

from ..names import EXPORT_RECORD
from .formats import Format, audio_bytes, metadata_json, metadata_rows

SHARD_FILE = "shard.tar"
_MEMBER_MODE = 0o444
OWNED = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*-\d{6}\.tar")


class TarPiece:
    def __init__(self, folder: str, columns: list):
        self.columns = columns
        self.file = open(f"{folder}/{SHARD_FILE}", "wb")
        self.tar = tarfile.open(fileobj=self.file, mode="w", format=tarfile.PAX_FORMAT)

    def _member(self, name: str, data: bytes) -> None:
        info = tarfile.TarInfo(name)
        info.size, info.mode, info.mtime = len(data), _MEMBER_MODE, 0
        self.tar.addfile(info, io.BytesIO(data))

    def add(self, table) -> None:
        audio = audio_bytes(table).to_pylist()
        for row, flac in zip(metadata_rows(table, self.columns), audio):
            key = S.sample_key(row[S.ID])
            self._member(f"{key}.flac", flac)
            self._member(f"{key}.json", metadata_json(row))

    def close(self) -> None:
        self.tar.close()
        self.file.close()


class WebDatasetFormat(Format):
    name = "webdataset"
    default_dir = "webdataset"
    # the WebDataset docs' shards are ~1 GB (OpenImages: 554 of about 1 GB); 100,000 samples is
    # its ShardWriter's own maxcount
    shard_rows = 100_000
    shard_bytes = 1_000_000_000
    library = None
    owned = OWNED
    record_name = EXPORT_RECORD

    @staticmethod
    def open_piece(folder: str, context) -> TarPiece:
        return TarPiece(folder, context.columns)

    @staticmethod
    def final_names(number: int, total: int, split, prefix: str) -> dict:
        return {SHARD_FILE: f"{split or prefix}-{number:06d}.tar"}

    @staticmethod
    def finish(destination, pieces: list, summary: dict) -> None:
        """The brace URL of the shards (with export.splits, {split: its shards' URL})."""
        if not summary["split_shares"]:
            last = summary["shards"] - 1
            summary["urls"] = (
                f"{destination.location}/{summary['prefix']}-{{000000..{last:06d}}}.tar" if last >= 0 else None
            )
            return
        summary["urls"] = {
            split: f"{destination.location}/{split}-{{000000..{counts['shards'] - 1:06d}}}.tar"
            for split, counts in summary["splits"].items()
        }
