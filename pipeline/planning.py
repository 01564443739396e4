"""Planning a run: the input's keys against the output's, as one of two physical plans.

    fragments -> annotate (ids, content hashes, clips) ---------\\
    output files -> projected read (id, hash, status, ...) ------ union -> by id: resolve_ids
        -> by ref_id: resolve_refs (rows naming a clip) -> decided keys

Distributed (Ray Data, the job's size at least cluster.distributed_plan_rows): every arrow
above is a Ray Data operator, "by id" / "by ref_id" a hash shuffle (repartition by key) whose
partitions run pipeline/planner.py's functions; the driver holds one entry per fragment and
per output file, never per row. In-process (smaller jobs, where a shuffle's seconds of start-up
would dominate): the same functions over the whole table. Both give the same decisions; the
tests run both.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Optional

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from actors import schema as S

from . import planner as P
from .inputs import FRAGMENT, REASON, ROW, TEXT_CHARS, InputScan, RowHasher, annotate, read_fragment

PARTITION_ROWS = 250_000  # keys per shuffle partition (~40 MB of Arrow): one task's share
_NUM_CPUS = 0.25  # every planning task: a whole-CPU request never schedules beside actors
TODO_COLUMNS = [FRAGMENT, ROW, S.CONTENT_HASH]


@dataclass
class Decided:
    """The decided keys (planner.DECIDED_SCHEMA): a table, or a materialized Ray Dataset."""

    table: Optional[pa.Table] = None
    dataset: object = None  # ray.data.MaterializedDataset

    @property
    def distributed(self) -> bool:
        return self.dataset is not None

    def batches(self, keep, columns: list[str]) -> Iterator[pa.Table]:
        """The rows `keep(table) -> mask` selects, projected, a bounded batch at a time."""

        def select(batch: pa.Table) -> pa.Table:
            return batch.filter(keep(batch)).select(columns)

        if self.table is not None:
            yield select(self.table)
            return
        selected = self.dataset.map_batches(select, batch_format="pyarrow", batch_size=None, num_cpus=_NUM_CPUS)
        yield from selected.iter_batches(batch_format="pyarrow", batch_size=65536)

    def to_table(self) -> pa.Table:
        """Every decided row (a small job's, or a test's)."""
        tables = list(self.batches(lambda t: pa.array([True] * t.num_rows), P.DECIDED_SCHEMA.names))
        return pa.concat_tables(tables) if tables else P.DECIDED_SCHEMA.empty_table()

    def summary_rows(self) -> list[dict]:
        """(decision, reason, rows, text_chars) per kind, summed over every row."""
        if self.table is not None:
            parts = [_summary(self.table)]
        else:
            partial = self.dataset.map_batches(_summary, batch_format="pyarrow", batch_size=None, num_cpus=_NUM_CPUS)
            parts = [pa.Table.from_pylist(partial.take_all(), schema=_SUMMARY_SCHEMA)]
        table = pa.concat_tables(parts).group_by([P.DECISION, REASON]).aggregate([("rows", "sum"), ("chars", "sum")])
        return table.to_pylist()


_SUMMARY_SCHEMA = pa.schema(
    [(P.DECISION, pa.string()), (REASON, pa.string()), ("rows", pa.int64()), ("chars", pa.int64())]
)


def _summary(decided: pa.Table) -> pa.Table:
    table = decided.select([P.DECISION, REASON, TEXT_CHARS]).append_column(
        "one", pa.array([1] * decided.num_rows, pa.int64())
    )
    grouped = table.group_by([P.DECISION, REASON]).aggregate([("one", "sum"), (TEXT_CHARS, "sum")])
    return pa.table(
        {
            P.DECISION: grouped.column(P.DECISION),
            REASON: grouped.column(REASON),
            "rows": grouped.column("one_sum"),
            "chars": pc.fill_null(grouped.column(f"{TEXT_CHARS}_sum"), 0),
        },
        schema=_SUMMARY_SCHEMA,
    )


def use_distributed(scan: InputScan, threshold: int) -> bool:
    return scan.total_rows >= threshold


def output_key_files(live_files: list[str]) -> list[str]:
    """The output files resume compares against: every live file but the rejected part,
    whose rows each run decides afresh."""
    from .output import REJECTED_PART

    return [f for f in live_files if os.path.basename(f) != REJECTED_PART]


def read_output_keys(path: str, filesystem) -> pa.Table:
    """An output file's planning columns only (never its audio)."""
    return pq.read_table(path, filesystem=filesystem, columns=P.OUTPUT_KEY_COLUMNS, schema=S.OUTPUT_SCHEMA)


