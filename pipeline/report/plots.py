"""report.html's plots (pipeline/report/page.py): matplotlib's object API to inline SVG (no pyplot,
so no GUI backend is chosen and no global state is touched)."""

from __future__ import annotations

import html
import io
import math
from collections import Counter
from typing import Optional

import numpy as np

from actors import schema as S

from . import metrics
from .markup import fmt, format_duration
from .page_data import ReportRun

OK_COLOR = "#2b7bba"


ERR_COLOR = "#d0453a"


_STOP_COLORS = {"eos": "#2b9a5a", "budget": "#e08a1e", "error": ERR_COLOR}


def percentile_marks(values) -> list[float]:
    """p50, p90, p99 of the finite values (NaN when there are none), as the page shows them."""
    return [math.nan if v is None else v for v in metrics.percentiles(values, (50, 90, 99))]


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


def _plot_throughput(p: Plots, run: ReportRun, ok: np.ndarray) -> tuple[str, str]:
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
        a1.bar(rel, ok_counts / width, width=width, align="edge", color=OK_COLOR, label="ok")
        a1.bar(
            rel,
            err_counts / width,
            width=width,
            align="edge",
            bottom=ok_counts / width,
            color=ERR_COLOR,
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
        a1.plot(errs, np.zeros_like(errs), "|", color=ERR_COLOR, markersize=10, label="error row")
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
        color=OK_COLOR,
        edgecolor="white",
        linewidth=0.5,
    )
    p50, p90, p99 = percentile_marks(values)
    for v, style, label in ((p50, "-", "p50"), (p90, "--", "p90"), (p99, ":", "p99")):
        ax.axvline(v, color="#333", linestyle=style, linewidth=1, label=f"{label} {fmt(v)}{unit}")
    if ref is not None and lo <= ref * 1.5 and ref <= hi * 1.5:
        ax.axvline(ref, color=ERR_COLOR, linewidth=1, label=ref_label)
    ax.legend(loc="best", fontsize=8, framealpha=0.85)
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("rows")
    return p.svg(fig, name)


def _plot_outcomes(p: Plots, run: ReportRun, ok: np.ndarray) -> Optional[str]:
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


def run_plots(p: Plots, run: ReportRun, ok: np.ndarray) -> list[tuple[str, Optional[str], str]]:
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
