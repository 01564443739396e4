"""report.html's reading (pipeline/report/page.py): a run's output files, local or on an object
store, leniently -- a torn file or a foreign column type is a note on the page, not a failure
-- as the metadata columns of every row up to pipeline/report/sample.py's SAMPLE_ROWS (an even
sample above it), and the audio bytes of the few rows the page plays."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from actors import schema as S

from ..location import open_location
from ..names import SUMMARY_FILE, base_name, is_part, is_shard
from ..output.layout import OutputLayout
from . import metrics
from . import sample as report_sample
from .markup import MAX_EMBED_BYTES

_HEAVY = (S.AUDIO, S.CODES)


_FILE_COL = "__report_file"


_ROW_COL = "__report_row"


@dataclass
class ReportRun:
    layout: OutputLayout  # the output directory (its `location` names it on the page)
    files: list[str]  # paths inside layout.fs
    table: pa.Table  # metadata columns of every row, normalised for the metrics (+ file/row index)
    present: set[str]  # the columns the files have
    summary: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    rows_in_files: int = 0  # every row, read or not (pipeline/report/sample.py)

    @property
    def output_dir(self) -> str:
        return self.layout.location

    def open(self, index: int) -> pq.ParquetFile:
        return pq.ParquetFile(self.layout.fs.open_input_file(self.files[index]))

    def name(self, index: int) -> str:
        """A file's path below the output directory, for notes."""
        return self.files[index][len(self.layout.base) + 1 :]

    @property
    def n(self) -> int:
        return self.table.num_rows

    @property
    def sampled(self) -> bool:
        return self.n < self.rows_in_files

    def has(self, name: str) -> bool:
        return name in self.present

    def strings(self, name: str) -> list[Optional[str]]:
        return self.table.column(name).to_pylist()

    def floats(self, name: str) -> np.ndarray:
        """A float64 array per row (NaN for null or unreadable values), for plotting."""
        return pc.cast(self.table.column(name), pa.float64()).to_numpy().astype(np.float64, copy=True)

    @property
    def ok(self) -> np.ndarray:
        return self.table.column(metrics.OK).to_numpy()


def _data_files(layout: OutputLayout, notes: list[str]) -> list[str]:
    """chorus's live files (pipeline/output/listing.py: the shards, the parts no shard absorbed,
    the rejected part), and any other Parquet file below data/ (a foreign layout is read too)."""
    selector = pafs.FileSelector(layout.data_dir, recursive=True, allow_not_found=True)
    found = [
        f.path
        for f in layout.fs.get_file_info(selector)
        if f.type == pafs.FileType.File and f.base_name.endswith(".parquet") and not f.base_name.startswith(".")
    ]

    def chorus_named(path: str) -> bool:
        name = base_name(path)
        return path == f"{layout.data_dir}/{name}" and (is_shard(name) or is_part(name))

    try:
        live = layout.live_files()
    except Exception as exc:  # a torn shard footer: read every file rather than nothing
        notes.append(f"could not tell which files are current ({exc}); read every Parquet file under data/")
        return sorted(found)
    return sorted(set(live) | {p for p in found if not chorus_named(p)})


def _unify(tables: list[pa.Table], notes: list[str]) -> pa.Table:
    try:
        return pa.concat_tables(tables, promote_options="permissive")
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        pass
    # files disagree on a column's type in a way Arrow cannot promote: read those as text
    types: dict[str, set] = {}
    for t in tables:
        for f in t.schema:
            types.setdefault(f.name, set()).add(f.type)
    clash = {name for name, ts in types.items() if len({str(t) for t in ts if not pa.types.is_null(t)}) > 1}
    notes.append("columns with different types across files were read as text: " + ", ".join(sorted(clash)))
    fixed = []
    for t in tables:
        for name in clash & set(t.column_names):
            i = t.column_names.index(name)
            try:
                t = t.set_column(i, name, pc.cast(t.column(i), pa.string()))
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                t = t.set_column(
                    i, name, pa.array([None if v is None else str(v) for v in t.column(i).to_pylist()], pa.string())
                )
        fixed.append(t)
    return pa.concat_tables(fixed, promote_options="permissive")


def read_run(location: str) -> ReportRun:
    """The output directory at `location` (a local path or a URI), read for its page."""
    layout = OutputLayout(str(location))
    notes: list[str] = []
    run = ReportRun(layout, _data_files(layout, notes), pa.table({}), set(), notes=notes)
    sources = {}
    for index in range(len(run.files)):
        try:
            sources[index] = run.open(index)
        except Exception as exc:  # a torn or foreign file must not sink the whole report
            notes.append(f"skipped unreadable file {run.name(index)}: {exc}")
    sizes = [sources[i].metadata.num_rows if i in sources else 0 for i in range(len(run.files))]
    table = _read_rows(run, sources, sizes)
    run.table, run.present, run.rows_in_files = metrics.normalise(table), set(table.column_names), sum(sizes)
    run.summary = _read_summary(layout, notes)
    if run.sampled:
        counted = report_sample.summary_totals(run.summary, run.rows_in_files)
        totals = f"the totals are {SUMMARY_FILE}'s" if counted else "so are the totals"
        notes.append(
            f"{sum(sizes):,} rows: the plots and tables show an evenly spread sample of {run.n:,} of them; {totals}"
        )
    return run


