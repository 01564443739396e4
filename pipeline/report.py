"""`report.html`: one self-contained page describing a finished (or partial) run.

    python -m pipeline.report OUTPUT_DIR [--title T] [--max-audio-rows N] [--bench bench.json]

Reads the run's output directory (`OUTPUT_DIR/data/**/*.parquet`, the columns of
actors/schema.py, and `OUTPUT_DIR/summary.json` when present) and writes
`OUTPUT_DIR/report.html` atomically:
summary figures, plots (throughput over time, latency / RTF / duration histograms, stop
reasons), the most common errors, per-actor figures, and a table of sample rows with
playable audio. Plots are inline SVG and audio is embedded as `data:` URIs (or linked by
relative path when the run wrote files), so the page works offline as one file.

The module is reading (the files, leniently: a torn file or a foreign column type is a note,
not a failure), the figures (pipeline/metrics.py, shared with summary.json and the
benchmark), and rendering: one small function per page section.

Layering: the driver side never imports torch — this module uses pyarrow, numpy and
matplotlib only (matplotlib through its object API, no pyplot, so no GUI backend is chosen
and no global state is touched). Only metadata columns are read, of every row up to
pipeline/report_sample.py's SAMPLE_ROWS and of an evenly spread sample of that many above it
(the page says so, and its totals are then summary.json's); audio bytes are read for the few
sample rows only, so a report of a multi-hour run stays cheap.
"""

from __future__ import annotations

import argparse
import base64
import html
import io
import json
import math
import os
import sys
import time
import urllib.parse
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from actors import schema as S
from actors.files import write_atomically
from pipeline import metrics, quality, report_sample, shards
from pipeline.output import SUMMARY_FILE as SUMMARY_NAME
from pipeline.output import OutputLayout, is_part
from pipeline.progress import format_duration

REPORT_NAME = "report.html"
MAX_EMBED_BYTES = 8 * 1024 * 1024  # a larger clip is linked or left out, not inlined
MAX_ERROR_SAMPLES = 5  # error rows shown in the sample table
MAX_ERROR_KINDS = 10  # distinct error messages listed
MAX_TEXT_CHARS = 400  # sample-table text is cut here (full text in a tooltip)
MAX_ERROR_CHARS = 500

_HEAVY = (S.AUDIO, S.CODES)
_FILE_COL = "__report_file"
_ROW_COL = "__report_row"
_AUDIO_MIME = {
    ".flac": "audio/flac",
    ".wav": "audio/wav",
    ".ogg": "audio/ogg",
    ".opus": "audio/ogg",
    ".mp3": "audio/mpeg",
    ".m4a": "audio/mp4",
}

_OK_COLOR = "#2b7bba"
_ERR_COLOR = "#d0453a"
_STOP_COLORS = {"eos": "#2b9a5a", "budget": "#e08a1e", "error": _ERR_COLOR}


# ---- reading ----------------------------------------------------------------------------


@dataclass
class _Run:
    output_dir: Path
    files: list[Path]
    table: pa.Table  # metadata columns of every row, normalised for the metrics (+ file/row index)
    present: set[str]  # the columns the files have
    summary: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    rows_in_files: int = 0  # every row, read or not (pipeline/report_sample.py)

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


def _data_files(output_dir: Path, notes: list[str]) -> list[Path]:
    """chorus's live files (pipeline/output.py: the shards, the parts no shard absorbed, the
    rejected part), and any other Parquet file below data/ (a foreign layout is read too)."""
    data = output_dir / "data"
    if not data.is_dir():
        return []

    def chorus_named(p: Path) -> bool:
        return p.parent == data and (shards.is_shard(p.name) or is_part(p.name))

    found = [p for p in data.rglob("*.parquet") if p.is_file() and not p.name.startswith(".")]
    try:
        live = [Path(p) for p in OutputLayout(str(output_dir)).live_files()]
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


