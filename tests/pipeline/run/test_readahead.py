"""The job's read runs at most a window of rows ahead of the rows written (pipeline/readahead.py,
pipeline/todo_read.py), and a run's stream is cut into datasets of a bounded number of blocks
that read every chosen row once through one window (pipeline/executor_stats.py). Real Ray,
real Parquet."""

from __future__ import annotations

import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from actors import schema as S
from pipeline.plan.inputs import scan_input
from pipeline.plan.keys import FRAGMENT, ROW
from pipeline.plan.todo import TodoFragment
from pipeline.run import readahead
from pipeline.run.chosen_rows import chunks, read_chunks, read_dataset
from pipeline.run.executor_stats import blocks_of, segments


def test_window_follows_the_actors_blocks_and_holds_three_chunks():
    chunk = readahead.READ_CHUNK_ROWS
    assert readahead.chunk_rows(4, 16) == chunk
    assert readahead.chunk_rows(64, 128) == 64 * 128  # one actor's blocks, when more
    assert readahead.window_rows(actors=1, blocks_per_actor=4, rows_per_block=16) == 3 * chunk
    assert readahead.window_rows(actors=100, blocks_per_actor=8, rows_per_block=16) == 3 * 100 * 8 * 16
    assert readahead.window_rows(actors=8, blocks_per_actor=4, rows_per_block=16, configured=10) == chunk  # >= a chunk
    assert readahead.window_rows(actors=8, blocks_per_actor=4, rows_per_block=16, configured=50_000) == 50_000


def _admitted_within(gate, chunk: int, rows: int, seconds: float) -> bool:
    import ray

    ready, _ = ray.wait([gate.admit.remote(chunk, rows)], timeout=seconds)
    return bool(ready)


def test_admission_waits_for_room_and_a_retried_chunk_counts_once(ray_cluster):
    import ray

    gate = readahead.start(100)
    assert _admitted_within(gate, 0, 60, 10)
    assert not _admitted_within(gate, 1, 60, 1.0)  # 120 > 100: waits
    assert _admitted_within(gate, 0, 60, 10)  # chunk 0 again (a retried read task): no new rows
    ray.get(gate.release.remote(60))
    # chunk 1's first admit (still waiting) now fits; its second call returns at once
    assert _admitted_within(gate, 1, 60, 10)
    assert ray.get(gate.state.remote())["in_flight"] == 60
    ray.get(gate.release.remote(60))
    assert _admitted_within(gate, 2, 500, 10)  # larger than the window: admitted once it is empty
    assert ray.get(gate.state.remote())["in_flight"] == 500


def _input(tmp_path, rows: int, row_group: int):
    path = tmp_path / "input.parquet"
    table = pa.table({S.ID: [f"spk/{i:05d}" for i in range(rows)], S.TEXT: [f"text {i}" for i in range(rows)]})
    pq.write_table(table, path, row_group_size=row_group)
    scan = scan_input(str(path), {})
    todo = []
    for fragment in scan.fragments:
        chosen = list(range(fragment.first_row, fragment.first_row + fragment.rows, 2))  # every other row
        todo.append(
            TodoFragment(
                fragment.index,
                len(chosen),
                table=pa.table(
                    {
                        FRAGMENT: pa.array([fragment.index] * len(chosen), pa.int32()),
                        ROW: pa.array(chosen, pa.int64()),
                        S.CONTENT_HASH: [f"h{r}" for r in chosen],
                    }
                ),
            )
        )
    return scan, todo


def test_chunks_cover_each_fragments_rows_once(tmp_path):
    scan, todo = _input(tmp_path, rows=500, row_group=200)
    work = chunks(todo, 32)
    assert [c.number for c in work] == list(range(len(work)))
    assert sum(c.rows for c in work) == 250
    for entry in todo:  # inline rows: each chunk carries its own slice, in file order
        mine = [c for c in work if c.todo.fragment == entry.fragment]
        assert [c.rows for c in mine] == [min(32, entry.rows - s) for s in range(0, entry.rows, 32)]
        rows = [r for c in mine for r in c.todo.table.column(ROW).to_pylist()[c.start : c.stop]]
        assert rows == sorted(entry.table.column(ROW).to_pylist())


