"""Planning a run: the input's keys against the output's, as one of two physical plans.

    fragments -> annotate (ids, content hashes, clips) ---------\\
    output files -> projected read (id, hash, status, ...) ------ union -> by id: resolve_ids
        -> by ref_id: resolve_refs (rows naming a clip) -> decided keys

Distributed (Ray Data, the job's size at least cluster.distributed_plan_rows): every arrow
above is a Ray Data operator, "by id" / "by ref_id" a hash shuffle (repartition by key) whose
partitions run pipeline/plan/rules.py's functions; the driver holds one entry per fragment and
per output file, never per row. In-process (smaller jobs, where a shuffle's seconds of start-up
would dominate): the same functions over the whole table. Both give the same decisions; the
tests run both.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Optional

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from actors import schema as S

from ..cluster import PARTITION_ROWS, TASK_CPUS
from ..names import is_rejected_part
from . import rules as P
from .estimate import RowEstimate
from .inputs import InputScan, read_fragment
from .keys import BUDGET_FRAMES, CLIP, REASON, SEGMENTS, SPEECH_FRAMES, TEXT_CHARS, TURNS, VOICES, RowHasher, annotate


@dataclass
class Decided:
    """The decided keys (rules.DECIDED_SCHEMA): a table, or a materialized Ray Dataset."""

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
        selected = self.dataset.map_batches(select, batch_format="pyarrow", batch_size=None, num_cpus=TASK_CPUS)
        yield from selected.iter_batches(batch_format="pyarrow", batch_size=65536)

    def ids_where(self, decision: str):
        """The ids of one decision's rows: an array for a table, a Ray Dataset of `id` rows for
        a dataset (never gathered here)."""
        keep = is_decision(decision)
        if self.table is not None:
            return self.table.filter(keep(self.table)).column(S.ID).combine_chunks()
        return self.dataset.map_batches(
            lambda t: t.filter(keep(t)).select([S.ID]), batch_format="pyarrow", batch_size=None, num_cpus=TASK_CPUS
        )

    def to_table(self) -> pa.Table:
        """Every decided row (a small job's, or a test's)."""
        tables = list(self.batches(lambda t: pa.array([True] * t.num_rows), P.DECIDED_SCHEMA.names))
        return pa.concat_tables(tables) if tables else P.DECIDED_SCHEMA.empty_table()

    def decision_sums(self) -> list[dict]:
        """(decision, reason, rows, text_chars) per kind, summed over every row."""
        if self.table is not None:
            parts = [_decision_sums(self.table)]
        else:
            partial = self.dataset.map_batches(
                _decision_sums, batch_format="pyarrow", batch_size=None, num_cpus=TASK_CPUS
            )
            parts = [pa.Table.from_pylist(partial.take_all(), schema=_SUMS_SCHEMA)]
        sums = [(name, "sum") for name in _SUMS_SCHEMA.names[2:]]
        table = pa.concat_tables(parts).group_by([P.DECISION, REASON]).aggregate(sums)
        return table.to_pylist()


_SUMMED = ("rows", "chars", "dialogue_rows", "voices", "turns", "segments", "budget_frames", "speech_frames")
_SUMS_SCHEMA = pa.schema([(P.DECISION, pa.string()), (REASON, pa.string())] + [(name, pa.int64()) for name in _SUMMED])


def _decision_sums(decided: pa.Table) -> pa.Table:
    table = decided.select([P.DECISION, REASON, TEXT_CHARS, VOICES, TURNS, SEGMENTS, BUDGET_FRAMES, SPEECH_FRAMES])
    table = table.append_column("one", pa.array([1] * decided.num_rows, pa.int64()))
    table = table.append_column("dialogue", pc.cast(pc.greater(pc.fill_null(table.column(VOICES), 0), 0), pa.int64()))
    summed = ("one", TEXT_CHARS, "dialogue", VOICES, TURNS, SEGMENTS, BUDGET_FRAMES, SPEECH_FRAMES)
    grouped = table.group_by([P.DECISION, REASON]).aggregate([(name, "sum") for name in summed])
    columns = [grouped.column(P.DECISION), grouped.column(REASON)]
    columns += [pc.cast(pc.fill_null(grouped.column(f"{name}_sum"), 0), pa.int64()) for name in summed]
    return pa.Table.from_arrays(columns, schema=_SUMS_SCHEMA)


def output_key_files(live_files: list[str]) -> list[str]:
    """The output files resume compares against: every live file but the rejected part,
    whose rows each run decides afresh."""
    return [f for f in live_files if not is_rejected_part(f)]


def read_output_keys(path: str, filesystem) -> pa.Table:
    """An output file's planning columns only (never its audio)."""
    return pq.read_table(path, filesystem=filesystem, columns=P.OUTPUT_KEY_COLUMNS, schema=S.OUTPUT_SCHEMA)


