"""`report.html`: one self-contained page describing a finished (or partial) run.

    python -m pipeline.report OUTPUT_DIR [--title T] [--max-audio-rows N] [--bench bench.json]

Reads the run's output directory (`OUTPUT_DIR/data/**/*.parquet`, the columns of
actors/schema.py, and `OUTPUT_DIR/summary.json` when present) and writes
`OUTPUT_DIR/report.html` atomically:
summary figures, plots (throughput over time, latency / RTF / duration histograms, stop
reasons), the most common errors, per-actor figures, and a table of sample rows with
playable audio. Plots are inline SVG and audio is embedded as `data:` URIs (or linked by
relative path when the run wrote files), so the page works offline as one file.

Reading is pipeline/report/page_data.py (the files, leniently: a torn file or a foreign column
type is a note, not a failure), the figures pipeline/report/metrics.py (shared with summary.json and
the benchmark), the plots pipeline/report/plots.py, the HTML pieces pipeline/report/markup.py;
this module renders the page, one small function per page section.

Layering: the driver side never imports torch — these modules use pyarrow, numpy and
matplotlib only (matplotlib through its object API, no pyplot, so no GUI backend is chosen
and no global state is touched). Only metadata columns are read, of every row up to
pipeline/report/sample.py's SAMPLE_ROWS and of an evenly spread sample of that many above it
(the page says so, and its totals are then summary.json's); audio bytes are read for the few
sample rows only, so a report of a multi-hour run stays cheap.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Optional

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs

from actors import schema as S
from actors.files import write_atomically

from ..names import REPORT_FILE, SUMMARY_FILE
from ..output.layout import OutputLayout
from . import metrics
from . import quality_figures as quality
from . import sample as report_sample
from .markup import (
    CSS,
    audio_src,
    cut_text,
    dicts_table,
    esc,
    fmt,
    format_duration,
    html_table,
    is_scalar,
    nested_summary,
)
from .page_data import ReportRun, read_audio, read_references, read_run
from .plots import Plots, percentile_marks, run_plots

MAX_ERROR_SAMPLES = 5  # error rows shown in the sample table
MAX_ERROR_KINDS = 10  # distinct error messages listed
MAX_TEXT_CHARS = 400  # sample-table text is cut here (full text in a tooltip)
MAX_ERROR_CHARS = 500


def _num(summary: dict, key: str) -> Optional[float]:
    v = summary.get(key)
    if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
        return float(v)
    return None


def _pick_spread(candidates: np.ndarray, k: int) -> list[int]:
    """Up to k indices spread evenly over the candidates (first and last included)."""
    if k <= 0 or not candidates.size:
        return []
    if candidates.size <= k:
        return [int(i) for i in candidates]
    pos = np.unique(np.round(np.linspace(0, candidates.size - 1, k)).astype(int))
    return [int(candidates[i]) for i in pos]


# ---- the page ---------------------------------------------------------------------------


def _render(run: ReportRun, *, title: str, max_audio_rows: int, bench: Optional[dict]) -> str:
    # the first screen: the headline figures and the plots; the raw summary.json folded below
    body = [
        _summary_section(run),
        _plots_section(run),
        _provenance_section(run),
        _summary_file_section(run.summary),
        _timing_section(run),
        _errors_section(run),
        _per_actor_section(run),
        _samples(run, max_audio_rows),
        _quality_section(run, max_audio_rows),
        _bench(bench) if bench else "",
        f"<footer>chorus report — generated {esc(time.strftime('%Y-%m-%d %H:%M:%S %Z'))} "
        f"from {esc(run.output_dir)}</footer>",
    ]
    # the notes go on top but are rendered last: reading the samples' audio and the reference
    # clips may add some
    sections = [
        f"<h1>{esc(title)}</h1>",
        f'<p class="sub">{esc(run.output_dir)} — {len(run.files)} Parquet file(s), {run.n:,} row(s)</p>',
        _notes_section(run),
        *body,
    ]
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{esc(title)}</title><style>{CSS}</style></head>"
        f"<body><main>{''.join(sections)}</main></body></html>\n"
    )


def _notes_section(run: ReportRun) -> str:
    return '<div class="notes">' + "<br>".join(esc(x) for x in run.notes) + "</div>" if run.notes else ""


def _summary_section(run: ReportRun) -> str:
    """The headline cards: pipeline/report/metrics.py's headline figures of the rows, against
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
        ("rows / s", fmt(h["rows_per_s"]), ""),
        ("frames / s", fmt(h["frames_per_s"]), ""),
        ("real-time factor (wall / audio)", fmt(h["rtf"]), ""),
        ("per-row RTF p50", fmt(h["row_rtf_p50"]), ""),
        ("latency p50 / p90", f"{_ms_as_duration(h['latency_ms_p50'])} / {_ms_as_duration(h['latency_ms_p90'])}", ""),
    ]
    removed = run.summary.get("rows_removed_from_input")
    if removed:  # ids the output held that the last run's input no longer names
        cards.append((f"rows gone from the input ({run.summary.get('removed_rows')})", f"{removed:,}", ""))
    return (
        '<h2>Summary</h2><div class="cards">'
        + "".join(
            f'<div class="card {c}"><div class="v">{esc(v)}</div><div class="k">{esc(k)}</div></div>'
            for k, v, c in cards
        )
        + "</div>"
    )


