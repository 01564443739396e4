"""The run's end pass that leaves each id on disk once (pipeline/supersede.py): the
in-process and the distributed (Ray Data) way give the same files' rows on the same output,
and the pass is skipped, touching nothing, only when no id can have two copies."""

from __future__ import annotations

import os
import shutil

import pyarrow.parquet as pq
import pytest

from actors import schema as S
from pipeline.names import REJECTED_PART
from pipeline.output import shards, supersede
from pipeline.output.layout import OutputLayout
from pipeline.output.parts import write_block
from pipeline.plan.counts import DecisionCounts

R1, R2 = "20260101-000000-aaaaaa", "20260102-000000-bbbbbb"


def row(row_id: str, run: str, finished: float, tag: str) -> dict:
    """A row whose `text` names the copy it is, so a test can tell which copy stayed."""
    return {
        S.ID: row_id,
        S.STATUS: S.STATUS_OK,
        S.AUDIO: {S.AUDIO_BYTES: f"{row_id}|{tag}".encode() * 20, S.AUDIO_PATH: None},
        S.AUDIO_SECONDS: 0.5,
        S.N_FRAMES: 10,
        S.RUN: run,
        S.FINISHED_AT: finished,
        S.TEXT: tag,
    }


def copies_output(root) -> OutputLayout:
    """An output holding older copies in every shape the pass meets: shards and parts of an
    earlier run, a later run's redone rows, a part and a shard every row of which is
    superseded, two copies tied on run and finish time (the read order decides), a refused
    id, a null id kept, and the rejected part naming the refused ids (never touched)."""
    layout = OutputLayout(str(root))
    layout.claim({"input": "copies"}, overwrite=False, run_id=R2)
    first = [f"a{k:02d}" for k in range(60)]
    for start in range(0, 40, 5):  # 8 parts packed into 2 shards: a00..a19 and a20..a39
        write_block(
            S.output_table([row(i, R1, 100.0 + k, "r1") for k, i in enumerate(first[start : start + 5])]),
            layout.location,
            R1,
        )
        if start in (15, 35):
            shards.compact_all(layout, R1, 1 << 30, 20)
    for start in range(40, 60, 5):  # 4 parts that stay parts
        write_block(
            S.output_table([row(i, R1, 200.0 + k, "r1") for k, i in enumerate(first[start : start + 5])]),
            layout.location,
            R1,
        )
    redo = first[0:20] + first[40:45] + first[50:52] + first[30:31]  # shard 1 and part a40..a44 wholly
    for start in range(0, len(redo), 7):
        batch = [row(i, R2, 300.0 + k, "r2") for k, i in enumerate(redo[start : start + 7])]
        write_block(S.output_table(batch), layout.location, R2)
    tie = [row("a55", R2, 400.0, "tie-x"), row("x1", R2, 400.0, "x")]  # same run, same finish
    write_block(S.output_table(tie), layout.location, R2)
    write_block(S.output_table([row("a55", R2, 400.0, "tie-y"), row("y1", R2, 400.0, "y")]), layout.location, R2)
    nulls = S.output_table([row("n1", R2, 1.0, "n"), {**row("n2", R2, 1.0, "n"), S.ID: None}])
    layout.write_part(nulls, f"part-{R2}-nulls.parquet", owner=R2)
    refused = [S.error_row(i, "duplicate id", **{S.RUN: R2}) for i in ("a33", "dup")] + [
        S.error_row(None, "null id", **{S.RUN: R2})
    ]
    layout.write_part(S.output_table(refused), REJECTED_PART, owner=R2)
    return layout


def on_disk(layout: OutputLayout) -> list[tuple]:
    table = layout.read([S.ID, S.RUN, S.FINISHED_AT, S.TEXT, S.AUDIO], latest_only=False)
    rows = [
        (r[S.ID], r[S.RUN], r[S.FINISHED_AT], r[S.TEXT], (r[S.AUDIO] or {}).get(S.AUDIO_BYTES))
        for r in table.to_pylist()
    ]
    return sorted(rows, key=lambda r: (r[0] or "", r[1] or "", r[3] or ""))


@pytest.mark.parametrize(
    "driver_drops", [pytest.param(None, marks=pytest.mark.slow), 0], ids=["drops-grouped-here", "drops-grouped-by-ray"]
)
def test_both_ways_leave_the_same_rows(ray_cluster, tmp_path, driver_drops):
    here = copies_output(tmp_path / "here")
    shutil.copytree(tmp_path / "here", tmp_path / "ray")
    there = OutputLayout(str(tmp_path / "ray"))
    # what readers see now, less the refused id's synthesized copy: what must be left on disk
    latest = here.read([S.ID, S.RUN, S.STATUS, S.TEXT]).to_pylist()
    expected = sorted(
        (r[S.ID] or "", r[S.RUN], r[S.TEXT] or "") for r in latest if (r[S.ID], r[S.STATUS]) != ("a33", S.STATUS_OK)
    )
    removed_here = supersede.drop_in_process(here)  # both read the refused ids from the rejected part
    removed_there = supersede.drop_distributed(there, supersede.row_files(there), driver_drops)
    # the 28 redone rows' old copies, a55's r1 copy and the tie's loser, the refused a33
    assert removed_here == removed_there == 28 + 2 + 1
    assert on_disk(here) == on_disk(there)
    assert sorted((r[0] or "", r[1], r[3] or "") for r in on_disk(there)) == expected
    assert [r[2] for r in expected if r[0] == "a55"] in (["tie-x"], ["tie-y"])  # the later read of the tie
    for path in there.live_files():
        pq.read_table(path)  # every rewritten file whole
    # the wholly superseded part is gone; the wholly superseded shard left an empty successor
    assert any(pq.read_metadata(p).num_rows == 0 for p in there.live_files() if "/shard-" in p)


