"""One work unit, in a Ray task: read its slices of the live files (only the columns the export
needs, one row group at a time), keep the rows the filters keep, route each to its split
(export.splits, by a hash of its id), cut each split's rows into pieces within the shard bounds,
stage each piece whole, and commit the unit's record -- after its pieces, so a unit with a
record is whole. A unit found committed (a rerun of a killed export) is not written again.
Memory: one row group plus the piece being written per split.
"""

from __future__ import annotations

import os
import socket
import time
from collections import Counter

import pyarrow.compute as pc
import pyarrow.parquet as pq

from actors import schema as S
from actors.storage import retries_spent

from ..location import open_location
from ..output.reading import conform
from . import filters, formats
from .destination import Destination
from .formats import Bounds, Cutter, PieceContext
from .splits import SplitRule


class _StagedPiece:
    """A format's piece writer in a folder that moves into staging once the piece is closed."""

    def __init__(self, fmt, destination: Destination, unit: int, piece: int, context: PieceContext):
        self.context = destination.piece_folder(unit, piece)
        self.writer = fmt.open_piece(self.context.__enter__(), context)
        self.open = True

    def add(self, table) -> None:
        self.writer.add(table)

    def close(self) -> None:
        self.writer.close()
        self.context.__exit__(None, None, None)
        self.open = False

    def abort(self, error: BaseException) -> None:
        self.context.__exit__(type(error), error, error.__traceback__)
        self.open = False


def read_slices(location: str, slices: list, columns: list):
    """Each slice's rows, conformed to OUTPUT_SCHEMA's types; a row group read once for the
    adjacent slices of it."""
    fs, _ = open_location(location)
    opened = {}
    cached = (None, None)
    for piece in slices:
        path = piece["path"]
        if path not in opened:
            opened.clear()
            opened[path] = pq.ParquetFile(fs.open_input_file(path))
        source = opened[path]
        key = (path, piece["row_group"])
        if cached[0] != key:
            present = set(source.schema_arrow.names)
            group = source.read_row_group(piece["row_group"], columns=[c for c in columns if c in present])
            cached = (key, group)
        yield conform(cached[1].slice(piece["start"], piece["stop"] - piece["start"]), columns)


def _sample_rate(table):
    rates = pc.drop_null(table.column(S.SAMPLE_RATE))
    return int(rates[0].as_py()) if len(rates) else None


def by_split(table, rule: SplitRule):
    """(split, its rows in order) for each split with rows in `table`, in export.splits' order."""
    import numpy as np

    names = np.array([rule.of(i) for i in table.column(S.ID).to_pylist()], dtype=object)
    for split in rule.names:
        chosen = names == split
        if chosen.any():
            yield split, table.filter(chosen)


class _UnitPieces:
    """A unit's pieces across its splits: one Cutter per split, the pieces numbered in the order
    they open (their staging folders'), each recorded with its split."""

    def __init__(self, fmt, destination: Destination, unit: int, job: dict):
        self.fmt, self.destination, self.unit, self.job = fmt, destination, unit, job
        self.staged: list[_StagedPiece] = []
        self.numbers: dict[str, list[int]] = {}
        self.cutters: dict[str, Cutter] = {}

    def cutter(self, split: str) -> Cutter:
        if split not in self.cutters:
            self.numbers[split] = []
            self.cutters[split] = Cutter(Bounds(**self.job["bounds"]), lambda k, split=split: self._open(split))
        return self.cutters[split]

    def _open(self, split: str) -> _StagedPiece:
        number = len(self.staged)
        context = PieceContext(self.destination, self.job["columns"], split, bool(self.job["splits"]))
        self.staged.append(_StagedPiece(self.fmt, self.destination, self.unit, number, context))
        self.numbers[split].append(number)
        return self.staged[-1]

    def close(self) -> list[dict]:
        pieces = []
        for split, cutter in self.cutters.items():
            for number, piece in zip(self.numbers[split], cutter.close()):
                pieces.append({"unit": self.unit, "piece": number, "split": split, **piece})
        return sorted(pieces, key=lambda p: p["piece"])

    def abort(self, error: BaseException) -> None:
        for piece in self.staged:
            if piece.open:
                piece.abort(error)


def write_unit(unit: int, slices: list, job: dict) -> dict:
    """Write one unit's pieces and commit its record (returned); `job` is job.py's plain dict."""
    fmt = formats.get(job["format"])
    destination = Destination(job["dest"], fmt.record_name)
    committed = destination.unit_record(unit)
    if committed is not None:
        return {**committed, "reused": True}
    began, retried = time.monotonic(), retries_spent()
    columns = list(dict.fromkeys([*job["columns"], *filters.COLUMNS, S.SAMPLE_RATE, S.AUDIO_SECONDS]))
    removed, read, rate = Counter(), 0, None
    rule = SplitRule(job["splits"])
    pieces = _UnitPieces(fmt, destination, unit, job)
    try:
        for table in read_slices(job["source"], slices, columns):
            read += table.num_rows
            kept = filters.keep(table, job["filters"], removed)
            rate = rate or (_sample_rate(kept) if kept.num_rows else None)
            for split, rows in by_split(kept, rule):
                pieces.cutter(split).add(rows)
        written = pieces.close()
    except BaseException as error:
        pieces.abort(error)
        raise
    record = {
        "unit": unit,
        "read": read,
        "removed": {k: v for k, v in removed.items() if v},
        "pieces": written,
        "sample_rate": rate,
        "worker": f"{socket.gethostname()}:{os.getpid()}",
        "seconds": round(time.monotonic() - began, 3),
        "store_retries": retries_spent() - retried,
    }
    destination.commit_unit(unit, record)
    return {**record, "reused": False}
