"""What a run will do, decided before it starts: shared by `pipeline.run` and `pipeline.preview`.

`plan_job` plans every input row (pipeline/planning.py) and sums the decisions; the run then
writes the rejected rows, lists the changed ones under the output and reads the rest
(pipeline/todo_read.py). The driver holds sums, a few example ids and one entry per fragment.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Optional

import pyarrow as pa
import pyarrow.fs as pafs

from actors import schema as S

from . import planner as P
from .inputs import REASON, InputScan, RowHasher
from .planning import Decided, decide, is_decision, output_key_files, use_distributed

log = logging.getLogger("chorus")

# a row's frames when engine.frames_per_char is unset: ~21.5 codec frames per second of
# speech at ~15 characters per second (for the estimate only; the engine stops at EOS)
SPEECH_FRAMES_PER_CHAR = 1.43
CHANGED_FILE = "changed-ids-{run}.txt"  # under the output: every row id a run redid as changed
SHOWN_IDS = 10


@dataclass
class PlanSummary:
    rows_total: int
    counts: dict = field(default_factory=dict)  # decision -> rows
    rejected: dict = field(default_factory=dict)  # reason -> rows
    text_chars: int = 0  # of the rows to synthesize
    estimated_frames: int = 0
    changed_examples: list = field(default_factory=list)

    @property
    def to_synthesize(self) -> int:
        return sum(self.counts.get(d, 0) for d in P.TO_SYNTHESIZE)

    def count(self, decision: str) -> int:
        return self.counts.get(decision, 0)


@dataclass
class JobPlan:
    scan: InputScan
    decided: Decided
    summary: PlanSummary


def estimate_frames(chars: int, rows: int, engine: dict) -> int:
    """Frames for `rows` rows of `chars` characters in all: the engine's per-character budget
    when it has one, else read speech's rate; at least min_frames and at most max_frames a row."""
    per_char = engine.get("frames_per_char") or SPEECH_FRAMES_PER_CHAR
    frames = rows * engine["min_frames"] + math.ceil(per_char * chars)
    return min(frames, rows * engine["max_frames"])


def summarize(decided: Decided, rows_total: int, engine: dict) -> PlanSummary:
    summary = PlanSummary(rows_total=rows_total)
    for row in decided.summary_rows():
        decision, rows = row[P.DECISION], row["rows_sum"]
        summary.counts[decision] = summary.counts.get(decision, 0) + rows
        if decision == P.REJECTED:
            summary.rejected[row[REASON]] = summary.rejected.get(row[REASON], 0) + rows
        elif decision in P.TO_SYNTHESIZE:
            summary.text_chars += row["chars_sum"]
            summary.estimated_frames += estimate_frames(row["chars_sum"], rows, engine)
    if summary.count(P.CHANGED):
        summary.changed_examples = sorted(i for batch in changed_ids(decided, limit=SHOWN_IDS) for i in batch)[
            :SHOWN_IDS
        ]
    return summary


def changed_ids(decided: Decided, limit: Optional[int] = None) -> Iterator[list]:
    """The ids of changed rows, a batch at a time (the first `limit` of them, if given)."""
    seen = 0
    for batch in decided.batches(is_decision(P.CHANGED), [S.ID]):
        ids = batch.column(S.ID).to_pylist()
        yield ids
        seen += len(ids)
        if limit is not None and seen >= limit:
            return


def refuse_changed(summary: PlanSummary) -> None:
    """output.on_change=refuse: changed rows stop the run before anything is written."""
    from .output import OutputMismatch

    changed = summary.count(P.CHANGED)
    if not changed:
        return
    shown = ", ".join(repr(i) for i in summary.changed_examples[:5]) + (", ..." if changed > 5 else "")
    raise OutputMismatch(
        f"{changed} rows changed since they were written ({shown}): their text, "
        f"reference, settings or model differ. Pass output.on_change=redo to redo them, or "
        f"choose another output.dir to keep the old results"
    )


def plan_job(plain: dict, scan: InputScan, layout, digest: str, audio_root: Optional[str]) -> JobPlan:
    """Every input row's decision against what `layout` holds, and their sums. Raises
    OutputMismatch for changed rows under output.on_change=refuse."""
    cluster, output = plain["cluster"], plain["output"]
    hasher = RowHasher(digest, audio_root, scan.root)
    distributed = use_distributed(scan, cluster["distributed_plan_rows"])
    present = layout.fs.get_file_info(layout.data_dir).type == pafs.FileType.Directory
    files = output_key_files(layout.live_files()) if present else []
    decided = decide(
        scan, hasher, files, layout.fs, P.Retry(output["retry_errors"], output["retry_rejected"]), distributed
    )
    summary = summarize(decided, scan.total_rows, plain["engine"])
    if output["on_change"] == "refuse":
        refuse_changed(summary)
    return JobPlan(scan, decided, summary)


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


def write_rejected(decided: Decided, layout, run_id: str) -> Refused:
    """The rejected part: an error row for every refused input row, streamed from the plan a
    batch at a time (an input of millions of bad ids is never held here). No refused row: an
    earlier run's part is removed."""
    from .output import REJECTED_PART

    refused = Refused()

    def error_rows() -> Iterator[pa.Table]:
        for batch in decided.batches(is_decision(P.REJECTED), [S.ID, P.ERROR]):
            refused.ids += len(batch) - batch.column(S.ID).null_count
            yield _error_rows(batch, run_id)

    refused.rows = layout.write_part_stream(error_rows(), REJECTED_PART, owner=run_id)
    return refused


def write_changed(decided: Decided, layout, run_id: str) -> Optional[str]:
    """Every changed row's id, one a line, into a file under the output (streamed)."""
    name = CHANGED_FILE.format(run=run_id)
    lines = []  # a local output streams; a URI output's object is written whole
    if layout.local:
        path = layout.path(name)
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            for ids in changed_ids(decided):
                f.write("".join(f"{i}\n" for i in ids))
        os.replace(path + ".tmp", path)
        return path
    for ids in changed_ids(decided):
        lines.extend(ids)
    layout.write_text(name, "".join(f"{i}\n" for i in lines))
    return layout.path(name)