def _read_run(output_dir: Path) -> _Run:
    notes: list[str] = []
    files = _data_files(output_dir, notes)
    sources = {}
    for index, path in enumerate(files):
        try:
            sources[index] = pq.ParquetFile(path)
        except Exception as exc:  # a torn or foreign file must not sink the whole report
            notes.append(f"skipped unreadable file {path.relative_to(output_dir)}: {exc}")
    sizes = [sources[i].metadata.num_rows if i in sources else 0 for i in range(len(files))]
    takes = report_sample.quotas(sizes)
    tables = []
    for index, source in sources.items():
        try:
            columns = [n for n in source.schema_arrow.names if n not in _HEAVY]
            wanted = report_sample.positions(sizes[index], takes[index])
            t, rows = report_sample.read_rows(source, columns, wanted)
        except Exception as exc:
            notes.append(f"skipped unreadable file {files[index].relative_to(output_dir)}: {exc}")
            continue
        t = t.append_column(_FILE_COL, pa.array(np.full(t.num_rows, index, dtype=np.int32)))
        t = t.append_column(_ROW_COL, pa.array(rows))
        tables.append(t)
    if tables:
        table = _unify(tables, notes)
    else:
        table = pa.table({_FILE_COL: pa.array([], pa.int32()), _ROW_COL: pa.array([], pa.int64())})
        notes.append("no Parquet files under data/" if not files else "no readable Parquet files under data/")
    present = set(table.column_names)
    summary: dict[str, Any] = {}
    summary_path = output_dir / SUMMARY_NAME
    if summary_path.is_file():
        try:
            loaded = json.loads(summary_path.read_text(encoding="utf-8"))
            if isinstance(loaded, dict):
                summary = loaded
            else:
                notes.append(f"{SUMMARY_NAME} is not a JSON object; ignored")
        except (OSError, ValueError) as exc:
            notes.append(f"{SUMMARY_NAME} could not be read: {exc}")
    run = _Run(output_dir, files, metrics.normalise(table), present, summary, notes, rows_in_files=sum(sizes))
    if run.sampled:
        counted = report_sample.summary_totals(summary, run.rows_in_files)
        totals = f"the totals are {SUMMARY_NAME}'s" if counted else "so are the totals"
        notes.append(
            f"{sum(sizes):,} rows: the plots and tables show an evenly spread sample of {run.n:,} of them; {totals}"
        )
    return run


def _read_audio(run: _Run, picks: Sequence[int]) -> dict[int, dict]:
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
            pf = pq.ParquetFile(run.files[f])
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
            run.notes.append(f"audio could not be read from {run.files[f].name}: {exc}")
    return out


def _audio_value(v: Any) -> dict:
    if isinstance(v, dict):
        return {"bytes": v.get(S.AUDIO_BYTES), "path": v.get(S.AUDIO_PATH)}
    if isinstance(v, (bytes, bytearray)):
        return {"bytes": bytes(v), "path": None}
    if isinstance(v, str):
        return {"bytes": None, "path": v}
    return {"bytes": None, "path": None}


# ---- numbers ----------------------------------------------------------------------------


def _fmt(v: Any, digits: int = 3) -> str:
    if v is None:
        return "–"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        if not math.isfinite(v):
            return "–"
        if v != 0 and (abs(v) >= 1e6 or abs(v) < 10**-digits):
            return f"{v:.{digits}g}"
        if abs(v) >= 1000:
            return f"{v:,.0f}"
        return f"{v:.{digits}g}" if abs(v) < 1 else f"{v:,.{max(digits - 1, 1)}f}".rstrip("0").rstrip(".")
    return str(v)


def _num(summary: dict, key: str) -> Optional[float]:
    v = summary.get(key)
    if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
        return float(v)
    return None


def _pcts(values) -> list[float]:
    """p50, p90, p99 of the finite values (NaN when there are none), as the page shows them."""
    return [math.nan if v is None else v for v in metrics.percentiles(values, (50, 90, 99))]


# ---- plots (matplotlib object API -> inline SVG) ----------------------------------------


class Plots:
    def __init__(self) -> None:
        import matplotlib
        from matplotlib.figure import Figure

        self._mpl = matplotlib
        self._Figure = Figure
        self._rc = {
            "svg.fonttype": "none",
            "font.size": 9,
            "axes.titlesize": 10,
            "axes.spines.top": False,
            "axes.spines.right": False,
            "axes.grid": True,
            "grid.alpha": 0.3,
            "svg.image_inline": True,
        }

    def style(self):
        """Context for drawing: rcParams are read as artists are made, so every plot call
        runs inside it (and the caller's own rcParams are left as they were)."""
        return self._mpl.rc_context(self._rc)

    def figure(self, rows: int = 1, height: float = 3.0):
        fig = self._Figure(figsize=(6.4, height * rows), layout="constrained")
        return fig, list(fig.subplots(rows, 1, squeeze=False)[:, 0])

    def svg(self, fig, name: str) -> str:
        buf = io.StringIO()
        # a salt per plot keeps the SVG ids (clip paths) unique within the page and the
        # output deterministic; no date metadata for the same reason
        with self._mpl.rc_context({"svg.hashsalt": f"chorus-{name}"}):
            fig.savefig(buf, format="svg", metadata={"Date": None})
        text = buf.getvalue()
        start = text.find("<svg")
        text = text[start:] if start >= 0 else text
        return text.replace("<svg ", f'<svg role="img" aria-label="{html.escape(name)}" class="plot" ', 1)


