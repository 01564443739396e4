"""How chorus writes things for people: durations (progress lines and the report page alike),
numbers, and report.html's HTML pieces (pipeline/report/page.py): escaping, tables, audio as
`data:` URIs or relative links, and the page's style sheet."""

from __future__ import annotations

import base64
import html
import json
import math
import os
import urllib.parse
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Optional

MAX_EMBED_BYTES = 8 * 1024 * 1024  # a larger clip is linked or left out, not inlined


def format_duration(seconds: Optional[float]) -> str:
    """'4.25 s', '12.3 s', '3m 05s', '1h 02m 03s'; '–' when unknown. The one way chorus
    writes a duration for people (progress lines, the report page)."""
    if seconds is None or not math.isfinite(seconds):
        return "–"
    if seconds < 60:
        return f"{seconds:.2f} s" if seconds < 10 else f"{seconds:.1f} s"
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m {secs:02d}s" if hours else f"{minutes}m {secs:02d}s"


def fmt(v: Any, digits: int = 3) -> str:
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


def esc(v: Any) -> str:
    return html.escape("" if v is None else str(v), quote=True)


def _td(cell: Any) -> str:
    if isinstance(cell, tuple):
        cls, content = cell
        return f'<td class="{esc(cls)}">{content}</td>'
    return f"<td>{cell}</td>"


def html_table(headers: Sequence[str], rows: Sequence[Sequence[Any]], cls: str = "") -> str:
    """Headers are escaped here; a cell is HTML already (escape user data before), or a
    (css class, HTML) pair."""
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(_td(c) for c in r) + "</tr>" for r in rows)
    return f'<table class="{esc(cls)}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def is_scalar(v: Any) -> bool:
    return v is None or isinstance(v, (str, int, float, bool))


def dicts_table(items: Sequence[dict], key_header: Optional[str] = None, keys: Sequence[str] = ()) -> str:
    cols: list[str] = []
    for d in items:
        for k in d:
            if k not in cols:
                cols.append(k)
    rows = []
    for key, d in zip(keys or [None] * len(items), items):
        cells = [] if key_header is None else [f"<b>{esc(key)}</b>"]
        for c in cols:
            v = d.get(c)
            cells.append(esc(fmt(v)) if is_scalar(v) else f"<code>{esc(json.dumps(v, default=str))}</code>")
        rows.append(cells)
    return html_table(([key_header] if key_header is not None else []) + cols, rows, "data")


def nested_summary(summary: dict) -> str:
    """Non-scalar summary fields: a dict of dicts or a list of dicts as a table, else JSON."""
    parts = []
    for k, v in summary.items():
        if is_scalar(v):
            continue
        if isinstance(v, dict) and v and all(isinstance(x, dict) for x in v.values()):
            body = dicts_table(list(v.values()), key_header=str(k), keys=[str(x) for x in v])
        elif isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
            body = dicts_table(v)
        else:
            body = f"<pre>{esc(json.dumps(v, indent=2, default=str))}</pre>"
        parts.append(f"<details><summary>{esc(k)}</summary>{body}</details>")
    return "".join(parts)


def audio_src(value: dict, output_dir: Path) -> tuple[Optional[str], str]:
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


def cut_text(text: Optional[str], limit: int) -> str:
    if text is None:
        return ""
    return text if len(text) <= limit else text[: limit - 1] + "…"


CSS = """
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
details.summary-file > summary h2 { display: inline; } .turns { font-size: 0.85em; color: var(--muted); }
pre { background: #fff; border: 1px solid var(--line); padding: 8px; overflow: auto; }
footer { color: var(--muted); font-size: 12px; margin-top: 32px; }
"""