def _ms_as_duration(ms: Optional[float]) -> str:
    return format_duration(None if ms is None else ms / 1000.0)


def _provenance_section(run: ReportRun) -> str:
    rows = []
    for col in (S.MODEL, S.DEVICE, S.NODE, S.ACTOR):
        values = metrics.distinct_values(run.table, col) if run.has(col) else []
        if values:
            shown = ", ".join(f"{k} ({c:,})" for k, c in values[:6])
            more = f", … {len(values) - 6} more" if len(values) > 6 else ""
            rows.append([f"<b>{esc(col)}</b>", esc(f"{len(values)}: {shown}{more}")])
    return html_table(["", "distinct values (rows)"], rows, "prov") if rows else ""


def _summary_file_section(summ: dict) -> str:
    if not summ:
        return ""
    scalars = [[f"<b>{esc(k)}</b>", ("num", esc(fmt(v)))] for k, v in summ.items() if is_scalar(v)]
    return (
        f'<details class="summary-file"><summary><h2>{esc(SUMMARY_FILE)}</h2></summary>'
        + (html_table(["field", "value"], scalars, "kv") if scalars else "")
        + nested_summary(summ)
        + "</details>"
    )


def _plots_section(run: ReportRun) -> str:
    if not run.n:
        return '<h2>Plots</h2><p class="empty">No rows yet — nothing to plot.</p>'
    p = Plots()
    with p.style():
        plots = run_plots(p, run, run.ok)
    return (
        '<h2>Plots</h2><div class="plots">'
        + "".join(
            f"<figure>{svg}<figcaption>{esc(cap)}</figcaption></figure>"
            if svg
            else f'<figure><p class="empty">{esc(name)}: no data (no ok rows with this value)</p></figure>'
            for name, svg, cap in plots
        )
        + "</div>"
    )


def _timing_section(run: ReportRun) -> str:
    ok = metrics.ok_rows(run.table)
    rows = []
    for col in metrics.TIMING_COLUMNS:
        if run.has(col) and len(metrics.finite(ok.column(col))):
            figures = [metrics.mean(ok.column(col)), *percentile_marks(ok.column(col))]
            rows.append([f"<b>{esc(col)}</b>"] + [("num", esc(fmt(x))) for x in figures])
    return "<h2>Timing (ok rows, ms)</h2>" + html_table(["", "mean", "p50", "p90", "p99"], rows, "kv") if rows else ""


def _errors_section(run: ReportRun) -> str:
    n_err = metrics.counts(run.table)["rows_error"]
    if not n_err:
        return ""
    kinds = metrics.error_kinds(run.table, name_missing=True)
    rows = [
        [("num", f"{k['rows']:,}"), ("id", esc(k["example_id"])), ("msg", esc(cut_text(k["error"], MAX_ERROR_CHARS)))]
        for k in kinds[:MAX_ERROR_KINDS]
    ]
    more = len(kinds) - MAX_ERROR_KINDS
    return (
        f"<h2>Errors ({n_err:,} rows, {len(kinds):,} distinct messages)</h2>"
        + html_table(["rows", "example id", "message"], rows, "errors")
        + (f'<p class="sub">… and {more:,} more distinct messages.</p>' if more > 0 else "")
    )