def plan(pruned: bool = False, **counts) -> supersede.PlannedRows:
    return DecisionCounts(rows_total=sum(counts.values()), by_decision=counts).planned_rows(pruned)


def test_skipped_only_when_the_footers_prove_one_copy_each(ray_cluster, tmp_path):
    layout = OutputLayout(str(tmp_path / "out"))
    layout.claim({"input": "once"}, overwrite=False, run_id=R1)
    for start in range(0, 20, 5):
        write_block(S.output_table([row(f"b{k}", R1, 1.0, "r1") for k in range(start, start + 5)]), layout.location, R1)
    none = 0  # refused ids
    before = {
        name: os.stat(tmp_path / "out" / "data" / name).st_mtime_ns for name in os.listdir(tmp_path / "out" / "data")
    }
    files = supersede.row_files(layout)
    assert not supersede.may_hold_copies(plan(new=5, done=15), none, supersede.footer_rows(layout, files))
    assert supersede.drop_superseded(layout, plan(new=5, done=15), none, distributed=True) == 0
    after = {
        name: os.stat(tmp_path / "out" / "data" / name).st_mtime_ns for name in os.listdir(tmp_path / "out" / "data")
    }
    assert after == before  # not a file read for rows, none rewritten
    # ids the input no longer names: kept, they are rows on disk beyond the accepted ones
    assert not supersede.may_hold_copies(plan(new=5, done=12, removed=3), none, 20)
    assert supersede.may_hold_copies(plan(new=5, done=12, removed=3, pruned=True), none, 20)
    # the plan's own reasons
    assert supersede.may_hold_copies(plan(new=5, changed=1, done=14), none, 21)
    assert supersede.may_hold_copies(plan(new=5, retry=1, done=14), none, 21)
    assert supersede.may_hold_copies(plan(new=20), 1, 20)
    # a run killed while redoing b3 left its new copy next to the old: planned as done now
    write_block(S.output_table([row("b3", R2, 2.0, "r2-killed")]), layout.location, R2)
    assert supersede.drop_superseded(layout, plan(new=0, done=20), none, distributed=True) == 1
    [b3] = [r for r in layout.read([S.ID, S.TEXT], latest_only=False).to_pylist() if r[S.ID] == "b3"]
    assert b3[S.TEXT] == "r2-killed"


@pytest.mark.parametrize("distributed", [False, True], ids=["in-process", "distributed"])
def test_the_run_end_keeps_each_id_once(request, tmp_path, distributed):
    if distributed:
        request.getfixturevalue("ray_cluster")
    layout = copies_output(tmp_path / "out")
    removed = supersede.drop_superseded(layout, plan(done=60, changed=28), 2, distributed)
    assert removed == 31  # the 28 old copies, a55's r1 copy, the tie's loser and the refused a33
    rows = [r for r in layout.read([S.ID, S.STATUS], latest_only=False).to_pylist() if r[S.ID] not in (None, "dup")]
    ids = [r[S.ID] for r in rows]
    assert len(ids) == len(set(ids)) == 60 + 3
    assert [r[S.STATUS] for r in rows if r[S.ID] == "a33"] == [S.STATUS_ERROR]  # the rejected part's row alone


def test_a_streamed_part_is_whole_typed_and_replaced_when_empty(tmp_path):
    """The rejected part is written a batch at a time (never held whole): every batch's rows
    in order, the features metadata on it, no temporary file left; a run refusing nothing
    removes an earlier run's part."""
    layout = OutputLayout(str(tmp_path / "out"))
    layout.claim({"input": "stream"}, overwrite=False, run_id=R1)
    batches = [
        S.output_table([S.error_row(f"bad{b}-{k}", "null id", **{S.RUN: R1}) for k in range(3)]) for b in range(4)
    ]
    written = layout.write_part_stream(iter(batches), REJECTED_PART, owner=R1)
    path = tmp_path / "out" / "data" / REJECTED_PART
    table = pq.read_table(path)
    assert written == table.num_rows == 12
    assert table.column(S.ID).to_pylist() == [f"bad{b}-{k}" for b in range(4) for k in range(3)]
    assert b"huggingface" in pq.read_schema(path).metadata
    assert os.listdir(tmp_path / "out" / "data") == [REJECTED_PART]
    assert layout.write_part_stream(iter([S.output_table([])]), REJECTED_PART, owner=R2) == 0
    assert not path.exists()


@pytest.mark.parametrize("distributed", [False, True], ids=["in-process", "distributed"])
def test_pruning_removes_every_copy_of_the_removed_ids(request, tmp_path, distributed):
    """output.on_removed=prune: every row of the ids the input no longer names goes (both
    copies of a redone one, from shards and parts alike); the others stay, each once."""
    import pyarrow as pa

    layout = copies_output(tmp_path / "out")
    gone = ["a00", "a41", "a55", "a59"]  # in a rewritten shard, a superseded part, a tie, a part
    if distributed:
        import ray

        request.getfixturevalue("ray_cluster")
        pruned = ray.data.from_items([{S.ID: i} for i in gone])
    else:
        pruned = pa.array(gone)
    planned = plan(pruned=True, done=60 - len(gone), changed=28, removed=len(gone))
    supersede.drop_superseded(layout, planned, 2, distributed, pruned)
    rows = [r for r in layout.read([S.ID], latest_only=False).to_pylist() if r[S.ID] not in (None, "dup")]
    ids = [r[S.ID] for r in rows]
    assert len(ids) == len(set(ids)) and not set(gone) & set(ids)
    assert len([i for i in ids if i.startswith("a")]) == 60 - len(gone)
