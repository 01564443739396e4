"""pipeline.metrics, the one layer of figures over an output table (summary.json, the
benchmark and the report use it): each figure against a row-by-row count of the same table,
and tables from foreign writers (numbers as text, timestamps, missing columns)."""

from __future__ import annotations

import datetime

import numpy as np
import pyarrow as pa
import pytest

from actors import schema as S
from pipeline.report import metrics
from pipeline.report.summary import summarize


def batch(actor: str, number: int, rows: int = 3) -> dict:
    return {
        S.BATCH_ID: f"{actor}:{number}",
        S.BATCH_ROWS: rows,
        S.BATCH_STARTED_AT: 100.0 + number,
        S.BATCH_PREP_MS: 10.0 * (number + 1),
        S.BATCH_ENGINE_MS: 200.0,
        S.BATCH_CODEC_MS: 30.0,
        S.BATCH_ENCODE_MS: 5.0,
        S.BATCH_ACTOR_INIT_MS: 1500.0,
        S.BATCH_PEAK_RSS_MB: 700.0 + number,
        S.BATCH_KV_BYTES: 4096,
    }


def rows() -> list[dict]:
    out = []
    for i in range(12):
        actor = ("a", "b")[i % 2]
        row = {S.ID: f"r{i}", S.ACTOR: actor, S.NODE: "n", S.DEVICE: "cpu", S.RUN: "one" if i < 9 else "two"}
        row[S.BATCH] = batch(actor, i // 6)
        if i in (3, 4, 7):
            row.update({S.STATUS: S.STATUS_ERROR, S.ERROR: "long " + "x" * 200 + str(i) if i != 7 else "short"})
        else:
            row.update(
                {
                    S.STATUS: S.STATUS_OK,
                    S.AUDIO_SECONDS: 0.5 + i,
                    S.N_FRAMES: 10 + i,
                    S.RTF: 0.1 * (i + 1),
                    S.TOTAL_MS: 100.0 * (i + 1),
                    S.FINISHED_AT: 1000.0 + i,
                }
            )
        out.append(row)
    out.append({S.ID: None, S.STATUS: S.STATUS_ERROR, S.ERROR: "duplicate id", S.RUN: "one"})  # driver-rejected
    return out


@pytest.fixture
def table() -> pa.Table:
    return metrics.normalise(S.output_table(rows()))


def test_counts_totals_and_percentiles(table):
    source = rows()
    ok = [r for r in source if r[S.STATUS] == S.STATUS_OK]
    assert metrics.counts(table) == {"rows": 13, "rows_ok": len(ok), "rows_error": 13 - len(ok), "rows_rejected": 0}
    ok_table = metrics.ok_rows(table)
    assert metrics.total(ok_table, S.N_FRAMES) == sum(r[S.N_FRAMES] for r in ok)
    assert isinstance(metrics.total(ok_table, S.N_FRAMES), int)
    assert metrics.total(ok_table, S.AUDIO_SECONDS) == pytest.approx(sum(r[S.AUDIO_SECONDS] for r in ok))
    latency = [r[S.TOTAL_MS] for r in ok]
    assert metrics.percentiles(ok_table.column(S.TOTAL_MS), [50, 95, 99]) == pytest.approx(
        list(np.percentile(latency, [50, 95, 99]))
    )
    assert metrics.percentiles(pa.array([None, float("nan")], pa.float64()), [50]) == [None]
    assert metrics.run_rows(table, "two").num_rows == 3


def test_error_kinds_most_common_first(table):
    kinds = metrics.error_kinds(table)
    assert [k["rows"] for k in kinds] == [1, 1, 1, 1]
    assert [k["example_id"] for k in kinds] == ["r3", "r4", "r7", None]  # ties in order of appearance
    # cut to 160 characters, the two long messages are one kind, counted first
    cut = metrics.error_kinds(table, limit=2, max_chars=160)
    assert cut == [
        {"error": ("long " + "x" * 200)[:160], "rows": 2, "example_id": "r3"},
        {"error": "short", "rows": 1, "example_id": "r7"},
    ]


def test_per_actor_matches_a_row_by_row_count(table):
    figures = metrics.per_actor(table, wall_s=4.0)
    assert list(figures) == ["a", "b"]  # the rejected row (no actor) is left out
    for actor, f in figures.items():
        mine = [r for r in rows() if r.get(S.ACTOR) == actor]
        ok = [r for r in mine if r[S.STATUS] == S.STATUS_OK]
        assert (f["rows"], f["rows_ok"], f["rows_error"]) == (len(mine), len(ok), len(mine) - len(ok))
        assert f["frames"] == sum(r[S.N_FRAMES] for r in ok) and f["frames_per_s"] == f["frames"] / 4.0
        assert f["audio_s"] == pytest.approx(sum(r[S.AUDIO_SECONDS] for r in ok))
        assert f["row_rtf_p50"] == pytest.approx(float(np.percentile([r[S.RTF] for r in ok], 50)))
        assert f["latency_ms_p50"] == pytest.approx(float(np.percentile([r[S.TOTAL_MS] for r in ok], 50)))
        assert (f["node"], f["device"]) == ("n", "cpu")


def test_batches_once_per_call_and_per_actor_sums():
    meta = S.output_table(rows())
    calls = metrics.batches(meta)
    assert calls.column(S.BATCH_ID).to_pylist() == ["a:0", "b:0", "a:1", "b:1"]
    per_actor = metrics.actor_batches(calls).to_pylist()
    assert [a["actor"] for a in per_actor] == ["a", "b"]
    a = per_actor[0]
    assert a[f"{S.BATCH_PREP_MS}_sum"] == 10.0 + 20.0 and a[f"{S.BATCH_ROWS}_sum"] == 6
    assert a[f"{S.BATCH_PEAK_RSS_MB}_max"] == 701.0 and a[f"{S.BATCH_STARTED_AT}_min"] == 100.0


def test_foreign_tables_are_read_leniently():
    stamp = datetime.datetime(2024, 1, 1, tzinfo=datetime.timezone.utc)
    foreign = pa.table(
        {
            S.STATUS: ["ok", "ok", "error"],
            S.TOTAL_MS: ["100", "oops", None],  # numbers as text, one unreadable
            S.FINISHED_AT: pa.array([stamp, stamp, None], pa.timestamp("ms", tz="UTC")),
            S.ACTOR: [1, 2, None],  # not text
        }
    )
    table = metrics.normalise(foreign)
    assert table.column(S.TOTAL_MS).to_pylist() == [100.0, None, None]
    assert table.column(S.FINISHED_AT).to_pylist()[0] == stamp.timestamp()
    assert table.column(S.ACTOR).to_pylist() == ["1", "2", None]
    assert table.column(S.AUDIO_SECONDS).null_count == 3  # missing: all null
    assert metrics.counts(table) == {"rows": 3, "rows_ok": 2, "rows_error": 1, "rows_rejected": 0}
    assert metrics.error_kinds(table, name_missing=True)[0]["error"] == "(no message; status='error')"


def test_summary_figures(table):
    summary = summarize(S.output_table(rows()), "one", 2.0, {"extra": 1})
    assert summary["extra"] == 1 and summary["rows_total"] == 13 and summary["run_rows"] == 10
    assert summary["top_errors"][0] == {"error": ("long " + "x" * 200)[:160], "rows": 2}
    assert set(summary["per_actor"]["a"]) == {
        "node",
        "device",
        "rows",
        "rows_ok",
        "rows_error",
        "audio_s",
        "frames",
        "row_rtf_p50",
        "rows_per_s",
        "frames_per_s",
        "slot_occupancy",
        "engine_busy",
    }
    run_ok = [r for r in rows() if r[S.RUN] == "one" and r[S.STATUS] == S.STATUS_OK]
    assert summary["frames_per_s"] == sum(r[S.N_FRAMES] for r in run_ok) / 2.0
    assert summary["rtf"] == pytest.approx(2.0 / sum(r[S.AUDIO_SECONDS] for r in run_ok))


def test_error_kinds_ties_go_to_the_message_seen_first():
    """The stated tie-break, not a hash group-by's own order (which differs from the order of
    first appearance once there are a few dozen messages)."""
    messages = [f"failure {k:02d} " + "x" * (k % 7) for k in range(40)]
    order = messages[::-1][:20] + messages[:20]  # first appearance: not sorted, not hash order
    rows = [{S.ID: f"r{i}", S.STATUS: S.STATUS_ERROR, S.ERROR: m} for i, m in enumerate(order)]
    rows.append({S.ID: "again", S.STATUS: S.STATUS_ERROR, S.ERROR: order[30]})
    kinds = metrics.error_kinds(metrics.normalise(S.output_table(rows)))
    assert [k["error"] for k in kinds] == [order[30]] + [m for m in order if m != order[30]]
    assert kinds[0]["rows"] == 2 and kinds[0]["example_id"] == "r30"
