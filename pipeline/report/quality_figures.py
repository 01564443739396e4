"""The quality gate's figures over an output (issue 21): summary.json's `quality` object and
the report's quality section. Reads the quality columns of actors/schema.py; a table from a
writer without them (an older output) gives empty counts, not an error."""

from __future__ import annotations

import html
from collections.abc import Callable
from typing import Any, Optional

import pyarrow as pa
import pyarrow.compute as pc

from actors import schema as S
from actors.quality.attempts import severity_key
from actors.quality.settings import FLAGS

from . import metrics

METRIC_COLUMNS = (
    S.REPEAT_RATIO,
    S.SPEECH_RATE_S_PER_CHAR,
    S.SILENCE_RATIO,
    S.CLIPPED_RATIO,
    S.LOUDNESS_LUFS,
    S.WER,
    S.CER,
    S.SPEAKER_SIMILARITY,
    S.MOS,
    S.MOS_SIG,
    S.MOS_BAK,
)
PERCENTILES = (5, 50, 95)


def _column(table: pa.Table, name: str) -> list:
    return table.column(name).to_pylist() if name in table.column_names else [None] * table.num_rows


def _tally(values) -> dict[str, int]:
    out: dict[str, int] = {}
    for v in values:
        if v is not None:
            out[str(v)] = out.get(str(v), 0) + 1
    return dict(sorted(out.items()))


def tallies(table: pa.Table) -> dict:
    """The counts `figures` reports, in a form that adds up over tables (merge_tallies):
    rows per status, per flag, per attempt count; frames kept and discarded."""
    flags = _column(table, S.QUALITY_FLAGS)
    return {
        "rows_by_status": _tally(_column(table, S.STATUS)),
        "rows_by_flag": {flag: sum(1 for f in flags if f and flag in f) for flag in FLAGS},
        "rows_by_attempts": _tally(_column(table, S.ATTEMPTS)),
        "frames": sum(v or 0 for v in _column(table, S.N_FRAMES)),
        "discarded_frames": sum(v or 0 for v in _column(table, S.DISCARDED_FRAMES)),
    }


def merge_tallies(into: dict, other: dict) -> dict:
    for key, value in other.items():
        if isinstance(value, dict):
            merged = into.setdefault(key, {})
            for k, n in value.items():
                merged[k] = merged.get(k, 0) + n
        else:
            into[key] = into.get(key, 0) + value
    return into


def present_metrics(table: pa.Table) -> list[str]:
    """The metric columns with at least one value: those the figures describe."""
    return [n for n in METRIC_COLUMNS if n in table.column_names and table.column(n).null_count < table.num_rows]


def figures(table: pa.Table, distributions: Optional[dict] = None) -> dict:
    """Rows per status, per flag (rows whose kept audio shows it), per attempt count; the frames
    regeneration discarded as a share of all frames generated; each metric's percentiles
    (exact, or `distributions` computed elsewhere: pipeline/report/summary_merge.py's sketches)."""
    if distributions is None:
        distributions = {}
        for name in present_metrics(table):
            values = pc.cast(table.column(name), pa.float64())
            distributions[name] = dict(
                zip((f"p{q}" for q in PERCENTILES), metrics.percentiles(values, PERCENTILES)),
                mean=metrics.mean(values),
            )
    return from_tallies(tallies(table), distributions)


def from_tallies(counted: dict, distributions: dict) -> dict:
    frames, discarded = counted["frames"], counted["discarded_frames"]
    return {
        "rows_by_status": dict(sorted(counted["rows_by_status"].items())),
        "rows_by_flag": {flag: n for flag, n in counted["rows_by_flag"].items() if n},
        "rows_by_attempts": dict(sorted(counted["rows_by_attempts"].items())),
        "discarded_frames": discarded,
        "discarded_share": discarded / (frames + discarded) if frames + discarded else None,
        "metrics": distributions,
    }


