"""The output directory, without Ray: parts written whole and idempotently, the output bound
to its input, temp files that belong to their writer, rows redone by a later run on disk
once, and overwrite that deletes only chorus's files (issue 14, finding 6)."""

from __future__ import annotations

import json
import os

import pyarrow.parquet as pq
import pytest

from actors import schema as S
from actors.files import TEMP_PREFIX
from pipeline.config import compose_typed
from pipeline.errors import OutputMismatch
from pipeline.names import IDENTITY_FILE, part_name
from pipeline.output.layout import OutputLayout
from pipeline.output.parts import write_block
from pipeline.run.steps import run
from tests.helpers import ok_row


def row(row_id: str, run_id: str, status: str = S.STATUS_OK, finished: float = 1.0) -> dict:
    return {S.ID: row_id, S.STATUS: status, S.RUN: run_id, S.FINISHED_AT: finished}


def test_parts_are_atomic_and_idempotent(tmp_path):
    layout = OutputLayout(str(tmp_path / "out"))
    layout.ensure()
    table = S.output_table([ok_row("a"), ok_row("b"), S.error_row("c", "text is empty")])
    stats = write_block(table, layout.location).to_pylist()
    write_ms = stats[0].pop("write_ms")
    assert write_ms > 0
    assert stats == [
        {
            "rows": 3,
            "ok": 2,
            "errors": 1,
            "audio_seconds": 0.5,
            "frames": 10,
            "part": part_name(table.column(S.ID).to_pylist()),
            "bytes": os.path.getsize(os.path.join(layout.data_dir, part_name(table.column(S.ID).to_pylist()))),
            "slot_rows": 0.0,  # these rows carry no batch figures
            "slot_steps": 0.0,
            "store_retries": 0,  # a local output: no object-store call
        }
    ]
    write_block(table, layout.location)  # a retried write replaces its own file
    assert [os.path.basename(p) for p in layout.parts()] == [stats[0]["part"]]
    assert not [p for p in os.listdir(layout.data_dir) if p.startswith(TEMP_PREFIX)]
    # a torn file left by a killed writer is never read as data, and goes at the next start
    (tmp_path / "out" / "data" / f"{TEMP_PREFIX}123-part-x.parquet").write_bytes(b"PAR1 torn")
    assert sorted(layout.done_ids().to_pylist()) == ["a", "b", "c"]
    assert layout.clean_temp() == 1


def test_output_is_bound_to_its_model_not_to_its_input(tmp_path):
    """Issue 57: an input that grows, shrinks or moves keeps its output (the marker follows
    the latest input); another model's rows are refused, the message naming both models and
    both inputs; an output written before the binding changed (with the input's ids and row
    count in its marker) is still the same model's."""
    layout = OutputLayout(str(tmp_path / "out"))
    one = {"model": "m", "checkpoint": "ckpt", "input": "/data/a/input.parquet"}
    assert layout.claim(one, overwrite=False) is None
    write_block(S.output_table([ok_row("a")]), layout.location)
    moved = dict(one, input="/data/b/input.parquet")
    assert layout.claim(moved, overwrite=False) == one  # a rerun on a moved, grown input: fine
    assert json.loads(layout.read_text(IDENTITY_FILE)) == moved
    other = {"model": "m2", "checkpoint": "ckpt2", "input": "/data/c/input.parquet"}
    with pytest.raises(OutputMismatch) as refused:
        layout.claim(other, overwrite=False)
    message = str(refused.value)
    for words in (layout.location, "'m'", "/data/b/input.parquet", "'m2'", "/data/c/input.parquet", "overwrite=true"):
        assert words in message, (words, message)
    assert layout.parts()  # refused: nothing deleted
    layout.claim(other, overwrite=True)
    assert layout.parts() == [] and json.loads(layout.read_text(IDENTITY_FILE)) == other
    # a marker of the earlier format (bound to the input's ids) is the same model's output
    layout.write_text(
        IDENTITY_FILE, json.dumps({"input_rows": 5, "input_ids": "abc", "model": "m2", "checkpoint": "ckpt2"})
    )
    assert layout.claim(other, overwrite=False)["input_ids"] == "abc"
    assert json.loads(layout.read_text(IDENTITY_FILE)) == other


def test_temp_files_belong_to_their_writer(tmp_path):
    layout = OutputLayout(str(tmp_path / "out"))
    layout.ensure()
    mine = tmp_path / "out" / "data" / f"{TEMP_PREFIX}run-a-123-abcd-part-x.parquet"
    theirs = tmp_path / "out" / "data" / f"{TEMP_PREFIX}run-b-456-abcd-part-y.parquet"
    mine.write_bytes(b"PAR1")
    theirs.write_bytes(b"PAR1")
    assert layout.clean_temp(keep_run="run-a") == 1
    assert mine.exists() and not theirs.exists()


def test_rows_redone_by_a_later_run_are_on_disk_once(tmp_path):
    layout = OutputLayout(str(tmp_path / "out"))
    layout.ensure()
    write_block(S.output_table([row("a", "r1"), row("b", "r1", S.STATUS_ERROR)]), layout.location, "r1")
    write_block(S.output_table([row("b", "r2"), row("c", "r2")]), layout.location, "r2")
    write_block(S.output_table([row("d", "r1"), row("dup", "r1")]), layout.location, "r1")
    raw = layout.read(latest_only=False).column(S.ID).to_pylist()
    assert sorted(raw) == ["a", "b", "b", "c", "d", "dup"]
    latest = {r[S.ID]: r for r in layout.read().to_pylist()}
    assert sorted(latest) == ["a", "b", "c", "d", "dup"] and latest["b"][S.RUN] == "r2"
    # "dup" is refused by the driver now: its old row goes too
    import pyarrow as pa

    from pipeline.output.supersede import drop_in_process

    assert drop_in_process(layout, pa.array(["dup"])) == 2
    rows = layout.read(latest_only=False).to_pylist()
    assert sorted((r[S.ID], r[S.RUN]) for r in rows) == [("a", "r1"), ("b", "r2"), ("c", "r2"), ("d", "r1")]
    for part in layout.parts():
        pq.read_table(part)  # every rewritten part is whole


def test_overwrite_never_deletes_what_chorus_did_not_write(tmp_path):
    thesis = tmp_path / "mine" / "data" / "chapters" / "thesis.txt"
    thesis.parent.mkdir(parents=True)
    thesis.write_text("years of work")
    for overwrite in ("false", "true"):
        with pytest.raises(OutputMismatch, match="not a chorus output"):
            run(compose_typed([f"output.dir={tmp_path}/mine", f"output.overwrite={overwrite}"]))
    assert thesis.read_text() == "years of work"
    assert sorted(os.listdir(tmp_path / "mine")) == ["data"]  # no lease, no marker left behind

    layout = OutputLayout(str(tmp_path / "ours"))
    layout.claim({"input": "a"}, overwrite=False)
    write_block(S.output_table([row("a", "r1")]), layout.location)
    notes = tmp_path / "ours" / "data" / "notes.txt"
    notes.write_text("a user's file beside chorus's")
    layout.claim({"input": "b"}, overwrite=True)
    assert layout.parts() == [] and notes.read_text() == "a user's file beside chorus's"
    assert json.loads(layout.read_text(IDENTITY_FILE)) == {"input": "b"}
