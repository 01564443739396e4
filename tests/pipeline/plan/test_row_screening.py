"""Rows the driver refuses before any actor sees them: unusable and duplicate ids, a ref_id
naming two clips (issue 14, finding 9); and ids as data, never paths, with safe and
distinct audio file stems."""

from __future__ import annotations

import pyarrow.compute as pc
import pytest

from actors import schema as S
from tests.helpers import decide_rows


@pytest.mark.parametrize("distributed", [False, True], ids=["in-process", "distributed"])
def test_driver_rejects_unusable_ids(bad_table, distributed, request):
    if distributed:
        request.getfixturevalue("ray_cluster")
    decided = decide_rows(bad_table.path, distributed=distributed)
    messages = {}
    for row in decided.filter(pc.equal(decided.column("_decision"), "rejected")).to_pylist():
        messages.setdefault(row[S.ID], []).append(row["_error"])
    for row_id, fragment in bad_table.rejected_by_driver.items():
        assert any(fragment in m for m in messages[row_id]), (row_id, messages.get(row_id))
    assert len(messages[bad_table.duplicate_id]) == 2  # every copy of a duplicate
    assert "duplicate id 'dup': 2 input rows share it" in messages["dup"][0]
    assert "bad.parquet row" in messages[None][0]  # says where the row is
    assert decided.num_rows == bad_table.table.num_rows  # one decision per input row


@pytest.mark.parametrize("row_id", ["../../x", "a/b", "..", ".", " ", "a\\b", "x\x00y", "\u202eevil", "spk/utt"])
def test_ids_are_data_and_never_paths(row_id):
    """Finding 9: ids with '/' were refused, though corpora name utterances speaker/utt. Any
    non-empty string is an id; its file name is a safe stem of its own."""
    assert S.id_problem(row_id) is None
    stem = S.audio_file_stem(row_id)
    assert "/" not in stem and "\\" not in stem and stem not in (".", "..") and stem.isascii()


@pytest.mark.parametrize("row_id", [None, "", "x" * 257, "bad\ud800", 7])
def test_ids_that_cannot_name_a_row_are_refused(row_id):
    assert S.id_problem(row_id)


def test_audio_file_stems_are_safe_and_distinct():
    ids = [
        "plain-id_1.v2",
        "with space",
        "Ünïcödé",
        "with space ",
        "semi;colon",
        "x" * 250,
        ".hidden",
        "trailing.",
        "CON",
        "a:b",
        "a_b",
        "a?b",
        "-dash",
    ]
    stems = [S.audio_file_stem(i) for i in ids]
    assert stems[0] == "plain-id_1.v2" and stems[8] == "CON"
    assert len(set(stems)) == len(stems)
    for stem in stems:
        assert "/" not in stem and "\\" not in stem and not stem.startswith(".") and len(stem) <= 100
        assert stem not in (".", "..") and stem.isascii()


@pytest.mark.parametrize("distributed", [False, True], ids=["in-process", "distributed"])
def test_a_ref_id_naming_two_clips_refuses_its_rows_naming_both(bad_table, distributed, request):
    if distributed:
        request.getfixturevalue("ray_cluster")
    decided = decide_rows(bad_table.path, distributed=distributed)
    rejected = decided.filter(pc.equal(decided.column("_reason"), "ref_id_conflict"))
    conflicts = dict(zip(rejected.column(S.ID).to_pylist(), rejected.column("_error").to_pylist()))
    assert sorted(conflicts) == sorted(bad_table.ref_id_conflicts)
    message = conflicts["bad-refid-b"]
    assert "'refs/speech.flac' (row 'bad-refid-a')" in message and "'refs/stereo.flac' (row 'bad-refid-b')" in message
    assert "ok-ref-id-1" not in conflicts  # two rows, one clip: fine
