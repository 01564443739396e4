"""A row's frame budgets: the rule each model states (`model.budget`), and what happens to a
segment its budget cut. Torch-free and pure, so the actor's chains (chain.py) and the driver's
estimate (pipeline/plan/estimate.py) size every segment alike.

A segment's budget is `min(max_frames, min_frames + frames_per_byte x its UTF-8 bytes)`. Bytes,
not characters: a script's characters take about as long to say as their UTF-8 width, so one
rate serves them all. Slow read speech runs at about 0.1 s a byte: English at ~10 characters a
second (1 byte each), Mandarin at ~3.3 (3 bytes each), so 2.15 codec frames a byte (21.5
frames a second); Japanese kana (3 bytes, ~8 a second) and Cyrillic (2 bytes, ~14 a second)
take less. Per character the spread is 4-5x (English 1.4 frames a character, Mandarin 6.5):
a budget per character that fits Mandarin leaves English rows five times what they need, and
sizes long text's segments (each prompt holds its text and its frames) to half of upstream's
300 bytes on a 3,072-position engine.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

from actors.bounds import at_least, check_bounds, one_of

# model.budget.on_cut: a segment cut by its budget is generated again with a larger one (grow),
# generated again at the same budget and rejected if every attempt is cut (reject), or kept as
# it is, flagged `truncated` (accept: the demo's short budget)
GROW, REJECT, ACCEPT = "grow", "reject", "accept"
# a cut segment's budget is multiplied by this at each growth, up to max_frames
GROWTH = 2


@dataclass
class FrameBudget:
    """How many codec frames (21.5 a second) each segment of a row may take: a rate per UTF-8
    byte of its text, a floor and a ceiling (module doc: why bytes), and what a segment its
    budget cut becomes. The defaults fit real speech (S1 and S2 share the codec's frame rate);
    the demo models state their short budget (conf/model/demo*.yaml). A row's `max_frames`
    column sets its budget itself (every segment's, no growth)."""

    # the ceiling: most frames one segment may take (1024: 48 s), the growth's bound too
    max_frames: int = field(default=1024, metadata=at_least(1))
    # frames per UTF-8 byte of a segment's text: 2.5 holds slow read speech (0.1 s a byte,
    # 2.15 frames) with room; null: every segment gets max_frames
    frames_per_byte: Optional[float] = field(default=2.5, metadata=at_least(0, or_null=True))
    # the floor every segment gets besides its text's share (a short word still needs a breath)
    min_frames: int = field(default=16, metadata=at_least(0))
    # a segment that ran to its budget without ending: grow (generated again with twice the
    # budget, up to max_frames; cut at max_frames, it is rejected as under `reject`), reject
    # (`truncated` rejects it: generated again up to quality.max_attempts, then the row is
    # `rejected`), accept (kept, `ok` with the flag `truncated`). Rows whose budget the user
    # chose (a max_frames column, engine.stop_on_eos=false) are kept as they are
    on_cut: str = field(default=GROW, metadata=one_of(GROW, REJECT, ACCEPT))

    def frames(self, text: Optional[str]) -> int:
        """A text's budget: min_frames + frames_per_byte per UTF-8 byte, at most max_frames."""
        if self.frames_per_byte is None or text is None:
            return self.max_frames
        wanted = self.min_frames + math.ceil(float(self.frames_per_byte) * len(text.encode("utf-8", "surrogatepass")))
        return min(self.max_frames, wanted)

    def grown(self, frames: int, room: int) -> Optional[int]:
        """The next budget of a segment its budget of `frames` cut (at most `room`, what the
        engine's positions leave it); None when it may not grow."""
        if self.on_cut != GROW:
            return None
        bigger = min(frames * GROWTH, self.max_frames, room)
        return bigger if bigger > frames else None

    def validate(self) -> None:
        check_bounds(self, "model.budget")