def _per_actor_section(run: ReportRun) -> str:
    actors = {a: f for a, f in metrics.per_actor(run.table).items() if a} if run.has(S.ACTOR) else {}
    if len(actors) < 2:
        return ""
    rows = []
    for actor, f in list(actors.items())[:50]:
        cells = (
            f"{f['rows_ok']:,}",
            f"{f['rows_error']:,}",
            format_duration(float(f["audio_s"])),
            fmt(f["latency_ms_p50"]),
            fmt(f["row_rtf_p50"]),
        )
        rows.append([f"<b>{esc(actor)}</b>"] + [("num", esc(x)) for x in cells])
    return "<h2>Per actor</h2>" + html_table(
        ["actor", "ok", "error", "audio", "latency p50 (ms)", "RTF p50"], rows, "kv"
    )


def _samples(run: ReportRun, max_audio_rows: int) -> str:
    ok_picks, budget_picks, err_picks = _sample_picks(run, max_audio_rows)
    if not ok_picks and not err_picks:
        return '<h2>Sample rows</h2><p class="empty">No rows.</p>'
    audio = read_audio(run, ok_picks)
    with_text = run.has(S.TEXT)
    headers = ["id", *(["text"] if with_text else []), "status", "duration", "stop", "RTF", "total ms", "audio / error"]
    # each column read once (a run may have millions of rows), then indexed per sample
    columns = {name: run.strings(name) for name in (S.ID, S.STATUS, S.STOP_REASON, S.ERROR)}
    columns.update({name: run.floats(name) for name in (S.AUDIO_SECONDS, S.RTF, S.TOTAL_MS)})
    columns[S.TEXT] = run.strings(S.TEXT) if with_text else None
    columns[S.TURNS] = _picked(run, S.TURNS, ok_picks + err_picks)
    ok = run.ok
    rows = [_sample_cells(columns, i, bool(ok[i]), audio.get(i, {}), run.output_dir) for i in ok_picks + err_picks]
    what = (
        f"{len(ok_picks)} ok row(s) spread over the run"
        + (f" ({len(budget_picks)} of them stopped by the frame budget)" if budget_picks else "")
        + (f", {len(err_picks)} error row(s)" if err_picks else "")
    )
    return f'<h2>Sample rows</h2><p class="sub">{esc(what)}</p>' + html_table(headers, rows, "samples")


