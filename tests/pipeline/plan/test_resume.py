"""Resume decisions against an existing output (issue 14, findings 3 and 4), in-process and
distributed: changed rows and transient errors redone, rejected rows done unless retried,
and a row refused by an earlier run planned afresh."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from actors import schema as S
from pipeline.errors import OutputMismatch
from pipeline.names import REJECTED_PART
from pipeline.output.layout import OutputLayout
from tests.helpers import decide_rows, hashes


@pytest.mark.parametrize("distributed", [False, True], ids=["in-process", "distributed"])
def test_resume_redoes_changed_rows_and_transient_errors(tmp_path, distributed, request):
    import pyarrow.fs as pafs

    from pipeline.plan.counts import count_decisions, refuse_changed
    from pipeline.plan.decide import decide, output_key_files
    from pipeline.plan.inputs import scan_input
    from pipeline.plan.keys import RowHasher
    from pipeline.plan.rules import Retry

    if distributed:
        request.getfixturevalue("ray_cluster")
    ids = ["same", "edited", "io-error", "bad-text", "pre-hash", "new"]
    pq.write_table(pa.table({"id": ids, "text": [f"text of {i}" for i in ids]}), tmp_path / "in.parquet")
    now = hashes(tmp_path / "in.parquet", "settings")
    layout = OutputLayout(str(tmp_path / "out"))
    layout.ensure()
    older = [  # copies an earlier run wrote, superseded by the newer ones below
        {S.ID: "same", S.STATUS: S.STATUS_ERROR, S.RETRYABLE: True, S.CONTENT_HASH: now["same"], S.RUN: "r0"},
        {S.ID: "edited", S.STATUS: S.STATUS_OK, S.CONTENT_HASH: now["edited"], S.RUN: "r0"},
    ]
    newer = [
        {S.ID: "same", S.STATUS: S.STATUS_OK, S.CONTENT_HASH: now["same"], S.RUN: "r1"},
        {S.ID: "edited", S.STATUS: S.STATUS_OK, S.CONTENT_HASH: "old", S.RUN: "r1"},
        {S.ID: "io-error", S.STATUS: S.STATUS_ERROR, S.RETRYABLE: True, S.CONTENT_HASH: now["io-error"], S.RUN: "r1"},
        {S.ID: "bad-text", S.STATUS: S.STATUS_ERROR, S.RETRYABLE: False, S.CONTENT_HASH: now["bad-text"], S.RUN: "r1"},
        {S.ID: "pre-hash", S.STATUS: S.STATUS_OK, S.RUN: "r1"},  # written before content hashes existed
    ]
    layout.write_part(S.output_table(older), "part-older.parquet")
    layout.write_part(S.output_table(newer), "part-newer.parquet")

    def verdicts(**kwargs):
        decided = decide_rows(tmp_path / "in.parquet", distributed=distributed, output=layout.location, **kwargs)
        return dict(zip(decided.column(S.ID).to_pylist(), decided.column("_decision").to_pylist()))

    assert verdicts() == {
        "same": "done",
        "bad-text": "done",
        "pre-hash": "done",
        "edited": "changed",
        "io-error": "retry",
        "new": "new",
    }
    assert verdicts(retry_errors=True)["bad-text"] == "retry"
    scan = scan_input(str(tmp_path / "in.parquet"), {})
    decided = decide(
        scan,
        RowHasher("settings", None, scan.root),
        output_key_files(layout.live_files()),
        pafs.LocalFileSystem(),
        Retry(),
        distributed,
    )
    summary = count_decisions(decided, scan.total_rows)
    assert summary.by_decision == {"done": 3, "changed": 1, "retry": 1, "new": 1} and summary.to_synthesize == 3
    with pytest.raises(OutputMismatch, match=r"1 rows changed since they were written \('edited'\)"):
        refuse_changed(summary)


@pytest.mark.parametrize("distributed", [False, True], ids=["in-process", "distributed"])
def test_rejected_rows_count_as_done_unless_retry_rejected(tmp_path, distributed, request):
    if distributed:
        request.getfixturevalue("ray_cluster")
    ids = ["ok", "rejected", "bad-text"]
    pq.write_table(pa.table({"id": ids, "text": [f"text of {i}" for i in ids]}), tmp_path / "in.parquet")
    now = hashes(tmp_path / "in.parquet", "settings")
    layout = OutputLayout(str(tmp_path / "out"))
    layout.ensure()
    written = [
        {S.ID: "ok", S.STATUS: S.STATUS_OK, S.CONTENT_HASH: now["ok"], S.RUN: "r1"},
        {
            S.ID: "rejected",
            S.STATUS: S.STATUS_REJECTED,
            S.QUALITY_FLAGS: ["no_audio"],
            S.CONTENT_HASH: now["rejected"],
            S.RUN: "r1",
        },
        {S.ID: "bad-text", S.STATUS: S.STATUS_ERROR, S.RETRYABLE: False, S.CONTENT_HASH: now["bad-text"], S.RUN: "r1"},
    ]
    layout.write_part(S.output_table(written), "part-r1.parquet")

    def verdicts(**kwargs):
        decided = decide_rows(tmp_path / "in.parquet", distributed=distributed, output=layout.location, **kwargs)
        return dict(zip(decided.column(S.ID).to_pylist(), decided.column("_decision").to_pylist()))

    assert verdicts() == {"ok": "done", "rejected": "done", "bad-text": "done"}
    assert verdicts(retry_errors=True) == {"ok": "done", "rejected": "done", "bad-text": "retry"}  # errors only
    assert verdicts(retry_rejected=True) == {"ok": "done", "rejected": "retry", "bad-text": "done"}


def test_a_row_refused_by_an_earlier_run_is_planned_afresh(tmp_path):
    # the rejected part answers the refusals of the run that wrote it; once the input is
    # fixed (the duplicate gone), the row is new, not "done" as that part's error row
    pq.write_table(pa.table({"id": ["dup", "other"], "text": ["fixed now", "x"]}), tmp_path / "in.parquet")
    layout = OutputLayout(str(tmp_path / "out"))
    layout.ensure()
    refused = S.error_row("dup", "duplicate id 'dup': 2 input rows share it", **{S.RUN: "r0"})
    layout.write_part(S.output_table([refused]), REJECTED_PART)
    decided = decide_rows(tmp_path / "in.parquet", output=layout.location)
    assert dict(zip(decided.column(S.ID).to_pylist(), decided.column("_decision").to_pylist())) == {
        "dup": "new",
        "other": "new",
    }
