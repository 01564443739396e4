"""The job's read: only the rows planning chose, each with its content hash, in small blocks.

Each fragment's rows to synthesize (pipeline/plan/todo.py TodoFragment) are cut into chunks of
about one actor's worth of rows, one read task each: it waits for the job's ReadAhead actor to
admit it (pipeline/run/readahead.py: the read never runs more than a window of rows ahead of the
rows written), reads the fragment's row group, keeps the chunk's rows and appends their
content hashes. Nothing a task does depends on the job's other rows.

The blocks are cut by the read itself (override_num_blocks: Ray Data splits each task's
output), not by repartition(target_num_rows_per_block=...): in Ray 2.60 that operator's tasks
ask for a whole CPU, which a node whose actors hold part of its CPU never has free, and the
run hangs. For the same reason the read holds a quarter CPU. A Datasource of our own also
skips read_parquet's remote sampling task (~0.8 s per run).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional

import pyarrow as pa
import pyarrow.compute as pc

from actors import schema as S
from actors.lru import LRU

from ..cluster import TASK_CPUS
from ..plan.inputs import InputScan, read_fragment
from ..plan.keys import ROW
from ..plan.todo import TodoFragment, todo_rows


@dataclass(frozen=True)
class Chunk:
    """Rows [start, stop) of one fragment's rows to synthesize (in file order): one read task."""

    number: int
    todo: TodoFragment
    start: int
    stop: int

    @property
    def rows(self) -> int:
        return self.stop - self.start


def chunks(todo: list[TodoFragment], rows: int) -> list[Chunk]:
    """Each fragment's rows cut into read tasks of at most `rows` rows. An in-process plan's
    rows travel with the task: each chunk carries only its own slice of them."""
    out = []
    for entry in todo:
        inline = entry.table.sort_by(ROW) if entry.table is not None else None
        for start in range(0, entry.rows, rows):
            stop = min(entry.rows, start + rows)
            if inline is None:
                out.append(Chunk(len(out), entry, start, stop))
            else:
                piece = TodoFragment(entry.fragment, stop - start, table=inline.slice(start, stop - start))
                out.append(Chunk(len(out), piece, 0, stop - start))
    return out


# a worker reads a fragment's chunks one after another: it decodes the row group (and reads the
# fragment's todo list) once, not once per chunk; one entry each bounds what a worker keeps
_FRAGMENTS: LRU[pa.Table] = LRU(1)
_TODO: LRU[pa.Table] = LRU(1)


def _cached(cache: LRU, key: str, load) -> pa.Table:
    value = cache.get(key)
    if value is None:
        value = load()
        cache.put(key, value)
    return value


def fragment_view(scan: InputScan, index: int) -> InputScan:
    """The scan as one read task needs it: its one file and fragment (a task's arguments are
    pickled with it: the whole scan would be every file and row group, once per task)."""
    fragment = scan.fragments[index]
    return replace(scan, files=[scan.files[fragment.file]], fragments=[replace(fragment, index=0, file=0)])


def read_chosen_rows(view: InputScan, chunk: Chunk, scope: str = "") -> pa.Table:
    """A chunk's rows to synthesize (canonical columns + content_hash), in file order; `view`
    is fragment_view of the chunk's fragment. `scope` (the run) keys the worker's cache: a
    worker lives on into the next run, and the input file may have changed under its name."""
    todo = chunk.todo
    fragment = view.fragments[0]
    key = f"{scope}:{view.files[0]}#{fragment.row_group}"
    if todo.path is None:  # planned in-process: the chunk's rows came with it, in file order
        chosen = todo.table
    else:
        chosen = _cached(_TODO, todo.path, lambda: todo_rows(todo).sort_by(ROW))
    chosen = chosen.slice(chunk.start, chunk.rows)
    table = _cached(_FRAGMENTS, key, lambda: read_fragment(view, fragment))
    table = table.take(pc.subtract(chosen.column(ROW), fragment.first_row))
    return table.append_column(S.CONTENT_HASH, chosen.column(S.CONTENT_HASH))


def _admitted_read(view: InputScan, chunk: Chunk, gate, scope: str) -> list[pa.Table]:
    import ray

    ray.get(gate.admit.remote(chunk.number, chunk.rows))
    return [read_chosen_rows(view, chunk, scope)]


def _datasource(scan: InputScan, work: list[Chunk], gate, scope: str):
    from ray.data.block import BlockMetadata
    from ray.data.datasource import Datasource, ReadTask

    class ChosenRows(Datasource):
        def get_name(self) -> str:
            return "ChosenRows"

        def estimate_inmemory_data_size(self) -> Optional[int]:
            return None

        def get_read_tasks(self, parallelism: int, per_task_row_limit=None, data_context=None) -> list:
            views = {index: fragment_view(scan, index) for index in {chunk.todo.fragment for chunk in work}}
            return [
                ReadTask(
                    lambda chunk=chunk, view=views[chunk.todo.fragment]: _admitted_read(view, chunk, gate, scope),
                    BlockMetadata(num_rows=chunk.rows, size_bytes=None, input_files=None, exec_stats=None),
                )
                for chunk in work
            ]

    return ChosenRows()


def read_dataset(
    scan: InputScan, todo: list[TodoFragment], rows_per_block: int, chunk_rows: int, gate, scope: str = ""
):
    """Ray Data dataset of the rows to synthesize, in blocks of about `rows_per_block` rows,
    so that a small table of text is spread over every actor instead of arriving as one block
    for one actor; read a chunk of `chunk_rows` at a time, each once `gate` (a ReadAhead
    actor) admits it, by one read task at a time; `scope` (the run id) keys the workers' caches."""
    return read_chunks(scan, chunks(todo, chunk_rows), rows_per_block, gate, scope)


def read_chunks(scan: InputScan, work: list[Chunk], rows_per_block: int, gate, scope: str = ""):
    """read_dataset of these chunks (some of a run's `chunks`: their numbers are the run's, so
    the gate counts each once whichever dataset reads it)."""
    import ray

    blocks = sum(-(-chunk.rows // rows_per_block) for chunk in work)
    return ray.data.read_datasource(
        _datasource(scan, work, gate, scope), num_cpus=TASK_CPUS, concurrency=1, override_num_blocks=max(1, blocks)
    )
