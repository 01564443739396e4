"""What the plan leaves under the output before synthesis starts: the rejected part (an error
row answering every refused input row, streamed from the plan a batch at a time: an input of
millions of bad ids is never held on the driver) and the lists of every id redone because its
content changed, and of every id the output holds that the input no longer names."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Optional

import pyarrow as pa

from actors import schema as S

from ..names import CHANGED_FILE, REJECTED_PART, REMOVED_FILE
from ..output.layout import OutputLayout
from . import rules as P
from .counts import ids_of
from .decide import Decided, is_decision


def _error_rows(refused: pa.Table, run_id: str) -> pa.Table:
    """Output rows answering refused input rows (id, error): status error, the run, no audio."""
    n = refused.num_rows
    columns = {name: pa.nulls(n, S.OUTPUT_SCHEMA.field(name).type) for name in S.OUTPUT_SCHEMA.names}
    columns[S.ID] = refused.column(S.ID)
    columns[S.STATUS] = pa.array([S.STATUS_ERROR] * n, pa.string())
    columns[S.ERROR] = refused.column(P.ERROR)
    columns[S.RUN] = pa.array([run_id] * n, S.OUTPUT_SCHEMA.field(S.RUN).type)
    return pa.table(columns, schema=S.OUTPUT_SCHEMA)


@dataclass
class Refused:
    rows: int = 0  # error rows written, one per refused input row
    ids: int = 0  # of them with an id (a null id has no earlier copy to remove)


def write_rejected(decided: Decided, layout: OutputLayout, run_id: str) -> Refused:
    """The rejected part: an error row for every refused input row, streamed from the plan a
    batch at a time (an input of millions of bad ids is never held here). No refused row: an
    earlier run's part is removed."""
    refused = Refused()

    def error_rows() -> Iterator[pa.Table]:
        for batch in decided.batches(is_decision(P.REJECTED), [S.ID, P.ERROR]):
            refused.ids += len(batch) - batch.column(S.ID).null_count
            yield _error_rows(batch, run_id)

    refused.rows = layout.write_part_stream(error_rows(), REJECTED_PART, owner=run_id)
    return refused


# the file each decision's list of ids goes to
ID_LISTS = {P.CHANGED: CHANGED_FILE, P.REMOVED: REMOVED_FILE}


def write_ids(decided: Decided, layout: OutputLayout, run_id: str, decision: str) -> Optional[str]:
    """Every id of one decision (changed, removed), one a line, into a file under the output
    (ID_LISTS names it), streamed; its path."""
    name = ID_LISTS[decision].format(run=run_id)
    lines = []  # a local output streams; a URI output's object is written whole
    if layout.local:
        path = layout.path(name)
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            for ids in ids_of(decided, decision):
                f.write("".join(f"{i}\n" for i in ids))
        os.replace(path + ".tmp", path)
        return path
    for ids in ids_of(decided, decision):
        lines.extend(ids)
    layout.write_text(name, "".join(f"{i}\n" for i in lines))
    return layout.path(name)