def _read_rows(run: ReportRun, sources: dict[int, pq.ParquetFile], sizes: list[int]) -> pa.Table:
    """The metadata columns of every row up to the sample's size (an even sample above it),
    each with its file and row index."""
    takes = report_sample.quotas(sizes)
    tables = []
    for index, source in sources.items():
        try:
            columns = [n for n in source.schema_arrow.names if n not in _HEAVY]
            wanted = report_sample.positions(sizes[index], takes[index])
            t, rows = report_sample.read_rows(source, columns, wanted)
        except Exception as exc:
            run.notes.append(f"skipped unreadable file {run.name(index)}: {exc}")
            continue
        t = t.append_column(_FILE_COL, pa.array(np.full(t.num_rows, index, dtype=np.int32)))
        tables.append(t.append_column(_ROW_COL, pa.array(rows)))
    if tables:
        return _unify(tables, run.notes)
    run.notes.append("no Parquet files under data/" if not run.files else "no readable Parquet files under data/")
    return pa.table({_FILE_COL: pa.array([], pa.int32()), _ROW_COL: pa.array([], pa.int64())})


def _read_summary(layout: OutputLayout, notes: list[str]) -> dict[str, Any]:
    try:
        text = layout.read_text(SUMMARY_FILE)
        loaded = json.loads(text) if text is not None else {}
    except (OSError, ValueError) as exc:
        notes.append(f"{SUMMARY_FILE} could not be read: {exc}")
        return {}
    if isinstance(loaded, dict):
        return loaded
    notes.append(f"{SUMMARY_FILE} is not a JSON object; ignored")
    return {}


def read_audio(run: ReportRun, picks: Sequence[int]) -> dict[int, dict]:
    """{table row -> {"bytes": b|None, "path": str|None}} for the picked rows, reading only
    the row groups that hold them."""
    out: dict[int, dict] = {}
    if not picks:
        return out
    file_idx = run.table.column(_FILE_COL).to_numpy()
    row_idx = run.table.column(_ROW_COL).to_numpy()
    by_file: dict[int, list[int]] = {}
    for i in picks:
        by_file.setdefault(int(file_idx[i]), []).append(i)
    for f, rows in by_file.items():
        try:
            pf = run.open(f)
            if S.AUDIO not in pf.schema_arrow.names:
                continue
            starts = np.cumsum([0] + [pf.metadata.row_group(g).num_rows for g in range(pf.num_row_groups)])
            wanted: dict[int, list[int]] = {}
            for i in rows:
                g = int(np.searchsorted(starts, row_idx[i], side="right") - 1)
                wanted.setdefault(g, []).append(i)
            for g, members in wanted.items():
                col = pf.read_row_group(g, columns=[S.AUDIO]).column(0)
                for i in members:
                    out[i] = _audio_value(col[int(row_idx[i] - starts[g])].as_py())
        except Exception as exc:
            run.notes.append(f"audio could not be read from {run.name(f)}: {exc}")
    return out


def read_references(run: ReportRun, picks: Sequence[int]) -> dict[int, dict]:
    """{table row -> {"bytes": b}} of the reference clips the picked rows name (S.REFERENCE:
    a local path or a URI), each read once and only up to the page's embedding limit, so the
    page plays them wherever it is opened; a clip that cannot be read is noted, not fatal."""
    if S.REFERENCE not in run.table.column_names:
        return {}
    named = run.table.column(S.REFERENCE).to_pylist()
    clips: dict[str, dict] = {}
    out = {}
    for i in picks:
        source = named[i]
        if not source:
            continue
        if source not in clips:
            clips[source] = _read_clip(run, source)
        out[i] = clips[source]
    return out


def _read_clip(run: ReportRun, source: str) -> dict:
    try:
        fs, path = open_location(source)
        size = fs.get_file_info(path).size or 0
        if size > MAX_EMBED_BYTES:
            return {"bytes": None, "path": None}
        with fs.open_input_file(path) as f:
            return {"bytes": f.read(), "path": None}
    except Exception as exc:
        run.notes.append(f"reference clip {source} could not be read: {exc}")
        return {"bytes": None, "path": None}


def _audio_value(v: Any) -> dict:
    if isinstance(v, dict):
        return {"bytes": v.get(S.AUDIO_BYTES), "path": v.get(S.AUDIO_PATH)}
    if isinstance(v, (bytes, bytearray)):
        return {"bytes": bytes(v), "path": None}
    if isinstance(v, str):
        return {"bytes": None, "path": v}
    return {"bytes": None, "path": None}
