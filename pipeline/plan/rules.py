"""What a run does with each input row: the planning semantics, as Arrow work on tables.

A row is rejected (answered with an error row, never synthesized) when its id is unusable,
when other rows share its id, or when its ref_id names another clip elsewhere; an accepted
row is new, done (written with the same content hash), changed (written with another hash:
redone), or a retry (an error row whose cause may be gone: redone). An id the output holds and
no input row names any more is `removed` (a row of its own in the decided keys, only its id
set): reported, and kept or pruned as output.on_removed says.

Both functions see every row of the ids (resolve_ids) or ref_ids (resolve_refs) they are
given: pipeline/plan/decide.py calls them on a whole small job in-process, or on each hash
partition of a large one in Ray Data tasks. One set of semantics for both.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from actors import schema as S

from ..output.reading import newest_copy_mask
from .keys import CLIP, FRAGMENT, KEY_SCHEMA, PROBLEM, REASON, ROW, describe_clip

DECISION = "_decision"
ERROR = "_error"
NEW, DONE, CHANGED, RETRY, REJECTED = "new", "done", "changed", "retry", "rejected"
REMOVED = "removed"  # in the output, in no input row any more (not an input row: never counted as one)
TO_SYNTHESIZE = (NEW, CHANGED, RETRY)

SIDE = "_side"  # 0: an input row's keys, 1: an output row (a copy already written)
INPUT_SIDE, OUTPUT_SIDE = 0, 1
# an output row's columns, as the union with the input's keys names them
DONE_COLUMNS = {
    S.CONTENT_HASH: "_done_hash",
    S.STATUS: "_done_status",
    S.RETRYABLE: "_done_retryable",
    S.RUN: "_done_run",
    S.FINISHED_AT: "_done_finished",
}
OUTPUT_KEY_COLUMNS = [S.ID, *DONE_COLUMNS]  # what planning reads of the output (never audio)
UNION_SCHEMA = pa.schema(
    list(KEY_SCHEMA)
    + [(DONE_COLUMNS[name], S.OUTPUT_SCHEMA.field(name).type) for name in DONE_COLUMNS]
    + [(SIDE, pa.int8())]
)
DECIDED_SCHEMA = pa.schema(list(KEY_SCHEMA) + [(DECISION, pa.string()), (ERROR, pa.string())])


@dataclass(frozen=True)
class Retry:
    """Which written rows a rerun redoes besides changed ones: error rows (retryable ones
    always; every one with `errors`, output.retry_errors) and rejected rows (those whose every
    attempt failed quality.reject: done, as ok rows are, unless `rejected`, output.retry_rejected)."""

    errors: bool = False
    rejected: bool = False


def input_side(keys: pa.Table) -> pa.Table:
    """Input keys (keys.KEY_SCHEMA) as rows of UNION_SCHEMA."""
    n = keys.num_rows
    columns = {name: keys.column(name) for name in KEY_SCHEMA.names}
    for name in DONE_COLUMNS.values():
        columns[name] = pa.nulls(n, UNION_SCHEMA.field(name).type)
    columns[SIDE] = pa.array([INPUT_SIDE] * n, pa.int8())
    return pa.table(columns, schema=UNION_SCHEMA)


def output_side(done: pa.Table) -> pa.Table:
    """Output rows (OUTPUT_KEY_COLUMNS) as rows of UNION_SCHEMA; rows without an id dropped."""
    done = done.filter(pc.is_valid(done.column(S.ID)))
    n = done.num_rows
    columns = {name: pa.nulls(n, KEY_SCHEMA.field(name).type) for name in KEY_SCHEMA.names}
    columns[S.ID] = done.column(S.ID).cast(pa.string())
    for name, alias in DONE_COLUMNS.items():
        columns[alias] = done.column(name).cast(UNION_SCHEMA.field(alias).type)
    columns[SIDE] = pa.array([OUTPUT_SIDE] * n, pa.int8())
    return pa.table(columns, schema=UNION_SCHEMA)


def newest_copies(done: pa.Table) -> pa.Table:
    """Of the output rows sharing an id, the current one, by the readers' own rule
    (pipeline/output/reading.py newest_copy_mask)."""
    return done.filter(
        newest_copy_mask(done.column(S.ID), done.column(DONE_COLUMNS[S.RUN]), done.column(DONE_COLUMNS[S.FINISHED_AT]))
    )


def resolve_ids(union: pa.Table, fragment_files: list[str], retry: Retry) -> pa.Table:
    """Every input row of these ids with its decision (DECIDED_SCHEMA): bad and duplicate
    ids rejected, the rest new / done / changed / retry against the output's newest copy.
    `union` holds UNION_SCHEMA rows, every row of each id it has; `fragment_files` names
    each fragment's file (for the messages)."""
    side = union.column(SIDE)
    rows = union.filter(pc.equal(side, INPUT_SIDE)).select(KEY_SCHEMA.names)
    done = newest_copies(union.filter(pc.equal(side, OUTPUT_SIDE)).select([S.ID, *DONE_COLUMNS.values()]))
    counts = rows.filter(pc.is_null(rows.column(PROBLEM))).group_by(S.ID).aggregate([(S.ID, "count")])
    rows = rows.join(counts, S.ID, join_type="left outer").join(done, S.ID, join_type="left outer")
    files = pc.take(pa.array(fragment_files, pa.string()), rows.column(FRAGMENT)).to_pylist()
    n_copies = pc.fill_null(rows.column(f"{S.ID}_count"), 0).to_pylist()
    ids, problems = rows.column(S.ID).to_pylist(), rows.column(PROBLEM).to_pylist()
    reasons, lines = rows.column(REASON).to_pylist(), rows.column(ROW).to_pylist()
    decisions, errors = _resume_verdicts(rows, retry), [None] * rows.num_rows
    for i, problem in enumerate(problems):
        where = f"{files[i]} row {lines[i]}"
        if problem is not None:
            decisions[i], errors[i] = REJECTED, f"{problem} ({where})"
        elif n_copies[i] > 1:
            decisions[i], reasons[i] = REJECTED, "duplicate_id"
            errors[i] = (
                f"duplicate id {ids[i]!r}: {n_copies[i]} input rows share it; ids must be unique, so every "
                f"one of them is rejected ({where})"
            )
    out = rows.select(KEY_SCHEMA.names)
    out = out.set_column(KEY_SCHEMA.get_field_index(REASON), REASON, pa.array(reasons, pa.string()))
    out = out.append_column(DECISION, pa.array(decisions, pa.string())).append_column(
        ERROR, pa.array(errors, pa.string())
    )
    return pa.concat_tables([out, _removed(done, rows)])