def _plot_throughput(p: Plots, run: _Run, ok: np.ndarray) -> tuple[str, str]:
    seconds = run.floats(S.AUDIO_SECONDS)
    finished = run.floats(S.FINISHED_AT)
    have_time = np.isfinite(finished)
    if have_time.any():
        t = finished[have_time]
        t0, span = float(t.min()), float(t.max() - t.min())
        okm, secs = ok[have_time], np.nan_to_num(seconds[have_time])
        n_bins = int(np.clip(round(math.sqrt(t.size)), 1, 60)) if span > 0 else 1
        width = span / n_bins if span > 0 else 1.0
        edges = t0 + width * np.arange(n_bins + 1)
        rel = edges[:-1] - t0
        ok_counts, _ = np.histogram(t[okm], bins=edges)
        err_counts, _ = np.histogram(t[~okm], bins=edges)
        audio, _ = np.histogram(t[okm], bins=edges, weights=secs[okm])
        fig, (a1, a2) = p.figure(2, 2.2)
        a1.bar(rel, ok_counts / width, width=width, align="edge", color=_OK_COLOR, label="ok")
        a1.bar(
            rel,
            err_counts / width,
            width=width,
            align="edge",
            bottom=ok_counts / width,
            color=_ERR_COLOR,
            label="error",
        )
        a1.set_ylabel("rows / s")
        a1.set_title(f"Throughput over time (bins of {format_duration(width)})")
        if err_counts.any():
            a1.legend(loc="upper right", fontsize=8)
        a2.bar(rel, audio / width, width=width, align="edge", color="#5a9a3a")
        a2.set_ylabel("audio s / wall s")
        if not audio.any():
            a2.set_ylim(0, 1)
        a2.set_xlabel("seconds since the first row finished")
        missing = int((~have_time).sum())
        note = f" ({missing} rows without {S.FINISHED_AT} left out)" if missing else ""
        return p.svg(fig, "throughput"), "Rows and seconds of audio finished per second of wall time." + note
    # no finish times: show the run's progress in output order
    fig, (a1,) = p.figure(1, 3.0)
    order = np.arange(1, run.n + 1)
    a1.plot(order, np.cumsum(np.where(ok, np.nan_to_num(seconds), 0.0)), color="#5a9a3a")
    errs = order[~ok]
    if errs.size:
        a1.plot(errs, np.zeros_like(errs), "|", color=_ERR_COLOR, markersize=10, label="error row")
        a1.legend(loc="upper left", fontsize=8)
    a1.set_xlabel("row (output order)")
    a1.set_ylabel("cumulative audio seconds")
    a1.set_title("Audio produced, in output order")
    return p.svg(fig, "throughput"), f"The rows have no {S.FINISHED_AT} column, so progress is shown in output order."


def _hist(
    p: Plots,
    name: str,
    values: np.ndarray,
    *,
    title: str,
    xlabel: str,
    unit: str,
    ref: Optional[float] = None,
    ref_label: str = "",
) -> Optional[str]:
    values = values[np.isfinite(values)]
    if not values.size:
        return None
    fig, (ax,) = p.figure(1, 2.8)
    lo, hi = float(values.min()), float(values.max())
    bins = int(np.clip(round(math.sqrt(values.size) * 2), 5, 60)) if hi > lo else 1
    ax.hist(
        values,
        bins=bins,
        range=(lo, hi) if hi > lo else (lo - 0.5, lo + 0.5),
        color=_OK_COLOR,
        edgecolor="white",
        linewidth=0.5,
    )
    p50, p90, p99 = _pcts(values)
    for v, style, label in ((p50, "-", "p50"), (p90, "--", "p90"), (p99, ":", "p99")):
        ax.axvline(v, color="#333", linestyle=style, linewidth=1, label=f"{label} {_fmt(v)}{unit}")
    if ref is not None and lo <= ref * 1.5 and ref <= hi * 1.5:
        ax.axvline(ref, color=_ERR_COLOR, linewidth=1, label=ref_label)
    ax.legend(loc="best", fontsize=8, framealpha=0.85)
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("rows")
    return p.svg(fig, name)


