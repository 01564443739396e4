"""A row's segments and their frame budgets, as pure functions of its text and what sizes them
(`Sizing`): the actor's chains (chain.py ChainPlanner) and the driver's estimate
(pipeline/plan/estimate.py) call the same code, so `pipeline.preview` plans long rows as the
run does. Torch-free: strings and numbers only.

A segment is one engine request: its prompt (the fixed part -- system text, references,
markers -- plus its text and, for a chain, the segments before it) and its frame budget
share the slot's positions (actors/engine/segment.py segment_budget says how the byte budget
follows).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Optional

from actors.engine.dialogue import DialogueError, DialogueSegment, dialogue_segments, dialogue_turns, spoken_text
from actors.engine.segment import segment_budget, segment_text, utf8_len
from actors.synth.budget import FrameBudget


class SegmentingError(ValueError):
    """The row cannot be cut into segments that fit (its message names the setting to change)."""


@dataclass(frozen=True)
class Sizing:
    """What sizes a row's segments besides its text: the model's budget rule, the long_form
    settings (segment_bytes, max_turns, history_fraction), the positions one request may take,
    the prompt's positions before its text, and a max_frames column's value (every segment's
    budget then, the row's own choice)."""

    budget: FrameBudget
    long_form: Any  # LongFormSettings (actors/synth/settings.py)
    positions: int
    fixed: int
    row_frames: Optional[int] = None

    def frames(self, text: Optional[str]) -> int:
        return self.row_frames if self.row_frames is not None else self.budget.frames(text)


@dataclass(frozen=True)
class Pieces:
    """A row's segments: each one's text (as the prompt carries it), its words as spoken (what
    its budget and speech rate count), its frame budget and the turn it belongs to; and the
    row's turns as (voice, words)."""

    texts: tuple[str, ...]
    spoken: tuple[str, ...]
    frames: tuple[int, ...]
    segment_turns: tuple[int, ...]
    turns: tuple[tuple[int, str], ...]


def _shape(sizing: Sizing) -> dict:
    """segment_budget's arguments for this sizing (without the history share)."""
    budget, explicit = sizing.budget, sizing.row_frames is not None  # a max_frames column caps each segment
    return dict(
        cap=sizing.long_form.segment_bytes,
        max_tokens=sizing.positions,
        fixed_tokens=sizing.fixed,
        max_frames=sizing.row_frames if explicit else budget.max_frames,
        frames_per_byte=None if explicit else budget.frames_per_byte,
        min_frames=0 if explicit else budget.min_frames,
    )


def fit_bytes(sizing: Sizing) -> int:
    """The most UTF-8 bytes a text may have to stay one segment (ValueError when none fits)."""
    return segment_budget(**_shape(sizing)).max_bytes


def fit(sizing: Sizing, cut: Callable[[int], list[str]], whole: list[str], row_budget: int) -> list[str]:
    """`cut(max_bytes)`'s pieces at the largest budget the slot allows (with room kept for
    history once there are several); `whole`, the uncut pieces, when no budget leaves room to
    cut in but each fits as it is beside the row's budget; SegmentingError when one does not."""
    shape, explicit = _shape(sizing), sizing.row_frames is not None
    try:
        texts = cut(segment_budget(**shape).max_bytes)
        if len(texts) > 1:  # a chain: each prompt keeps room for the segment before it
            try:
                texts = cut(segment_budget(**shape, history_fraction=sizing.long_form.history_fraction).max_bytes)
            except ValueError:  # no room to keep history: segments fill the budget, each on its own
                texts = cut(segment_budget(**shape).max_bytes)
        return texts
    except ValueError as e:
        longest = max(utf8_len(piece) for piece in whole)
        if sizing.fixed + longest + row_budget > sizing.positions:
            if explicit:
                raise SegmentingError(
                    f"max_frames {sizing.row_frames} + the prompt ({sizing.fixed} positions before the text) exceeds "
                    f"the per-row budget (engine.max_tokens={sizing.positions}); lower max_frames"
                ) from None
            raise SegmentingError(str(e)) from None
        return whole  # too little room to cut in, but this short text fits as it is


def plain_pieces(words: str, text: str, sizing: Sizing) -> Pieces:
    """A plain row's segments (`text`: its words as the prompt carries them, special tokens
    escaped). A text that fits one segment stays one segment, unchanged, its budget that of
    its words: its prompt is exactly that of a plain row."""
    max_turns = sizing.long_form.max_turns
    texts = tuple(fit(sizing, lambda max_bytes: segment_text(text, max_bytes, max_turns), [text], sizing.frames(words)))
    frames = (sizing.frames(words),) if len(texts) == 1 else tuple(sizing.frames(t) for t in texts)
    return Pieces(texts, texts, frames, (0,) * len(texts), ((0, words),))


def dialogue_pieces(text: str, voices: int, sizing: Sizing, escape: Callable[[str], str] = lambda t: t) -> Pieces:
    """A dialogue row: each turn its own segment (a turn too long for one request in pieces,
    each repeating its tag), so every turn starts and ends at a frame seam; budgets follow each
    segment's spoken words. `texts` are the tagged pieces (S2's prompt); S1's prompt carries
    the spoken words (its own <|speaker:0|> goes before each). SegmentingError for a text
    that is no dialogue of `voices` voices."""
    try:
        turns = dialogue_turns(text, voices)
    except DialogueError as e:
        raise SegmentingError(str(e)) from None
    prompt_turns = [replace(turn, prompt_text=escape(turn.prompt_text)) for turn in turns]
    pieces: list = []

    def cut(max_bytes: int) -> list[str]:
        pieces[:] = dialogue_segments(prompt_turns, max_bytes)
        return [piece.text for piece in pieces]

    fit(sizing, cut, [turn.prompt_text for turn in prompt_turns], sizing.frames(text))
    if not pieces:  # no room to cut in, but every turn fits as it is
        pieces = [DialogueSegment(turn.prompt_text, index) for index, turn in enumerate(prompt_turns)]
    spoken = tuple(spoken_text(piece.text) for piece in pieces)
    return Pieces(
        texts=tuple(piece.text for piece in pieces),
        spoken=spoken,
        frames=tuple(sizing.frames(t) for t in spoken),
        segment_turns=tuple(piece.turn for piece in pieces),
        turns=tuple((turn.speaker, turn.spoken) for turn in turns),
    )
