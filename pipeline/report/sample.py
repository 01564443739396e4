"""Which rows report.html reads (pipeline/report/page.py): every row of an output up to
SAMPLE_ROWS, else an evenly spread sample of that many, so that the page's memory stays
bounded whatever the job's size. Each file gives rows in proportion to its own, at evenly
spaced positions, read one row group at a time; the page's totals then come from
summary.json, which counts every row (pipeline/report/summary.py)."""

from __future__ import annotations

import math
from typing import Optional

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

SAMPLE_ROWS = 200_000  # rows a page reads at most


def quotas(sizes: list[int], budget: Optional[int] = None) -> list[int]:
    """Rows to read of each file: all of them when the files hold at most `budget` rows, else
    a share in proportion to each file's rows (at least one of a file with rows), summing to
    about `budget`."""
    total, budget = sum(sizes), SAMPLE_ROWS if budget is None else budget
    if total <= budget:
        return list(sizes)
    return [min(n, max(1, round(n * budget / total))) if n else 0 for n in sizes]


def positions(rows: int, take: int) -> np.ndarray:
    """`take` evenly spaced row positions of a file of `rows` rows (first and last included)."""
    if take >= rows:
        return np.arange(rows, dtype=np.int64)
    return np.unique(np.linspace(0, rows - 1, take).round().astype(np.int64))


def read_rows(source: pq.ParquetFile, columns: list[str], wanted: np.ndarray) -> tuple[pa.Table, np.ndarray]:
    """The rows at `wanted` (sorted positions) of `columns`, one row group in memory at a
    time; returns them with their positions."""
    if len(wanted) == source.metadata.num_rows:
        return source.read(columns=columns), wanted
    pieces, start = [], 0
    for g in range(source.num_row_groups):
        end = start + source.metadata.row_group(g).num_rows
        lo, hi = np.searchsorted(wanted, [start, end])
        if hi > lo:
            group = source.read_row_group(g, columns=columns)
            pieces.append(group.take(pa.array(wanted[lo:hi] - start)))
        start = end
    table = pa.concat_tables(pieces) if pieces else source.schema_arrow.empty_table().select(columns)
    return table, wanted


def _number(summary: dict, key: str) -> Optional[float]:
    value = summary.get(key)
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def summary_totals(summary: dict, rows_in_files: int) -> dict:
    """A sampled page's headline counts and speeds (metrics.headline's keys): summary.json's,
    which counts every row, when it counts these files' rows; {} otherwise (the sample's own
    figures stand, and the page says so)."""
    if _number(summary, "rows_total") != rows_in_files:
        return {}
    wall, audio_s = _number(summary, "wall_s"), _number(summary, "audio_seconds")
    counts = {key: _number(summary, name) for key, name in (("rows_ok", "rows_ok"), ("rows_error", "rows_error"))}
    figures = {
        "rows": rows_in_files,
        **{key: int(v) for key, v in counts.items() if v is not None},
        "audio_s": audio_s,
        "rows_per_s": rows_in_files / wall if wall else None,
        "frames_per_s": _number(summary, "frames_per_s"),  # this run's, as summary.json has it
        "rtf": wall / audio_s if wall and audio_s else None,
    }
    return {key: v for key, v in figures.items() if v is not None}