def _plot_outcomes(p: Plots, run: _Run, ok: np.ndarray) -> Optional[str]:
    if not run.n:
        return None
    stops = run.strings(S.STOP_REASON)
    counts: Counter = Counter()
    for is_ok, stop in zip(ok, stops):
        counts["error" if not is_ok else (stop or "(none)")] += 1
    order = [k for k in ("eos", "budget") if k in counts]
    order += sorted(k for k in counts if k not in ("eos", "budget", "error"))
    order += ["error"] if "error" in counts else []
    fig, (ax,) = p.figure(1, max(1.6, 0.5 * len(order) + 1.0))
    ypos = np.arange(len(order))[::-1]
    values = [counts[k] for k in order]
    ax.barh(ypos, values, color=[_STOP_COLORS.get(k, "#888") for k in order])
    ax.set_yticks(ypos, labels=order)
    for y, v in zip(ypos, values):
        ax.text(v, y, f" {v:,} ({100 * v / run.n:.1f}%)", va="center", fontsize=8)
    ax.set_xlim(0, max(values) * 1.3)
    ax.set_xlabel("rows")
    ax.set_title("Outcome: stop reason of ok rows, and errors")
    ax.grid(axis="y", visible=False)
    return p.svg(fig, "outcomes")


# ---- HTML pieces ------------------------------------------------------------------------


def _e(v: Any) -> str:
    return html.escape("" if v is None else str(v), quote=True)


def _td(cell: Any) -> str:
    if isinstance(cell, tuple):
        cls, content = cell
        return f'<td class="{_e(cls)}">{content}</td>'
    return f"<td>{cell}</td>"


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]], cls: str = "") -> str:
    """Headers are escaped here; a cell is HTML already (escape user data before), or a
    (css class, HTML) pair."""
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(_td(c) for c in r) + "</tr>" for r in rows)
    return f'<table class="{_e(cls)}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _is_scalar(v: Any) -> bool:
    return v is None or isinstance(v, (str, int, float, bool))


def _dicts_table(items: Sequence[dict], key_header: Optional[str] = None, keys: Sequence[str] = ()) -> str:
    cols: list[str] = []
    for d in items:
        for k in d:
            if k not in cols:
                cols.append(k)
    rows = []
    for key, d in zip(keys or [None] * len(items), items):
        cells = [] if key_header is None else [f"<b>{_e(key)}</b>"]
        for c in cols:
            v = d.get(c)
            cells.append(_e(_fmt(v)) if _is_scalar(v) else f"<code>{_e(json.dumps(v, default=str))}</code>")
        rows.append(cells)
    return _table(([key_header] if key_header is not None else []) + cols, rows, "data")


def _nested_summary(summary: dict) -> str:
    """Non-scalar summary fields: a dict of dicts or a list of dicts as a table, else JSON."""
    parts = []
    for k, v in summary.items():
        if _is_scalar(v):
            continue
        if isinstance(v, dict) and v and all(isinstance(x, dict) for x in v.values()):
            body = _dicts_table(list(v.values()), key_header=str(k), keys=[str(x) for x in v])
        elif isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
            body = _dicts_table(v)
        else:
            body = f"<pre>{_e(json.dumps(v, indent=2, default=str))}</pre>"
        parts.append(f"<details><summary>{_e(k)}</summary>{body}</details>")
    return "".join(parts)


def _audio_src(value: dict, output_dir: Path) -> tuple[Optional[str], str]:
    """(src for <audio>, note). Bytes are inlined; a path is made relative to the report."""
    data, path = value.get("bytes"), value.get("path")
    if data:
        if len(data) <= MAX_EMBED_BYTES:
            mime = _sniff_mime(data)
            return f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}", ""
        if not path:
            return None, f"audio not embedded ({len(data) / 1e6:.1f} MB)"
    if path:
        parsed = urllib.parse.urlparse(path)
        if parsed.scheme in ("http", "https", "file"):
            return path, ""
        if parsed.scheme and len(parsed.scheme) > 1:  # s3://, gs://: no browser can play these
            return None, f"audio at {path}"
        p = Path(path)
        if p.is_absolute():
            try:
                p = Path(os.path.relpath(p, output_dir))
            except ValueError:  # another drive on Windows
                return p.as_uri(), ""
        return urllib.parse.quote(p.as_posix()), ""
    return None, "no audio"


def _sniff_mime(data: bytes) -> str:
    if data[:4] == b"fLaC":
        return "audio/flac"
    if data[:4] == b"RIFF":
        return "audio/wav"
    if data[:4] == b"OggS":
        return "audio/ogg"
    return "audio/flac"


def _pick_spread(candidates: np.ndarray, k: int) -> list[int]:
    """Up to k indices spread evenly over the candidates (first and last included)."""
    if k <= 0 or not candidates.size:
        return []
    if candidates.size <= k:
        return [int(i) for i in candidates]
    pos = np.unique(np.round(np.linspace(0, candidates.size - 1, k)).astype(int))
    return [int(candidates[i]) for i in pos]


