"""What the export formats share: the registry (`get`), each row's metadata as JSON, and the
cutting of a unit's rows into pieces of at most `shard_rows` rows and `shard_bytes` of audio.

A format is a class with:
  name, default_dir        export.format and the folder under output.dir when export.dir is null
  shard_rows, shard_bytes  its recommended bounds (export.shard_rows / shard_bytes override)
  sharded                  whether it writes shards (False: a file per row and an index)
  library                  the package its writer needs (None: pyarrow and the standard library)
  record_name              the export's record in the destination
  open_piece(folder, context) -> a piece writer: add(table), close() (files under `folder`);
                           `context` (PieceContext) names the destination, the columns its
                           rows carry (export.columns, id and audio first) and its split
  final_names(number, total, split, prefix) -> {staged file name: path in the destination}; the
                           piece's number and count within its split (split None: no export.splits)
  owns(path)               a file the format writes (what export.overwrite may delete)
  finish(destination, pieces, summary)  the files written once every piece is published

A piece's rows come with more columns than it writes (the filters', sample_rate, audio_seconds):
a writer picks `columns` (`selected`).
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import math
import re
from dataclasses import dataclass
from typing import Any, Optional

import pyarrow as pa
import pyarrow.compute as pc

from actors import schema as S
from actors.errors import ConfigError

# format name -> "module:Class" under pipeline.export, imported only when asked for (lhotse's
# writer loads torch: never in the driver)
_REGISTRY = {
    "files": "files:FilesFormat",
    "webdataset": "webdataset:WebDatasetFormat",
    "lhotse": "lhotse_shar:LhotseFormat",
    "hf": "hf:HubParquetFormat",
    "nemo": "nemo:NemoFormat",
}
INSTALL_HINT = "pip install 'chorus-tts[export]'"


class Format:
    """What every format shares: `owns` by its `owned` pattern, no last files unless it has some."""

    owned: re.Pattern
    sharded = True

    @classmethod
    def owns(cls, path: str) -> bool:
        return bool(cls.owned.fullmatch(path))

    @staticmethod
    def finish(destination, pieces: list, summary: dict) -> None:
        pass


def get(name: str):
    """The format class of export.format `name`."""
    module, cls = _REGISTRY[name].split(":")
    return getattr(importlib.import_module(f"{__package__}.{module}"), cls)


def check_installed(fmt) -> None:
    """A clear error, before any work, when the format's writer needs a package that is absent."""
    if fmt.library and importlib.util.find_spec(fmt.library) is None:
        raise ConfigError(
            f"export.format={fmt.name} writes with the {fmt.library} package, which is not installed: "
            f"{INSTALL_HINT} (on a cluster, on every node)"
        )


@dataclass(frozen=True)
class PieceContext:
    destination: Any  # destination.Destination
    columns: list  # the columns each row carries (id and audio first)
    split: str  # the piece's split: one of export.splits, or "train" without them
    named_split: bool  # whether export.splits named it (else no split is written anywhere)


@dataclass(frozen=True)
class Bounds:
    rows: int
    audio_bytes: int

    @classmethod
    def of(cls, fmt, rows: Optional[int], audio_bytes: Optional[int]) -> Bounds:
        """export.shard_rows / shard_bytes, or the format's own where null."""
        return cls(int(rows or fmt.shard_rows), int(audio_bytes or fmt.shard_bytes))


# ---- per-row metadata -------------------------------------------------------------------------


def _finite(value):
    """JSON has no NaN or infinity: such a float (in any nesting) becomes null."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def selected(columns: list, *leave_out: str) -> list:
    """The export's columns, but those a format stores its own way (the audio, always)."""
    return [c for c in columns if c not in (S.AUDIO, *leave_out)]


def metadata_rows(table: pa.Table, columns: list) -> list[dict]:
    """Each row's exported columns (audio aside), JSON-ready."""
    return [_finite(row) for row in table.select(selected(columns)).to_pylist()]


def metadata_json(row: dict) -> bytes:
    return json.dumps(row, ensure_ascii=False, allow_nan=False).encode("utf-8")


def audio_bytes(table: pa.Table) -> pa.Array:
    return pc.struct_field(table.column(S.AUDIO), S.AUDIO_BYTES)


# ---- cutting a unit's rows into pieces ----------------------------------------------------------


class Cutter:
    """Feeds a unit's kept rows, in order, into pieces of at most `bounds` (a single row over
    the byte bound is a piece of its own), opening each piece through `open_piece(k)`."""

    def __init__(self, bounds: Bounds, open_piece):
        self.bounds, self.open_piece = bounds, open_piece
        self.pieces: list[dict] = []  # per piece: rows, audio_bytes, audio_seconds
        self.writer = None

    def _start(self) -> None:
        self.writer = self.open_piece(len(self.pieces))
        self.pieces.append({"rows": 0, "audio_bytes": 0, "audio_seconds": 0.0})

    def _fits(self, size: int) -> bool:
        piece = self.pieces[-1]
        if piece["rows"] == 0:
            return True
        return piece["rows"] < self.bounds.rows and piece["audio_bytes"] + size <= self.bounds.audio_bytes

    def add(self, table: pa.Table) -> None:
        sizes = pc.binary_length(audio_bytes(table)).fill_null(0).to_pylist()
        seconds = table.column(S.AUDIO_SECONDS).fill_null(0.0).to_pylist()
        start = 0
        for i, size in enumerate(sizes):
            if self.writer is None or not self._fits(size):
                self._flush(table.slice(start, i - start))
                self.close()
                self._start()
                start = i
            piece = self.pieces[-1]
            piece["rows"] += 1
            piece["audio_bytes"] += size
            piece["audio_seconds"] += seconds[i]
        self._flush(table.slice(start))

    def _flush(self, rows: pa.Table) -> None:
        if rows.num_rows and self.writer is not None:
            self.writer.add(rows)

    def close(self) -> list[dict]:
        if self.writer is not None:
            self.writer.close()
            self.writer = None
        return self.pieces
