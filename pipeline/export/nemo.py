"""NeMo: the rows' audio as files under `audio/` (named as the files export names them) and a
JSON-lines manifest per split, `<split>_manifest.json` (`train_manifest.json` without
export.splits), each line NeMo's speech-dataset entry: `audio_filepath` (relative to the
manifest's directory, which NeMo resolves against it), `duration` (seconds, from the FLAC's own
header: samples over rate), `text`, and the other export.columns under their output names
(speaker, asr_language, ...; NeMo reads the keys it knows and passes the rest along).

The files are written straight under their final names by each Ray task, as the files export
does; each task's manifest lines are a piece, joined per split in plan order at the end.
"""

from __future__ import annotations

import io
import re

import soundfile as sf

from actors import schema as S

from .files import FilesFormat, FilesPiece, join_pieces
from .formats import audio_bytes, metadata_json, metadata_rows, selected

AUDIO_DIR = "audio/"
MANIFEST_PIECE = "manifest.jsonl"
MANIFEST = "{split}_manifest.json"
AUDIO_FILEPATH, DURATION = "audio_filepath", "duration"
OWNED = re.compile(r"audio/[^/]+\.flac|[A-Za-z0-9][A-Za-z0-9_]*_manifest\.json")


def flac_seconds(data: bytes) -> float:
    """The audio's length by its own header (samples / rate)."""
    info = sf.info(io.BytesIO(data))
    return info.frames / info.samplerate


class NemoPiece(FilesPiece):
    """Audio files under audio/ and the piece's manifest lines."""

    def __init__(self, folder: str, context):
        super().__init__(folder, context, subdir=AUDIO_DIR)
        self.extra = selected(context.columns, S.ID, S.TEXT, S.AUDIO_SECONDS)

    def open_index(self, folder: str) -> None:
        self.lines = open(f"{folder}/{MANIFEST_PIECE}", "wb")

    def add(self, table) -> None:
        for row, data in zip(metadata_rows(table, [S.ID, S.TEXT, *self.extra]), audio_bytes(table).to_pylist()):
            entry = {AUDIO_FILEPATH: self.place(row[S.ID], data), DURATION: flac_seconds(data), S.TEXT: row[S.TEXT]}
            entry.update({S.ID: row[S.ID], **{c: row[c] for c in self.extra}})
            self.lines.write(metadata_json(entry) + b"\n")

    def close(self) -> None:
        self.lines.close()


class NemoFormat(FilesFormat):
    """The files export's units and bounds (a file per row), with NeMo's names and manifests."""

    name = "nemo"
    default_dir = "nemo"
    owned = OWNED

    @staticmethod
    def open_piece(folder: str, context) -> NemoPiece:
        return NemoPiece(folder, context)

    @staticmethod
    def finish(destination, pieces: list, summary: dict) -> None:
        """One manifest per split, its pieces' lines in plan order; `manifests` in the summary."""
        manifests = {}
        for split in summary["splits"]:
            name = MANIFEST.format(split=split)
            join_pieces(destination, name, b"", [p for p in pieces if p["split"] == split], MANIFEST_PIECE)
            manifests[split] = f"{destination.location}/{name}"
        summary["manifests"] = manifests