def _cut(text: Optional[str], limit: int) -> str:
    if text is None:
        return ""
    return text if len(text) <= limit else text[: limit - 1] + "…"


_CSS = """
:root { --fg:#1d2330; --muted:#5d6675; --line:#dde1e8; --bg:#f6f7f9; --ok:#2b9a5a; --err:#d0453a; }
* { box-sizing: border-box; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, Helvetica, Arial, sans-serif;
       color: var(--fg); background: var(--bg); margin: 0; }
main { max-width: 1240px; margin: 0 auto; padding: 24px; }
h1 { font-size: 24px; margin: 0 0 4px; }
h2 { font-size: 17px; margin: 28px 0 10px; border-bottom: 1px solid var(--line); padding-bottom: 4px; }
.sub { color: var(--muted); margin: 0 0 16px; word-break: break-all; }
.cards { display: grid; grid-template-columns: repeat(auto-fill, minmax(150px, 1fr)); gap: 10px; }
.card { background: #fff; border: 1px solid var(--line); border-radius: 8px; padding: 10px 12px; }
.card .v { font-size: 20px; font-weight: 600; }
.card .k { color: var(--muted); font-size: 12px; }
.card.err .v { color: var(--err); } .card.ok .v { color: var(--ok); }
.plots { display: grid; grid-template-columns: repeat(auto-fit, minmax(520px, 1fr)); gap: 14px; }
figure { background: #fff; border: 1px solid var(--line); border-radius: 8px; margin: 0; padding: 8px; }
figure svg.plot { width: 100%; height: auto; display: block; }
figcaption { color: var(--muted); font-size: 12px; padding: 4px 6px 0; }
.empty { color: var(--muted); font-style: italic; padding: 24px; text-align: center; }
table { border-collapse: collapse; background: #fff; border: 1px solid var(--line); margin: 6px 0 12px;
        font-size: 13px; }
th, td { text-align: left; padding: 5px 9px; border-bottom: 1px solid var(--line); vertical-align: top; }
th { background: #eef1f5; font-weight: 600; white-space: nowrap; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
table.samples td.text { max-width: 460px; white-space: pre-wrap; word-break: break-word; }
table.samples td.id, table.errors td.id { font-family: ui-monospace, Menlo, Consolas, monospace;
        word-break: break-all; max-width: 220px; }
td.msg { font-family: ui-monospace, Menlo, Consolas, monospace; white-space: pre-wrap;
         word-break: break-word; max-width: 760px; font-size: 12px; }
audio { width: 260px; height: 34px; }
.status-error { color: var(--err); font-weight: 600; } .status-ok { color: var(--ok); }
.notes { background: #fff8e6; border: 1px solid #f0d48a; border-radius: 6px; padding: 8px 12px; }
details { margin: 6px 0; } summary { cursor: pointer; color: var(--muted); }
pre { background: #fff; border: 1px solid var(--line); padding: 8px; overflow: auto; }
footer { color: var(--muted); font-size: 12px; margin-top: 32px; }
"""


# ---- the page ---------------------------------------------------------------------------


def _render(run: _Run, *, title: str, max_audio_rows: int, bench: Optional[dict]) -> str:
    sections = [
        f"<h1>{_e(title)}</h1>",
        f'<p class="sub">{_e(run.output_dir)} — {len(run.files)} Parquet file(s), {run.n:,} row(s)</p>',
        _notes_section(run),
        _summary_section(run),
        _provenance_section(run),
        _summary_file_section(run.summary),
        _plots_section(run),
        _timing_section(run),
        _errors_section(run),
        _per_actor_section(run),
        _samples(run, max_audio_rows),
        _quality_section(run, max_audio_rows),
        _bench(bench) if bench else "",
        f"<footer>chorus report — generated {_e(time.strftime('%Y-%m-%d %H:%M:%S %Z'))} "
        f"from {_e(run.output_dir)}</footer>",
    ]
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{_e(title)}</title><style>{_CSS}</style></head>"
        f"<body><main>{''.join(sections)}</main></body></html>\n"
    )


def _notes_section(run: _Run) -> str:
    return '<div class="notes">' + "<br>".join(_e(x) for x in run.notes) + "</div>" if run.notes else ""


