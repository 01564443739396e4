"""The plan's sums: rows per decision and per refusal reason, the text and frames to
synthesize, a few changed ids to show. What the run logs, what `python -m pipeline.preview`
prints, and what the run's end is told of the rows it leaves on disk. The driver holds these
sums, never a row."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Optional

from actors import schema as S

from ..errors import OutputMismatch
from ..output.supersede import PlannedRows
from . import rules as P
from .decide import Decided, is_decision
from .keys import REASON

SHOWN_IDS = 10


@dataclass
class DecisionCounts:
    rows_total: int
    by_decision: dict = field(default_factory=dict)  # decision -> rows
    rejected: dict = field(default_factory=dict)  # reason -> rows
    text_chars: int = 0  # of the rows to synthesize
    segments: int = 0  # of the rows to synthesize, as the run will cut them (pipeline/plan/estimate.py)
    budget_frames: int = 0  # their segments' budgets summed: the most the run generates
    speech_frames: int = 0  # real speech of their text
    dialogue_rows: int = 0  # of the rows to synthesize: those with voices, their voices and turns
    voices: int = 0
    turns: int = 0
    changed_examples: list = field(default_factory=list)
    removed_examples: list = field(default_factory=list)

    @property
    def to_synthesize(self) -> int:
        return sum(self.by_decision.get(d, 0) for d in P.TO_SYNTHESIZE)

    def count(self, decision: str) -> int:
        return self.by_decision.get(decision, 0)

    @property
    def already_in(self) -> int:
        """Input rows the output holds as they are (done), not redone."""
        return self.count(P.DONE)

    def planned_rows(self, pruned: bool) -> PlannedRows:
        """What the run's end needs to know of the rows this plan leaves on disk; `pruned`:
        the removed ids' rows go (output.on_removed=prune)."""
        accepted = sum(n for decision, n in self.by_decision.items() if decision not in (P.REJECTED, P.REMOVED))
        return PlannedRows(
            accepted=accepted,
            redone=self.count(P.CHANGED) + self.count(P.RETRY),
            removed=self.count(P.REMOVED),
            pruned=pruned,
        )


def count_decisions(decided: Decided, rows_total: int) -> DecisionCounts:
    """The sums of every decided row (a Ray Data pass for a distributed plan)."""
    counts = DecisionCounts(rows_total=rows_total)
    for row in decided.decision_sums():
        decision, rows = row[P.DECISION], row["rows_sum"]
        counts.by_decision[decision] = counts.by_decision.get(decision, 0) + rows
        if decision == P.REJECTED:
            counts.rejected[row[REASON]] = counts.rejected.get(row[REASON], 0) + rows
        elif decision in P.TO_SYNTHESIZE:
            counts.text_chars += row["chars_sum"]
            counts.segments += row["segments_sum"]
            counts.budget_frames += row["budget_frames_sum"]
            counts.speech_frames += row["speech_frames_sum"]
            counts.dialogue_rows += row["dialogue_rows_sum"]
            counts.voices += row["voices_sum"]
            counts.turns += row["turns_sum"]
    for decision, examples in ((P.CHANGED, counts.changed_examples), (P.REMOVED, counts.removed_examples)):
        if counts.count(decision):
            found = (i for batch in ids_of(decided, decision, limit=SHOWN_IDS) for i in batch)
            examples.extend(sorted(found)[:SHOWN_IDS])
    return counts


def ids_of(decided: Decided, decision: str, limit: Optional[int] = None) -> Iterator[list]:
    """The ids of the rows of one decision, a batch at a time (the first `limit` of them, if given)."""
    seen = 0
    for batch in decided.batches(is_decision(decision), [S.ID]):
        ids = batch.column(S.ID).to_pylist()
        yield ids
        seen += len(ids)
        if limit is not None and seen >= limit:
            return


def refuse_changed(counts: DecisionCounts) -> None:
    """output.on_change=refuse: changed rows stop the run before anything is written."""
    changed = counts.count(P.CHANGED)
    if not changed:
        return
    shown = ", ".join(repr(i) for i in counts.changed_examples[:5]) + (", ..." if changed > 5 else "")
    raise OutputMismatch(
        f"{changed} rows changed since they were written ({shown}): their text, "
        f"reference, settings or model differ. Pass output.on_change=redo to redo them, or "
        f"choose another output.dir to keep the old results"
    )
