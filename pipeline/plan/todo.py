"""The rows to synthesize, listed per fragment: in-process for a small job's decided table; for
a distributed plan a shuffle by fragment whose tasks write one file per fragment under the
run's plan folder (pipeline/names.py PLAN_DIR), so the driver keeps only paths and counts.
The run's read (pipeline/run/chosen_rows.py) reads them a chunk at a time."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Optional

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from actors import schema as S
from actors.files import atomic_open

from ..cluster import PARTITION_ROWS, TASK_CPUS
from . import rules as P
from .decide import Decided, is_decision, map_blocks
from .keys import FRAGMENT, ROW

TODO_COLUMNS = [FRAGMENT, ROW, S.CONTENT_HASH]


@dataclass
class TodoFragment:
    """One fragment's rows to synthesize: inline (row, content hash), or a file of them."""

    fragment: int
    rows: int
    table: Optional[pa.Table] = None
    path: Optional[str] = None


def todo_fragments(decided: Decided, plan_dir: Optional[str]) -> list[TodoFragment]:
    """Group the rows to synthesize by fragment: in-process for a table; for a dataset, a
    shuffle by fragment whose tasks write one file per fragment under `plan_dir` (the driver
    keeps the paths and counts)."""
    keep = is_decision(*P.TO_SYNTHESIZE)
    if not decided.distributed:
        todo = decided.table.filter(keep(decided.table)).select(TODO_COLUMNS)
        out = []
        for fragment in sorted(set(todo.column(FRAGMENT).to_pylist())):
            rows = todo.filter(pc.equal(todo.column(FRAGMENT), fragment))
            out.append(TodoFragment(fragment, rows.num_rows, table=rows))
        return out
    os.makedirs(plan_dir, exist_ok=True)
    todo = decided.dataset.map_batches(
        lambda t: t.filter(keep(t)).select(TODO_COLUMNS), batch_format="pyarrow", batch_size=None, num_cpus=TASK_CPUS
    )
    partitions = max(1, math.ceil(decided.dataset.count() / PARTITION_ROWS))
    written = map_blocks(todo.repartition(partitions, shuffle=True, keys=[FRAGMENT]), _write_todo, plan_dir=plan_dir)
    return [
        TodoFragment(r["fragment"], r["rows"], path=r["path"])
        for r in sorted(written.take_all(), key=lambda r: r["fragment"])
    ]


def _write_todo(todo: pa.Table, plan_dir: str) -> pa.Table:
    out = []
    for fragment in sorted(set(todo.column(FRAGMENT).to_pylist())):
        rows = todo.filter(pc.equal(todo.column(FRAGMENT), fragment)).sort_by(ROW)
        path = os.path.join(plan_dir, f"todo-{fragment}.parquet")
        with atomic_open(path, "wb") as f:
            pq.write_table(rows, f)
        out.append({"fragment": fragment, "rows": rows.num_rows, "path": path})
    return pa.Table.from_pylist(
        out, schema=pa.schema([("fragment", pa.int32()), ("rows", pa.int64()), ("path", pa.string())])
    )


def todo_rows(todo: TodoFragment) -> pa.Table:
    return todo.table if todo.table is not None else pq.read_table(todo.path)