def _summary_section(run: _Run) -> str:
    """The headline cards: pipeline/metrics.py's headline figures of the rows, against
    summary.json's wall time when the run wrote one."""
    h = metrics.headline(run.table, _num(run.summary, "wall_s"))
    if run.sampled:
        h.update(report_sample.summary_totals(run.summary, run.rows_in_files))
    n, n_err, audio_s = h["rows"], h["rows_error"], h["audio_s"]
    cards = [
        ("rows ok", f"{h['rows_ok']:,}", "ok"),
        ("rows error", f"{n_err:,}", "err" if n_err else ""),
        ("error rate", f"{100 * n_err / n:.1f}%" if n else "–", "err" if n_err else ""),
        ("audio", format_duration(audio_s) + (f" ({audio_s / 3600:.2f} h)" if audio_s >= 3600 else ""), ""),
        ("wall time" + (" (from row times)" if h["wall_from_row_times"] else ""), format_duration(h["wall_s"]), ""),
        ("rows / s", _fmt(h["rows_per_s"]), ""),
        ("frames / s", _fmt(h["frames_per_s"]), ""),
        ("real-time factor (wall / audio)", _fmt(h["rtf"]), ""),
        ("per-row RTF p50", _fmt(h["row_rtf_p50"]), ""),
        ("latency p50 / p90", f"{_ms_as_duration(h['latency_ms_p50'])} / {_ms_as_duration(h['latency_ms_p90'])}", ""),
    ]
    return (
        '<h2>Summary</h2><div class="cards">'
        + "".join(
            f'<div class="card {c}"><div class="v">{_e(v)}</div><div class="k">{_e(k)}</div></div>' for k, v, c in cards
        )
        + "</div>"
    )


def _ms_as_duration(ms: Optional[float]) -> str:
    return format_duration(None if ms is None else ms / 1000.0)


def _provenance_section(run: _Run) -> str:
    rows = []
    for col in (S.MODEL, S.DEVICE, S.NODE, S.ACTOR):
        values = metrics.distinct_values(run.table, col) if run.has(col) else []
        if values:
            shown = ", ".join(f"{k} ({c:,})" for k, c in values[:6])
            more = f", … {len(values) - 6} more" if len(values) > 6 else ""
            rows.append([f"<b>{_e(col)}</b>", _e(f"{len(values)}: {shown}{more}")])
    return _table(["", "distinct values (rows)"], rows, "prov") if rows else ""


def _summary_file_section(summ: dict) -> str:
    if not summ:
        return ""
    scalars = [[f"<b>{_e(k)}</b>", ("num", _e(_fmt(v)))] for k, v in summ.items() if _is_scalar(v)]
    return (
        f"<h2>{_e(SUMMARY_NAME)}</h2>"
        + (_table(["field", "value"], scalars, "kv") if scalars else "")
        + (_nested_summary(summ))
    )


def _plots_section(run: _Run) -> str:
    if not run.n:
        return '<h2>Plots</h2><p class="empty">No rows yet — nothing to plot.</p>'
    p = Plots()
    with p.style():
        plots = _plots(p, run, run.ok)
    return (
        '<h2>Plots</h2><div class="plots">'
        + "".join(
            f"<figure>{svg}<figcaption>{_e(cap)}</figcaption></figure>"
            if svg
            else f'<figure><p class="empty">{_e(name)}: no data (no ok rows with this value)</p></figure>'
            for name, svg, cap in plots
        )
        + "</div>"
    )


def _plots(p: Plots, run: _Run, ok: np.ndarray) -> list[tuple[str, Optional[str], str]]:
    """(name, SVG or None, caption) of each plot, in page order."""
    svg, caption = _plot_throughput(p, run, ok)
    latency = run.floats(S.TOTAL_MS)[ok]
    finite_latency = latency[np.isfinite(latency)]
    scale, unit = (1000.0, " s") if finite_latency.size and float(np.median(finite_latency)) >= 2000 else (1.0, " ms")
    rtf = run.floats(S.RTF)[ok]
    duration = run.floats(S.AUDIO_SECONDS)[ok]
    return [
        ("Throughput", svg, caption),
        (
            "Latency",
            _hist(
                p,
                "latency",
                latency / scale,
                title="Per-row latency (total_ms, ok rows)",
                xlabel=f"total{unit}",
                unit=unit,
            ),
            "Time from admission to finished audio, per row.",
        ),
        (
            "RTF",
            _hist(
                p,
                "rtf",
                rtf,
                title="Per-row real-time factor (ok rows)",
                xlabel="compute seconds per second of audio",
                unit="",
                ref=1.0,
                ref_label="real time (1.0)",
            ),
            "Below 1.0 a row took less compute time than its audio lasts.",
        ),
        (
            "Outcomes",
            _plot_outcomes(p, run, ok),
            "eos: the model ended the row; budget: it hit its frame budget (may be cut off).",
        ),
        (
            "Duration",
            _hist(p, "duration", duration, title="Audio duration per row (ok rows)", xlabel="seconds", unit=" s"),
            "A pile-up at the right edge usually means rows hitting their frame budget.",
        ),
    ]