def test_the_read_stops_at_the_window_until_rows_are_released(ray_cluster, tmp_path):
    import ray

    scan, todo = _input(tmp_path, rows=1000, row_group=400)  # 500 chosen rows
    gate = readahead.start(64)  # two chunks of 32
    rows = []
    for batch in read_dataset(scan, todo, rows_per_block=16, chunk_rows=32, gate=gate).iter_batches(
        batch_size=None, batch_format="pyarrow", prefetch_batches=0
    ):
        rows.extend(batch.to_pylist())
        time.sleep(0.05)  # a slow consumer: the read has every chance to run ahead
        state = ray.get(gate.state.remote())
        assert state["admitted_rows"] - len(rows) <= 64 + 32, state
        ray.get(gate.release.remote(batch.num_rows))
    ids = [r[S.ID] for r in rows]
    assert sorted(ids) == [f"spk/{i:05d}" for i in range(0, 1000, 2)]  # every chosen row once
    assert {r[S.CONTENT_HASH] for r in rows} == {f"h{i}" for i in range(0, 1000, 2)}
    assert all(r[S.CONTENT_HASH] == "h" + str(int(r[S.ID][4:])) for r in rows)  # each with its own hash


def test_segments_cut_the_chunks_in_order_within_the_block_bound(tmp_path):
    scan, todo = _input(tmp_path, rows=1000, row_group=200)  # 5 fragments of 100 chosen rows
    work = chunks(todo, 32)  # 4 chunks a fragment: 32, 32, 32, 4 rows
    groups = segments(work, rows_per_block=16, max_blocks=5)
    assert [c for group in groups for c in group] == work  # each chunk once, in order
    assert all(sum(blocks_of(c, 16) for c in group) <= 5 for group in groups)
    assert [sum(blocks_of(c, 16) for c in group) for group in groups][:3] == [4, 5, 5]  # 2+2, 2+1+2, 2+2+1
    assert segments(work, rows_per_block=16, max_blocks=1) == [[c] for c in work]  # a chunk never splits
    assert segments(work, rows_per_block=16, max_blocks=10**6) == [work]


def test_datasets_one_after_another_read_every_chosen_row_once(ray_cluster, tmp_path):
    """The stream as several datasets through one gate: the chunks' numbers are the run's, so no
    dataset's chunk is taken for another's already admitted (it would run outside the window)."""
    import ray

    scan, todo = _input(tmp_path, rows=600, row_group=200)  # 300 chosen rows
    gate = readahead.start(1000)
    rows = []
    for work in segments(chunks(todo, 32), rows_per_block=16, max_blocks=8):
        rows.extend(read_chunks(scan, work, rows_per_block=16, gate=gate).take_all())
    assert sorted(r[S.ID] for r in rows) == [f"spk/{i:05d}" for i in range(0, 600, 2)]
    assert ray.get(gate.state.remote())["admitted_rows"] == 300


@pytest.mark.parametrize("configured", [0, -5])
def test_read_ahead_rows_must_be_positive(configured):
    from actors.synth.job_settings import ClusterSettings
    from pipeline.errors import ConfigError

    with pytest.raises(ConfigError, match="read_ahead_rows"):
        ClusterSettings(read_ahead_rows=configured).validate()


def test_a_rewritten_input_is_read_afresh_by_the_next_run(ray_cluster, tmp_path):
    """Read workers outlive a run and cache a decoded row group: the cache is per run, so an
    input rewritten under the same name between two runs is read as it is now."""
    scan, todo = _input(tmp_path, rows=64, row_group=64)

    def texts(scope: str) -> set:
        gate = readahead.start(1000)
        ds = read_dataset(scan, todo, rows_per_block=16, chunk_rows=32, gate=gate, scope=scope)
        return {r[S.TEXT] for r in ds.take_all()}

    assert texts("run-1") == {f"text {i}" for i in range(0, 64, 2)}
    path = tmp_path / "input.parquet"
    table = pq.read_table(path)
    pq.write_table(table.set_column(1, S.TEXT, pa.array([f"new {i}" for i in range(64)])), path, row_group_size=64)
    assert texts("run-2") == {f"new {i}" for i in range(0, 64, 2)}