def _sample_picks(run: ReportRun, max_audio_rows: int) -> tuple[list[int], list[int], list[int]]:
    """(ok rows, the budget-stopped ones among them, error rows) to show. Rows that hit their
    frame budget are the ones worth a listen (cut off mid-word?): up to a quarter of the audio
    rows go to them, the rest spread over the other ok rows."""
    ok = run.ok
    budget = ok & np.array([s == "budget" for s in run.strings(S.STOP_REASON)], dtype=bool)
    budget_picks = _pick_spread(np.flatnonzero(budget), max_audio_rows // 4)
    ok_picks = sorted(budget_picks + _pick_spread(np.flatnonzero(ok & ~budget), max_audio_rows - len(budget_picks)))
    return ok_picks, budget_picks, _pick_spread(np.flatnonzero(~ok), MAX_ERROR_SAMPLES)


def _sample_cells(columns: dict, i: int, ok: bool, audio: dict, output_dir: Path) -> list:
    """Row i's cells for html_table: (css class, HTML) pairs, user data escaped."""
    cells = [("id", esc(columns[S.ID][i]))]
    if columns[S.TEXT] is not None:
        t = columns[S.TEXT][i]
        shown = esc(cut_text(t, MAX_TEXT_CHARS))
        cells.append(("text", f'<span title="{esc(t)}">{shown}</span>' if t and len(t) > MAX_TEXT_CHARS else shown))
    cells.append((f"status-{'ok' if ok else 'error'}", esc(columns[S.STATUS][i] or "(none)")))
    cells.append(("num", esc(format_duration(float(columns[S.AUDIO_SECONDS][i])) if ok else "–")))
    cells.append(esc(columns[S.STOP_REASON][i] or "–"))
    cells.append(("num", esc(fmt(float(columns[S.RTF][i])) if ok else "–")))
    cells.append(("num", esc(fmt(float(columns[S.TOTAL_MS][i])))))
    if not ok:
        cells.append(("msg", esc(cut_text(columns[S.ERROR][i] or "", MAX_ERROR_CHARS))))
        return cells
    src, note = audio_src(audio, output_dir)
    if not src:
        cells.append(("msg", esc(note)))
        return cells
    player = f'<audio controls preload="metadata" src="{esc(src)}"></audio>' + (f"<br>{esc(note)}" if note else "")
    cells.append(player + _turns_line(columns[S.TURNS].get(i)))
    return cells


def _picked(run: ReportRun, name: str, picks: list[int]) -> dict:
    """{row -> value} of one column for the picked rows only (a list column of every row the
    page read would be hundreds of thousands of Python objects)."""
    if not run.has(name) or not picks:
        return {}
    return dict(zip(picks, run.table.column(name).take(pa.array(picks, pa.int64())).to_pylist()))


def _turns_line(turns: Optional[list]) -> str:
    """A dialogue row's turns under its player: who speaks when (a plain row's one turn: nothing)."""
    if not turns or len(turns) < 2:
        return ""
    spans = [
        f"{t[S.TURN_SPEAKER]}: {t[S.TURN_START_S]:.2f}–{t[S.TURN_END_S]:.2f} s"
        for t in turns
        if isinstance(t, dict) and t.get(S.TURN_START_S) is not None
    ]
    return f'<div class="turns">speaker: {esc(" · ".join(spans))}</div>'


def _quality_section(run: ReportRun, max_audio_rows: int) -> str:
    """pipeline/report/quality_figures.py's section, its worst rows with players from this page's reader."""
    worst = quality.worst_rows(run.table, max_audio_rows)
    audio, references = read_audio(run, worst), read_references(run, worst)

    def player(sources: dict[int, dict]):
        def html_of(i: int) -> str:
            src, note = audio_src(sources.get(i, {}), run.output_dir)
            return f'<audio controls preload="metadata" src="{esc(src)}"></audio>' if src else esc(note)

        return html_of

    return quality.section(run.table, player(audio), max_audio_rows, reference=player(references))


def _bench(bench: dict) -> str:
    parts = ["<h2>Benchmark</h2>"]
    scalars = [[f"<b>{esc(k)}</b>", esc(fmt(v))] for k, v in bench.items() if is_scalar(v)]
    if scalars:
        parts.append(html_table(["field", "value"], scalars, "kv"))
    configs = bench.get("configs")
    if isinstance(configs, list) and configs:
        dicts = [c if isinstance(c, dict) else {"value": c} for c in configs]
        parts.append(dicts_table(dicts))
    rest = {k: v for k, v in bench.items() if not is_scalar(v) and k != "configs"}
    parts.append(nested_summary(rest))
    return "".join(parts)


# ---- entry points -----------------------------------------------------------------------


def write_report(
    output_dir: str, *, title: str = "chorus run", max_audio_rows: int = 12, bench: dict | None = None
) -> str:
    """Write report.html into the output directory `output_dir` (a local path or a URI) from
    its Parquet output and summary.json; return the page's path or URI. An empty or all-error
    run still gets a page. Locally the page is replaced atomically; on an object store it
    appears when its upload completes. The sampled rows' audio is embedded (data: URIs), so
    the page plays in a browser that cannot read the store."""
    layout = OutputLayout(str(output_dir))
    if layout.fs.get_file_info(layout.base).type == pafs.FileType.NotFound:
        raise FileNotFoundError(f"output directory {output_dir!r} does not exist")
    run = read_run(layout.location)
    page = _render(run, title=title, max_audio_rows=max(0, int(max_audio_rows)), bench=bench)
    if not layout.local:
        layout.write_text(REPORT_FILE, page)
        return f"{layout.location}/{REPORT_FILE}"
    target = Path(layout.location) / REPORT_FILE
    write_atomically(target, page, prefix=".report-")
    return str(target)