def decide(
    scan: InputScan, hasher: RowHasher, output_files: list[str], output_fs, retry: P.Retry, distributed: bool
) -> Decided:
    """Every input row's decision (see the module doc for the two plans)."""
    fragment_files = [scan.file_names[f.file] for f in scan.fragments]
    if not distributed:
        keys = [annotate(read_fragment(scan, f), f, hasher) for f in scan.fragments]
        done = [read_output_keys(path, output_fs) for path in output_files]
        union = (
            pa.concat_tables([P.input_side(k) for k in keys] + [P.output_side(d) for d in done])
            if keys or done
            else P.UNION_SCHEMA.empty_table()
        )
        decided = P.resolve_ids(union, fragment_files, retry)
        return Decided(table=P.resolve_refs(decided))
    return Decided(dataset=_decide_distributed(scan, hasher, output_files, output_fs, retry, fragment_files))


def _annotate_fragments(batch: pa.Table, scan: InputScan, hasher: RowHasher) -> pa.Table:
    tables = [
        P.input_side(annotate(read_fragment(scan, scan.fragments[i]), scan.fragments[i], hasher))
        for i in batch.column("fragment").to_pylist()
    ]
    return pa.concat_tables(tables) if tables else P.UNION_SCHEMA.empty_table()


def _output_files_keys(batch: pa.Table, filesystem) -> pa.Table:
    tables = [P.output_side(read_output_keys(path, filesystem)) for path in batch.column("path").to_pylist()]
    return pa.concat_tables(tables) if tables else P.UNION_SCHEMA.empty_table()


def _map(ds, fn, **kwargs):
    return ds.map_batches(fn, fn_kwargs=kwargs, batch_format="pyarrow", batch_size=None, num_cpus=_NUM_CPUS)


def _decide_distributed(scan, hasher, output_files, output_fs, retry, fragment_files):
    import ray

    partitions = max(2, math.ceil((scan.total_rows + 1) / PARTITION_ROWS))
    fragments = ray.data.from_items(
        [{"fragment": f.index} for f in scan.fragments], override_num_blocks=max(1, len(scan.fragments))
    )
    union = fragments.map_batches(
        _annotate_fragments,
        fn_kwargs={"scan": scan, "hasher": hasher},
        batch_format="pyarrow",
        batch_size=1,
        num_cpus=_NUM_CPUS,
    )
    if output_files:
        done = ray.data.from_items([{"path": p} for p in output_files], override_num_blocks=len(output_files))
        union = union.union(
            done.map_batches(
                _output_files_keys,
                fn_kwargs={"filesystem": output_fs},
                batch_format="pyarrow",
                batch_size=1,
                num_cpus=_NUM_CPUS,
            )
        )
    by_id = union.repartition(partitions, shuffle=True, keys=[S.ID])
    decided = _map(by_id, P.resolve_ids, fragment_files=fragment_files, retry=retry).materialize()
    if S.REF_ID not in scan.rename.values():
        return decided
    naming_clip = _map(decided, _rows_naming_a_clip, wanted=True)
    rest = _map(decided, _rows_naming_a_clip, wanted=False)
    by_ref = naming_clip.repartition(partitions, shuffle=True, keys=[S.REF_ID])
    return rest.union(_map(by_ref, P.resolve_refs)).materialize()


def _rows_naming_a_clip(decided: pa.Table, wanted: bool) -> pa.Table:
    from .inputs import CLIP

    mask = pc.and_(
        pc.not_equal(decided.column(P.DECISION), P.REJECTED),
        pc.and_(pc.is_valid(decided.column(S.REF_ID)), pc.is_valid(decided.column(CLIP))),
    )
    return decided.filter(mask if wanted else pc.invert(mask))


def is_decision(*decisions: str):
    return lambda t: pc.is_in(t.column(P.DECISION), value_set=pa.array(list(decisions), pa.string()))


# ---- the rows to synthesize, per fragment -----------------------------------------------
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
        lambda t: t.filter(keep(t)).select(TODO_COLUMNS), batch_format="pyarrow", batch_size=None, num_cpus=_NUM_CPUS
    )
    partitions = max(1, math.ceil(decided.dataset.count() / PARTITION_ROWS))
    written = _map(todo.repartition(partitions, shuffle=True, keys=[FRAGMENT]), _write_todo, plan_dir=plan_dir)
    return [
        TodoFragment(r["fragment"], r["rows"], path=r["path"])
        for r in sorted(written.take_all(), key=lambda r: r["fragment"])
    ]


def _write_todo(todo: pa.Table, plan_dir: str) -> pa.Table:
    from actors.files import atomic_open

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