def decide(
    scan: InputScan,
    hasher: RowHasher,
    output_files: list[str],
    output_fs,
    retry: P.Retry,
    distributed: bool,
    estimate: Optional[RowEstimate] = None,
) -> Decided:
    """Every input row's decision (see the module doc for the two plans); with `estimate`,
    each row's segments and frames as the run will plan them."""
    fragment_files = [scan.file_names[f.file] for f in scan.fragments]
    if not distributed:
        keys = [annotate(read_fragment(scan, f), f, hasher, estimate) for f in scan.fragments]
        done = [read_output_keys(path, output_fs) for path in output_files]
        union = (
            pa.concat_tables([P.input_side(k) for k in keys] + [P.output_side(d) for d in done])
            if keys or done
            else P.UNION_SCHEMA.empty_table()
        )
        decided = P.resolve_ids(union, fragment_files, retry)
        return Decided(table=P.resolve_refs(decided))
    return Decided(
        dataset=_decide_distributed(scan, (hasher, estimate), output_files, output_fs, retry, fragment_files)
    )


def _annotate_fragments(
    batch: pa.Table, scan: InputScan, hasher: RowHasher, estimate: Optional[RowEstimate]
) -> pa.Table:
    tables = [
        P.input_side(annotate(read_fragment(scan, scan.fragments[i]), scan.fragments[i], hasher, estimate))
        for i in batch.column("fragment").to_pylist()
    ]
    return pa.concat_tables(tables) if tables else P.UNION_SCHEMA.empty_table()


def _output_files_keys(batch: pa.Table, filesystem) -> pa.Table:
    tables = [P.output_side(read_output_keys(path, filesystem)) for path in batch.column("path").to_pylist()]
    return pa.concat_tables(tables) if tables else P.UNION_SCHEMA.empty_table()


def map_blocks(ds, fn, **kwargs):
    return ds.map_batches(fn, fn_kwargs=kwargs, batch_format="pyarrow", batch_size=None, num_cpus=TASK_CPUS)


def _decide_distributed(scan, annotating, output_files, output_fs, retry, fragment_files):
    import ray

    hasher, estimate = annotating
    partitions = max(2, math.ceil((scan.total_rows + 1) / PARTITION_ROWS))
    fragments = ray.data.from_items(
        [{"fragment": f.index} for f in scan.fragments], override_num_blocks=max(1, len(scan.fragments))
    )
    union = fragments.map_batches(
        _annotate_fragments,
        fn_kwargs={"scan": scan, "hasher": hasher, "estimate": estimate},
        batch_format="pyarrow",
        batch_size=1,
        num_cpus=TASK_CPUS,
    )
    if output_files:
        done = ray.data.from_items([{"path": p} for p in output_files], override_num_blocks=len(output_files))
        union = union.union(
            done.map_batches(
                _output_files_keys,
                fn_kwargs={"filesystem": output_fs},
                batch_format="pyarrow",
                batch_size=1,
                num_cpus=TASK_CPUS,
            )
        )
    by_id = union.repartition(partitions, shuffle=True, keys=[S.ID])
    decided = map_blocks(by_id, P.resolve_ids, fragment_files=fragment_files, retry=retry).materialize()
    if S.REF_ID not in scan.rename.values():
        return decided
    naming_clip = map_blocks(decided, _rows_naming_a_clip, wanted=True)
    rest = map_blocks(decided, _rows_naming_a_clip, wanted=False)
    by_ref = naming_clip.repartition(partitions, shuffle=True, keys=[S.REF_ID])
    return rest.union(map_blocks(by_ref, P.resolve_refs)).materialize()


def _rows_naming_a_clip(decided: pa.Table, wanted: bool) -> pa.Table:
    mask = pc.and_(
        pc.not_equal(decided.column(P.DECISION), P.REJECTED),
        pc.and_(pc.is_valid(decided.column(S.REF_ID)), pc.is_valid(decided.column(CLIP))),
    )
    return decided.filter(mask if wanted else pc.invert(mask))


def is_decision(*decisions: str):
    return lambda t: pc.is_in(t.column(P.DECISION), value_set=pa.array(list(decisions), pa.string()))