def _removed(done: pa.Table, rows: pa.Table) -> pa.Table:
    """The output's ids no input row names (DECIDED_SCHEMA rows holding only the id)."""
    gone = done.select([S.ID]).join(rows.select([S.ID]), S.ID, join_type="left anti")
    n = gone.num_rows
    columns = {name: pa.nulls(n, field.type) for name, field in zip(DECIDED_SCHEMA.names, DECIDED_SCHEMA)}
    columns[S.ID] = gone.column(S.ID).combine_chunks() if n else pa.array([], pa.string())
    columns[DECISION] = pa.array([REMOVED] * n, pa.string())
    return pa.table(columns, schema=DECIDED_SCHEMA)


def _resume_verdicts(rows: pa.Table, retry: Retry) -> list[str]:
    """new / changed / retry / done for each row, from its output copy (if any). Rows written
    before content hashes existed (a null hash) count as done with this content."""
    status = rows.column(DONE_COLUMNS[S.STATUS])
    written = pc.is_valid(status).to_pylist()
    done_hash = rows.column(DONE_COLUMNS[S.CONTENT_HASH])
    changed = pc.fill_null(
        pc.and_(pc.is_valid(done_hash), pc.not_equal(done_hash, rows.column(S.CONTENT_HASH))), False
    ).to_pylist()
    rejected = pc.fill_null(pc.equal(status, S.STATUS_REJECTED), False)
    failed = pc.and_(pc.fill_null(pc.not_equal(status, S.STATUS_OK), False), pc.invert(rejected))
    if not retry.errors:
        failed = pc.and_(failed, pc.fill_null(rows.column(DONE_COLUMNS[S.RETRYABLE]), False))
    if retry.rejected:
        failed = pc.or_(failed, rejected)
    failed = failed.to_pylist()
    return [NEW if not w else CHANGED if c else RETRY if f else DONE for w, c, f in zip(written, changed, failed)]


def resolve_refs(decided: pa.Table) -> pa.Table:
    """Reject every accepted row of a ref_id whose rows name different clips (rows sharing a
    ref_id share one encoded clip: a conflict would silently give some rows another voice),
    naming two of the clips. `decided` holds every accepted row of each ref_id it has."""
    accepted = pc.and_(
        pc.not_equal(decided.column(DECISION), REJECTED),
        pc.and_(pc.is_valid(decided.column(S.REF_ID)), pc.is_valid(decided.column(CLIP))),
    )
    candidates = decided.filter(accepted)
    if candidates.num_rows == 0:
        return decided
    pairs = candidates.group_by([S.REF_ID, CLIP]).aggregate([(S.ID, "min"), (S.ID, "count")])
    per_ref = pairs.group_by(S.REF_ID).aggregate([(CLIP, "count"), (f"{S.ID}_count", "sum")])
    conflicted = per_ref.filter(pc.greater(per_ref.column(f"{CLIP}_count"), 1))
    if conflicted.num_rows == 0:
        return decided
    messages = {}
    pairs = pairs.filter(pc.is_in(pairs.column(S.REF_ID), value_set=conflicted.column(S.REF_ID)))
    pairs = pairs.sort_by([(S.REF_ID, "ascending"), (CLIP, "ascending")]).to_pylist()
    totals = dict(zip(conflicted.column(S.REF_ID).to_pylist(), conflicted.column(f"{S.ID}_count_sum").to_pylist()))
    for ref_id in totals:
        (first, other) = [p for p in pairs if p[S.REF_ID] == ref_id][:2]
        messages[ref_id] = (
            f"ref_id {ref_id!r} names different clips: {describe_clip(first[CLIP])} (row {first[f'{S.ID}_min']!r}) "
            f"and {describe_clip(other[CLIP])} (row {other[f'{S.ID}_min']!r}); rows sharing a ref_id must share "
            f"one clip, so none of its {totals[ref_id]} rows is synthesized"
        )
    hit = pc.and_(
        accepted, pc.fill_null(pc.is_in(decided.column(S.REF_ID), value_set=conflicted.column(S.REF_ID)), False)
    )
    hit_list, refs = hit.to_pylist(), decided.column(S.REF_ID).to_pylist()
    decisions = [REJECTED if h else d for h, d in zip(hit_list, decided.column(DECISION).to_pylist())]
    errors = [messages[r] if h else e for h, r, e in zip(hit_list, refs, decided.column(ERROR).to_pylist())]
    reasons = ["ref_id_conflict" if h else e for h, e in zip(hit_list, decided.column(REASON).to_pylist())]
    for name, values in ((DECISION, decisions), (ERROR, errors), (REASON, reasons)):
        decided = decided.set_column(decided.schema.get_field_index(name), name, pa.array(values, pa.string()))
    return decided