def _timing_section(run: _Run) -> str:
    ok = metrics.ok_rows(run.table)
    rows = []
    for col in metrics.TIMING_COLUMNS:
        if run.has(col) and len(metrics.finite(ok.column(col))):
            figures = [metrics.mean(ok.column(col)), *_pcts(ok.column(col))]
            rows.append([f"<b>{_e(col)}</b>"] + [("num", _e(_fmt(x))) for x in figures])
    return "<h2>Timing (ok rows, ms)</h2>" + _table(["", "mean", "p50", "p90", "p99"], rows, "kv") if rows else ""


def _errors_section(run: _Run) -> str:
    n_err = metrics.counts(run.table)["rows_error"]
    if not n_err:
        return ""
    kinds = metrics.error_kinds(run.table, name_missing=True)
    rows = [
        [("num", f"{k['rows']:,}"), ("id", _e(k["example_id"])), ("msg", _e(_cut(k["error"], MAX_ERROR_CHARS)))]
        for k in kinds[:MAX_ERROR_KINDS]
    ]
    more = len(kinds) - MAX_ERROR_KINDS
    return (
        f"<h2>Errors ({n_err:,} rows, {len(kinds):,} distinct messages)</h2>"
        + _table(["rows", "example id", "message"], rows, "errors")
        + (f'<p class="sub">… and {more:,} more distinct messages.</p>' if more > 0 else "")
    )


def _per_actor_section(run: _Run) -> str:
    actors = {a: f for a, f in metrics.per_actor(run.table).items() if a} if run.has(S.ACTOR) else {}
    if len(actors) < 2:
        return ""
    rows = []
    for actor, f in list(actors.items())[:50]:
        cells = (
            f"{f['rows_ok']:,}",
            f"{f['rows_error']:,}",
            format_duration(float(f["audio_s"])),
            _fmt(f["latency_ms_p50"]),
            _fmt(f["row_rtf_p50"]),
        )
        rows.append([f"<b>{_e(actor)}</b>"] + [("num", _e(x)) for x in cells])
    return "<h2>Per actor</h2>" + _table(["actor", "ok", "error", "audio", "latency p50 (ms)", "RTF p50"], rows, "kv")


def _samples(run: _Run, max_audio_rows: int) -> str:
    ok_picks, budget_picks, err_picks = _sample_picks(run, max_audio_rows)
    if not ok_picks and not err_picks:
        return '<h2>Sample rows</h2><p class="empty">No rows.</p>'
    audio = _read_audio(run, ok_picks)
    with_text = run.has(S.TEXT)
    headers = ["id", *(["text"] if with_text else []), "status", "duration", "stop", "RTF", "total ms", "audio / error"]
    # each column read once (a run may have millions of rows), then indexed per sample
    columns = {name: run.strings(name) for name in (S.ID, S.STATUS, S.STOP_REASON, S.ERROR)}
    columns.update({name: run.floats(name) for name in (S.AUDIO_SECONDS, S.RTF, S.TOTAL_MS)})
    columns[S.TEXT] = run.strings(S.TEXT) if with_text else None
    ok = run.ok
    rows = [_sample_cells(columns, i, bool(ok[i]), audio.get(i, {}), run.output_dir) for i in ok_picks + err_picks]
    what = (
        f"{len(ok_picks)} ok row(s) spread over the run"
        + (f" ({len(budget_picks)} of them stopped by the frame budget)" if budget_picks else "")
        + (f", {len(err_picks)} error row(s)" if err_picks else "")
    )
    return f'<h2>Sample rows</h2><p class="sub">{_e(what)}</p>' + _table(headers, rows, "samples")


