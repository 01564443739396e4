"""The export's work units, from the live files' footers alone: runs of row groups (or of parts
of one, for small shards) holding about one shard's rows and audio bytes before filtering, in
the live files' order. O(row groups) on the driver, no row read. The same live files and bounds
always give the same units, so a rerun of a killed export finds its finished units again.

The rejected part is left out: it holds only the rows the driver refused (status error, no
audio), which no export.status selects.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pyarrow.parquet as pq

from actors import schema as S

from ..names import base_name, is_rejected_part
from ..output.layout import OutputLayout
from .formats import Bounds

AUDIO_BYTES_COLUMN = f"{S.AUDIO}.{S.AUDIO_BYTES}"


@dataclass
class ExportPlan:
    units: list = field(default_factory=list)  # each a list of slices {path, row_group, start, stop}
    files: list = field(default_factory=list)  # [base name, size] of every file read
    rows: int = 0  # rows in those files (before filtering)
    unit_rows: list = field(default_factory=list)  # rows each unit reads


def _audio_bytes(group) -> int:
    for i in range(group.num_columns):
        column = group.column(i)
        if column.path_in_schema == AUDIO_BYTES_COLUMN:
            return column.total_uncompressed_size
    return 0


def _chunks(rows: int, audio: int, bounds: Bounds):
    """A row group cut into runs of rows each within the bounds by its mean row size:
    (start, stop, estimated audio bytes)."""
    per_row = audio / rows
    step = bounds.rows if per_row <= 0 else max(1, min(bounds.rows, math.floor(bounds.audio_bytes / per_row)))
    for start in range(0, rows, step):
        stop = min(rows, start + step)
        yield start, stop, int(per_row * (stop - start))


class _Packer:
    def __init__(self, plan: ExportPlan, bounds: Bounds):
        self.plan, self.bounds = plan, bounds
        self.unit: list = []
        self.rows = self.audio = 0

    def add(self, piece: dict, rows: int, audio: int) -> None:
        if self.unit and (self.rows + rows > self.bounds.rows or self.audio + audio > self.bounds.audio_bytes):
            self.close()
        self.unit.append(piece)
        self.rows += rows
        self.audio += audio

    def close(self) -> None:
        if self.unit:
            self.plan.units.append(self.unit)
            self.plan.unit_rows.append(self.rows)
        self.unit, self.rows, self.audio = [], 0, 0


def plan_units(layout: OutputLayout, bounds: Bounds) -> ExportPlan:
    plan = ExportPlan()
    packer = _Packer(plan, bounds)
    for path in layout.live_files():
        if is_rejected_part(path):
            continue
        metadata = pq.read_metadata(path, filesystem=layout.fs)
        plan.files.append([base_name(path), layout.fs.get_file_info(path).size])
        plan.rows += metadata.num_rows
        for g in range(metadata.num_row_groups):
            group = metadata.row_group(g)
            if not group.num_rows:
                continue
            for start, stop, audio in _chunks(group.num_rows, _audio_bytes(group), bounds):
                packer.add({"path": path, "row_group": g, "start": start, "stop": stop}, stop - start, audio)
    packer.close()
    return plan
