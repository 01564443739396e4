"""pipeline.report: report.html from a run's output directory.

A synthetic run (real FLAC bytes, ok and error rows, two Parquet files with small row
groups, summary.json) is rendered and the page is checked as HTML (plots, playable data
URIs that decode to the right durations, escaping of user data), on degenerate runs
(empty, all errors, audio by path, no finish times), through the CLI without torch, and in
a real headless Chromium (no console errors, every audio element loads and plays, a
screenshot kept under artifacts/)."""

from __future__ import annotations

import base64
import html
import io
import json
import os
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import soundfile as sf

from helpers import (
    CHROMIUM,
    COMMON_ERROR,
    EVIL_ERROR,
    EVIL_ID,
    EVIL_TEXT,
    REPO,
    audio_check,
    chromium,
    console_lines,
    make_rows,
    write_run,
)
from pipeline.report.page import write_report

SUMMARY = {
    "rows_ok": 26,
    "rows_error": 4,
    "audio_hours": 0.0086,
    "wall_s": 11.5,
    "rows_per_s": 2.6,
    "frames_per_s": 58.1,
    "rtf": 0.37,
    "model": "tiny-s2",
    "per_actor": {"actor-0": {"rows": 15, "audio_s": 16.0}, "actor-1": {"rows": 15, "audio_s": 15.0}},
}
BENCH = {"name": "slots sweep", "configs": [{"slots": 4, "rows_per_s": 1.5}, {"slots": 8, "rows_per_s": 2.7}]}