def worst_rows(table: pa.Table, limit: int) -> list[int]:
    """Indices of the rows with audio whose flags are most severe (rejected rows first), at
    most `limit`, worst first; rows without flags are not listed."""
    flags, status = _column(table, S.QUALITY_FLAGS), _column(table, S.STATUS)
    flagged = [i for i, f in enumerate(flags) if f and status[i] in (S.STATUS_OK, S.STATUS_REJECTED)]
    flagged.sort(key=lambda i: (status[i] != S.STATUS_REJECTED, tuple(-s for s in severity_key(flags[i])), i))
    return flagged[:limit]


def _e(v: Any) -> str:
    return html.escape("" if v is None else str(v), quote=True)


def _number(v: Optional[float]) -> str:
    return "–" if v is None else f"{v:.3g}"


def section(
    table: pa.Table, player: Callable[[int], str], limit: int = 12, reference: Optional[Callable[[int], str]] = None
) -> str:
    """The report's quality section: counts, metric distributions, and the worst rows with
    their flags and an audio player each (`player(row index)` gives its HTML, from the
    report's own audio reader; `reference(row index)` the player of the clip its voice came
    from, beside it)."""
    fig = figures(table)
    if not fig["rows_by_attempts"] and not fig["rows_by_flag"]:
        return '<h2>Quality</h2><p class="empty">No quality columns in this output.</p>'
    counts = [
        ("status", fig["rows_by_status"]),
        ("flag", fig["rows_by_flag"]),
        ("attempts", fig["rows_by_attempts"]),
    ]
    rows = "".join(
        f"<tr><th>{_e(kind)}</th><td>{_e(', '.join(f'{k}: {n:,}' for k, n in tally.items()) or '–')}</td></tr>"
        for kind, tally in counts
    )
    share = fig["discarded_share"]
    rows += f"<tr><th>regenerated</th><td>{fig['discarded_frames']:,} frames discarded"
    rows += f" ({share:.2%} of frames generated)</td></tr>" if share is not None else "</td></tr>"
    dist = "".join(
        f"<tr><th>{_e(name)}</th>" + "".join(f'<td class="num">{_number(v)}</td>' for v in values.values()) + "</tr>"
        for name, values in fig["metrics"].items()
    )
    dist_head = "".join(f"<th>{h}</th>" for h in ("metric", *(f"p{q}" for q in PERCENTILES), "mean"))
    worst = _worst_rows_table(table, player, limit, reference)
    return (
        f'<h2>Quality</h2><table class="kv">{rows}</table>'
        f'<table class="data"><thead><tr>{dist_head}</tr></thead><tbody>{dist}</tbody></table>'
        + (f"<h3>Worst rows</h3>{worst}" if worst else "")
    )


def _worst_rows_table(
    table: pa.Table, player: Callable[[int], str], limit: int, reference: Optional[Callable[[int], str]]
) -> str:
    """The worst rows: id, text, status, flags, the model-based scores present, the audio, and
    the reference clip beside it when the output names one."""
    picks = worst_rows(table, limit)
    if not picks:
        return ""
    ids, texts, flags = _column(table, S.ID), _column(table, S.TEXT), _column(table, S.QUALITY_FLAGS)
    status = _column(table, S.STATUS)
    scores = [n for n in (S.SPEAKER_SIMILARITY, S.MOS) if n in present_metrics(table)]
    values = {n: _column(table, n) for n in scores}
    show_reference = reference is not None and any(_column(table, S.REFERENCE)[i] for i in picks)
    head = ["id", "text", "status", "flags", *scores, "audio", *(["reference"] if show_reference else [])]
    body = "".join(
        f'<tr><td class="id">{_e(ids[i])}</td><td class="text">{_e((texts[i] or "")[:120])}</td>'
        f"<td>{_e(status[i])}</td><td>{_e(', '.join(flags[i]))}</td>"
        + "".join(f'<td class="num">{_number(values[n][i])}</td>' for n in scores)
        + f"<td>{player(i)}</td>"
        + (f"<td>{reference(i)}</td>" if show_reference else "")
        + "</tr>"
        for i in picks
    )
    cells = "".join(f"<th>{_e(h)}</th>" for h in head)
    return f'<table class="samples"><thead><tr>{cells}</tr></thead><tbody>{body}</tbody></table>'