def _sample_picks(run: _Run, max_audio_rows: int) -> tuple[list[int], list[int], list[int]]:
    """(ok rows, the budget-stopped ones among them, error rows) to show. Rows that hit their
    frame budget are the ones worth a listen (cut off mid-word?): up to a quarter of the audio
    rows go to them, the rest spread over the other ok rows."""
    ok = run.ok
    budget = ok & np.array([s == "budget" for s in run.strings(S.STOP_REASON)], dtype=bool)
    budget_picks = _pick_spread(np.flatnonzero(budget), max_audio_rows // 4)
    ok_picks = sorted(budget_picks + _pick_spread(np.flatnonzero(ok & ~budget), max_audio_rows - len(budget_picks)))
    return ok_picks, budget_picks, _pick_spread(np.flatnonzero(~ok), MAX_ERROR_SAMPLES)


def _sample_cells(columns: dict, i: int, ok: bool, audio: dict, output_dir: Path) -> list:
    """Row i's cells for _table: (css class, HTML) pairs, user data escaped."""
    cells = [("id", _e(columns[S.ID][i]))]
    if columns[S.TEXT] is not None:
        t = columns[S.TEXT][i]
        shown = _e(_cut(t, MAX_TEXT_CHARS))
        cells.append(("text", f'<span title="{_e(t)}">{shown}</span>' if t and len(t) > MAX_TEXT_CHARS else shown))
    cells.append((f"status-{'ok' if ok else 'error'}", _e(columns[S.STATUS][i] or "(none)")))
    cells.append(("num", _e(format_duration(float(columns[S.AUDIO_SECONDS][i])) if ok else "–")))
    cells.append(_e(columns[S.STOP_REASON][i] or "–"))
    cells.append(("num", _e(_fmt(float(columns[S.RTF][i])) if ok else "–")))
    cells.append(("num", _e(_fmt(float(columns[S.TOTAL_MS][i])))))
    if not ok:
        cells.append(("msg", _e(_cut(columns[S.ERROR][i] or "", MAX_ERROR_CHARS))))
        return cells
    src, note = _audio_src(audio, output_dir)
    if not src:
        cells.append(("msg", _e(note)))
        return cells
    player = f'<audio controls preload="metadata" src="{_e(src)}"></audio>' + (f"<br>{_e(note)}" if note else "")
    cells.append(player)
    return cells


def _quality_section(run: _Run, max_audio_rows: int) -> str:
    """pipeline/quality.py's section, its worst rows with players from this page's reader."""
    audio = _read_audio(run, quality.worst_rows(run.table, max_audio_rows))

    def player(i: int) -> str:
        src, note = _audio_src(audio.get(i, {}), run.output_dir)
        return f'<audio controls preload="metadata" src="{_e(src)}"></audio>' if src else _e(note)

    return quality.section(run.table, player, max_audio_rows)


def _bench(bench: dict) -> str:
    parts = ["<h2>Benchmark</h2>"]
    scalars = [[f"<b>{_e(k)}</b>", _e(_fmt(v))] for k, v in bench.items() if _is_scalar(v)]
    if scalars:
        parts.append(_table(["field", "value"], scalars, "kv"))
    configs = bench.get("configs")
    if isinstance(configs, list) and configs:
        dicts = [c if isinstance(c, dict) else {"value": c} for c in configs]
        parts.append(_dicts_table(dicts))
    rest = {k: v for k, v in bench.items() if not _is_scalar(v) and k != "configs"}
    parts.append(_nested_summary(rest))
    return "".join(parts)


# ---- entry points -----------------------------------------------------------------------


def write_report(
    output_dir: str, *, title: str = "chorus run", max_audio_rows: int = 12, bench: dict | None = None
) -> str:
    """Write OUTPUT_DIR/report.html (atomically) from the run's Parquet output and
    summary.json; return its path. An empty or all-error run still gets a page."""
    out = Path(output_dir)
    if not out.is_dir():
        raise FileNotFoundError(f"output directory {output_dir!r} does not exist")
    run = _read_run(out)
    page = _render(run, title=title, max_audio_rows=max(0, int(max_audio_rows)), bench=bench)
    target = out / REPORT_NAME
    write_atomically(target, page, prefix=".report-")
    return str(target)


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m pipeline.report", description="Write OUTPUT_DIR/report.html for a chorus run."
    )
    ap.add_argument("output_dir", help="the run's output directory (holds data/ and summary.json)")
    ap.add_argument("--title", default="chorus run")
    ap.add_argument("--max-audio-rows", type=int, default=12, help="ok rows with playable audio (default 12)")
    ap.add_argument("--bench", help="a benchmark JSON file whose 'configs' list is shown as a table")
    args = ap.parse_args(argv)
    if not os.path.isdir(args.output_dir):
        ap.error(f"output directory {args.output_dir!r} does not exist")
    bench = None
    if args.bench:
        try:
            bench = json.loads(Path(args.bench).read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            ap.error(f"--bench {args.bench!r}: {exc}")
        if not isinstance(bench, dict):
            ap.error(f"--bench {args.bench!r}: expected a JSON object")
    path = write_report(args.output_dir, title=args.title, max_audio_rows=args.max_audio_rows, bench=bench)
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