class Page(HTMLParser):
    """Collects what the assertions need: tag counts, audio srcs with their row id, table
    rows as text, and the page's text."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: dict[str, int] = {}
        self.audio: list[tuple[str, str]] = []  # (row id, src)
        self.rows: list[list[str]] = []
        self.srcs: list[str] = []
        self.text: list[str] = []
        self._row: list[str] | None = None
        self._cell: list[str] | None = None
        self._stack: list[str] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags[tag] = self.tags.get(tag, 0) + 1
        for k in ("src", "href"):
            if k in a:
                self.srcs.append(a[k])
        if tag == "tr":
            self._row = []
        elif tag in ("td", "th"):
            self._cell = []
        elif tag == "audio":
            rid = self._row[0] if self._row else ""
            self.audio.append((rid, a.get("src", "")))
        if tag not in ("br", "meta", "img", "input", "link", "path", "use", "rect", "line"):
            self._stack.append(tag)

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None and self._row is not None:
            self._row.append("".join(self._cell).strip())
            self._cell = None
        elif tag == "tr" and self._row is not None:
            self.rows.append(self._row)
            self._row = None
        if self._stack and self._stack[-1] == tag:
            self._stack.pop()

    def handle_data(self, data):
        self.text.append(data)
        if self._cell is not None:
            self._cell.append(data)


def parse(path: str) -> tuple[str, Page]:
    doc = Path(path).read_text(encoding="utf-8")
    page = Page()
    page.feed(doc)
    page.close()
    return doc, page


def audio_seconds(src: str) -> float:
    assert src.startswith("data:audio/flac;base64,"), src[:60]
    data, sr = sf.read(io.BytesIO(base64.b64decode(src.split(",", 1)[1])))
    return len(data) / sr


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("run")
    return write_run(out, make_rows(), summary=SUMMARY)


@pytest.fixture(scope="module")
def report(run_dir) -> str:
    return write_report(str(run_dir), title="Run <1> & co", max_audio_rows=12, bench=BENCH)


def test_report_page(run_dir, report):
    assert report == str(run_dir / "report.html")
    assert sorted(p.name for p in run_dir.iterdir()) == ["data", "report.html", "summary.json"]  # no temp left
    doc, page = parse(report)
    assert doc.startswith("<!DOCTYPE html>")

    # plots: inline SVG, at least throughput, latency, RTF, outcomes
    assert page.tags.get("svg", 0) >= 4
    # self-contained: nothing to fetch (no scripts, links or non-data sources)
    assert "script" not in page.tags and "link" not in page.tags
    assert all(s.startswith("data:") or s.startswith("#") for s in page.srcs), [s[:40] for s in page.srcs]

    # audio: 12 ok rows (spread over the run, the first included), each decodes to its row's length
    rows = {r["id"]: r for r in make_rows()}
    assert len(page.audio) == 12
    for rid, src in page.audio:
        assert rows[rid]["status"] == "ok"
        assert audio_seconds(src) == pytest.approx(rows[rid]["audio_seconds"], abs=1e-3)
    assert EVIL_ID in [rid for rid, _ in page.audio]
    assert any(rows[rid]["stop_reason"] == "budget" for rid, _ in page.audio)  # budget rows get a listen

    # user data is escaped: the hostile id/text/error read back as text, never as markup
    assert "<script" not in doc and "<img" not in doc and "<b>bold" not in doc
    assert html.escape(EVIL_ID, quote=True) in doc
    text = "".join(page.text)
    for s in (EVIL_ID, EVIL_TEXT, EVIL_ERROR):
        assert s in text
    assert "Run <1> & co" in text  # the title too

    # the error table counts messages, most common first
    errors = [r for r in page.rows if len(r) == 3 and r[2] in (COMMON_ERROR, EVIL_ERROR)]
    assert errors[0][:1] == ["3"] and errors[0][2] == COMMON_ERROR
    assert errors[1][0] == "1" and errors[1][2] == EVIL_ERROR
    # error rows also appear among the sample rows (status cell)
    assert sum(1 for r in page.rows if "error" in r and any(c in (COMMON_ERROR, EVIL_ERROR) for c in r)) >= 4

    # summary.json scalars, a nested per-actor table, and the bench configs table
    assert ["wall_s", "11.5"] in page.rows and ["rows_per_s", "2.6"] in page.rows
    assert any(r[:1] == ["actor-0"] for r in page.rows)
    assert ["4", "1.5"] in page.rows and ["8", "2.7"] in page.rows
    assert "rows ok" in text and "26" in text


def test_report_is_rewritten_atomically(run_dir, report, monkeypatch):
    before = Path(report).read_text(encoding="utf-8")
    import actors.files as rep  # write_report writes through it

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(rep.os, "replace", boom)
    with pytest.raises(OSError, match="disk full"):
        write_report(str(run_dir))
    assert Path(report).read_text(encoding="utf-8") == before  # the old page survives
    assert not [p for p in run_dir.iterdir() if p.name.startswith(".report-")]


def test_empty_and_all_error_runs(tmp_path):
    # no data/ at all
    empty = tmp_path / "empty"
    empty.mkdir()
    doc, page = parse(write_report(str(empty)))
    assert "no Parquet files" in doc and page.tags.get("audio", 0) == 0

    # a zero-row file
    zero = write_run(tmp_path / "zero", [], split=1)
    doc, page = parse(write_report(str(zero)))
    assert "No rows yet" in doc

    # every row failed: outcome plot and error table, no audio, no crash on empty histograms
    rows = make_rows(n=6, n_err=6)
    errs = write_run(tmp_path / "errs", rows, summary={"rows_ok": 0, "rows_error": 6})
    doc, page = parse(write_report(str(errs), max_audio_rows=0))
    assert page.tags.get("audio", 0) == 0
    assert page.tags.get("svg", 0) >= 2  # throughput + outcomes
    assert any(r[0] == "5" and r[2] == COMMON_ERROR for r in page.rows if len(r) == 3)
    assert "no data" in doc  # the histograms say so instead of plotting nothing


def test_audio_by_path_and_no_finish_times(tmp_path):
    out = tmp_path / "files"
    rows = make_rows(n=8, n_err=1, audio_as="path", finished_at=False, out=out)
    write_run(out, rows)
    doc, page = parse(write_report(str(out), max_audio_rows=3))
    assert len(page.audio) == 3
    for rid, src in page.audio:
        assert not src.startswith("data:") and not src.startswith("/")
        data, sr = sf.read(out / unquote(src))
        assert len(data) / sr == pytest.approx(next(r for r in rows if r["id"] == rid)["audio_seconds"], abs=1e-3)
    assert "output order" in doc  # throughput falls back to cumulative order


def test_cli_without_torch(run_dir, tmp_path):
    out = shutil.copytree(run_dir, tmp_path / "copy")
    (out / "report.html").unlink()
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps(BENCH))
    code = (
        "import runpy, sys; sys.argv = ['pipeline.report', sys.argv[1], 'report.title=cli run', "
        "'report.bench=' + sys.argv[2]]\ntry:\n    runpy.run_module('pipeline.report', run_name='__main__')\n"
        "except SystemExit as e:\n    assert not e.code, e.code\n"
        "assert 'torch' not in sys.modules, 'pipeline.report imported torch'\n"
    )
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run(
        [sys.executable, "-c", code, str(out), str(bench)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(out / "report.html")
    assert "cli run" in (out / "report.html").read_text(encoding="utf-8")
    # a missing directory is a usage error, not a traceback
    proc = subprocess.run(
        [sys.executable, "-m", "pipeline.report", str(tmp_path / "nope")],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "does not exist" in proc.stderr


# ---- the real browser -------------------------------------------------------------------


@pytest.mark.skipif(
    not CHROMIUM.exists(),
    reason="headless Chromium not installed at /usr/bin/chromium (apt-get install -y chromium chromium-driver)",
)
def test_report_in_chromium(report, tmp_path):
    rows = {r["id"]: r for r in make_rows()}

    # 1. the page as written: renders with no console output at all, and a screenshot is kept
    shot = tmp_path / "report-screenshot.png"
    proc = chromium(
        [f"--screenshot={shot}", "--window-size=1280,2000", Path(report).as_uri()], tmp_path / "profile-shot"
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert console_lines(proc.stderr) == []
    assert shot.is_file() and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert shot.stat().st_size > 50_000  # plots and tables drawn, not a blank page
    artifacts = REPO / "artifacts"
    artifacts.mkdir(exist_ok=True)
    shutil.copyfile(shot, artifacts / "report-screenshot.png")

    # 2. a copy with a probe script: every <audio> loads its data URI and plays, and nothing but
    # the probe's canary is logged (no errors)
    results, console = audio_check(Path(report), tmp_path)
    assert console == []
    assert len(results) == 12
    for r in results:
        assert "error" not in r, r
        assert r["readyState"] >= 1 and r["played"] is True, r
        assert r["duration"] == pytest.approx(rows[r["id"]]["audio_seconds"], abs=0.01)


def test_a_large_output_is_shown_from_a_bounded_sample(tmp_path, monkeypatch):
    """Above report_sample.SAMPLE_ROWS the page reads an evenly spread sample of rows per file
    (here 10 of 30), says so, and takes its totals from summary.json; the sample's audio is
    still its own rows' (read by their positions in the files)."""
    from pipeline.report import sample as report_sample

    rows = make_rows()
    out = write_run(tmp_path / "big", rows, summary={**SUMMARY, "rows_total": 30, "rows_ok": 26, "rows_error": 4})
    monkeypatch.setattr(report_sample, "SAMPLE_ROWS", 10)
    doc, page = parse(write_report(str(out), max_audio_rows=12))
    text = "".join(page.text)
    assert "30 rows: the plots and tables show an evenly spread sample of 10 of them" in text
    assert "the totals are summary.json's" in text
    by_id = {r["id"]: r for r in rows}
    shown = {rid for rid, _ in page.audio}
    assert 0 < len(shown) <= 10 and EVIL_ID in shown  # each file's first row is in its sample
    for rid, src in page.audio:
        assert audio_seconds(src) == pytest.approx(by_id[rid]["audio_seconds"], abs=1e-3)
    # summary.json's counts, not the sample's (at most 10 rows)
    assert '<div class="v">26</div><div class="k">rows ok</div>' in doc
    assert '<div class="v">4</div><div class="k">rows error</div>' in doc


def test_sample_quotas_and_positions(tmp_path):
    from pipeline.report import sample as report_sample

    assert report_sample.quotas([5, 0, 7], budget=100) == [5, 0, 7]
    assert report_sample.quotas([1000, 10, 3000], budget=400) == [100, 1, 299]
    spread = report_sample.positions(1000, 5)
    assert spread.tolist() == [0, 250, 500, 749, 999]
    table = pa.table({"x": pa.array(range(1000))})
    pq.write_table(table, tmp_path / "rows.parquet", row_group_size=64)
    got, rows = report_sample.read_rows(pq.ParquetFile(tmp_path / "rows.parquet"), ["x"], spread)
    assert got.column("x").to_pylist() == spread.tolist() == rows.tolist()
