"""Long-form text: how a row of any length becomes a chain of segments, each small enough for
one engine request. Pure functions over strings (no torch, no numpy): the actor plans a row
with them, the tests pin every rule.

The rules follow upstream fish-speech's `generate_long`:
- speaker-tagged text (`<|speaker:N|>`) is split into turns (text before the first tag is
  dropped, as upstream does), and consecutive turns are grouped into one segment while the
  segment holds at most `max_turns` turns and `max_bytes` UTF-8 bytes (joined by newlines);
- a turn or plain text longer than the budget is cut, preferring in order: sentence ends,
  clause marks, whitespace, and finally a hard cut between characters. No cut ever falls
  inside a UTF-8 character or a special token `<|...|>`. A turn cut in pieces repeats its
  speaker tag on every piece, so each segment still says who speaks.

Unlike upstream, the byte budget counts the newlines that join turns, so "a segment is at most
`max_bytes` bytes" holds exactly.
"""

from __future__ import annotations

import math
import re
import unicodedata
from dataclasses import dataclass
from typing import Optional

# upstream's `--chunk-length` default (its CLI and API client): bytes of text per segment
DEFAULT_SEGMENT_BYTES = 300
# upstream groups at most 5 speaker turns into one segment
DEFAULT_MAX_TURNS = 5
# below this a segment cannot hold a sentence; a row whose budget is smaller is rejected
MIN_SEGMENT_BYTES = 16

SPEAKER_TAG = re.compile(r"<\|speaker:\d+\|>")
_SPECIAL_TOKEN = re.compile(r"<\|[^<>|\s]{1,64}\|>")

# Marks that end a sentence wherever they stand: CJK and other scripts written without spaces
# (full stops, exclamation/question marks), Arabic/Urdu, Devanagari/Bengali dandas, Ethiopic,
# Armenian, Myanmar, Thai and Khmer enders, the ellipsis.
_SENTENCE_END_ANYWHERE = set("。！？｡．…؟۔।॥።፧፨՞։။៕៖")
# Latin-style marks end a sentence only before whitespace (or the end): "3.14", "e.g.x" and
# "U.S.A" stay whole.
_SENTENCE_END_BEFORE_SPACE = set(".!?")
# Closing quotes and brackets that belong to the sentence they end: "He left." she said.
_CLOSERS = set("\"'”’»)]}」』》〉】〕）")
_CLAUSE_MARKS = set(",;:、，；：،؛—–")

LEVEL_SENTENCE, LEVEL_CLAUSE, LEVEL_SPACE, LEVEL_CHAR = range(4)


def utf8_len(text: str) -> int:
    return len(text.encode("utf-8"))


# ---- speaker turns ----------------------------------------------------------------------
def speaker_turns(text: str) -> list[str]:
    """The text's speaker turns, each starting with its `<|speaker:N|>` tag and stripped of
    surrounding whitespace; [] when the text has no tag. Text before the first tag is dropped
    (upstream's `split_text_by_speaker` does the same)."""
    pieces = re.split(f"({SPEAKER_TAG.pattern})", text)
    turns = []
    for i in range(1, len(pieces), 2):
        turns.append((pieces[i] + pieces[i + 1]).strip())
    return turns


def group_turns(turns: list[str], max_bytes: int, max_turns: int = DEFAULT_MAX_TURNS) -> list[str]:
    """Consecutive turns joined by newlines, a new group starting when adding the next turn
    would exceed `max_turns` turns or `max_bytes` bytes. A turn longer than `max_bytes` on its
    own stands alone (cut it first with `split_turn`)."""
    groups, current, size = [], [], 0
    for turn in turns:
        turn_bytes = utf8_len(turn)
        joined = size + (1 if current else 0) + turn_bytes
        if current and (len(current) >= max_turns or joined > max_bytes):
            groups.append("\n".join(current))
            current, joined = [], turn_bytes
        current.append(turn)
        size = joined
    if current:
        groups.append("\n".join(current))
    return groups


# ---- cutting one over-long piece --------------------------------------------------------
def _special_spans(text: str) -> list[tuple[int, int]]:
    return [m.span() for m in _SPECIAL_TOKEN.finditer(text)]


def _cut_level(text: str, end: int) -> int:
    """How good a cut at character index `end` (between text[end-1] and text[end]) is."""
    before = text[end - 1]
    after = text[end] if end < len(text) else " "
    # step back over closing quotes/brackets to the mark they follow
    k = end - 1
    while k > 0 and text[k] in _CLOSERS:
        k -= 1
    mark = text[k]
    if before == "\n":
        return LEVEL_SENTENCE  # a line break ends a paragraph or a line of verse
    if mark in _SENTENCE_END_ANYWHERE and after not in _CLOSERS and after not in _SENTENCE_END_ANYWHERE:
        return LEVEL_SENTENCE
    if mark in _SENTENCE_END_BEFORE_SPACE and after.isspace():
        return LEVEL_SENTENCE
    if mark in _CLAUSE_MARKS and (after.isspace() or not before.isascii()) and after not in _CLAUSE_MARKS:
        return LEVEL_CLAUSE
    if before.isspace() or after.isspace():
        return LEVEL_SPACE
    return LEVEL_CHAR


_ZWJ = "\u200d"


def _extends(ch: str) -> bool:
    """A character that belongs to the one before it in what a reader sees as one character:
    combining marks, variation selectors, emoji skin tones, emoji tag characters, ZWJ."""
    code = ord(ch)
    return (
        unicodedata.category(ch) in ("Mn", "Me", "Mc")
        or ch == _ZWJ
        or 0xFE00 <= code <= 0xFE0F
        or 0xE0100 <= code <= 0xE01EF
        or 0x1F3FB <= code <= 0x1F3FF
        or 0xE0020 <= code <= 0xE007F
    )


def _regional_indicator(ch: str) -> bool:
    return 0x1F1E6 <= ord(ch) <= 0x1F1FF


def _inside_graphemes(text: str) -> set[int]:
    """Positions a cut would split a user-perceived character at: before a combining mark,
    variation selector or skin tone; either side of a ZWJ (👩‍💻); between the two regional
    indicators of a flag (🇫🇷). A simplified form of Unicode's grapheme cluster rules, enough
    that no piece starts with a stray mark or half a flag."""
    inside, run = set(), 0  # run: regional indicators so far in a row
    for i, ch in enumerate(text):
        if i and (_extends(ch) or text[i - 1] == _ZWJ):
            inside.add(i)
        if _regional_indicator(ch):
            if run % 2 == 1:
                inside.add(i)
            run += 1
        else:
            run = 0
    return inside


class _Cutter:
    """split_text's state: the text, where cuts may fall, and byte offsets (so every length
    check is a subtraction and the whole split stays linear in the text)."""

    def __init__(self, text: str, max_bytes: int):
        self.text, self.max_bytes = text, max_bytes
        self.byte_at = [0]
        for ch in text:
            self.byte_at.append(self.byte_at[-1] + utf8_len(ch))
        inside = _inside_graphemes(text)  # positions inside a special token or a grapheme: never a cut
        for start, end in _special_spans(text):
            inside.update(range(start + 1, end))
        self.levels = {i: _cut_level(text, i) for i in range(1, len(text)) if i not in inside}

    def size(self, start: int, end: int) -> int:
        return self.byte_at[end] - self.byte_at[start]

    def strip(self, start: int, end: int) -> Optional[tuple[int, int]]:
        while start < end and self.text[start].isspace():
            start += 1
        while end > start and self.text[end - 1].isspace():
            end -= 1
        return (start, end) if start < end else None

    def split(self, start: int, end: int, level: int) -> list[tuple[int, int]]:
        """Spans of text[start:end], each within the budget unless it is one special token."""
        if self.size(start, end) <= self.max_bytes:
            return [(start, end)]
        if level == LEVEL_CHAR:
            return self._hard_cut(start, end)
        spans, piece_start = [], start
        for i in range(start + 1, end):
            if self.levels.get(i) == level:
                spans.append((piece_start, i))
                piece_start = i
        spans.append((piece_start, end))
        out = []
        for s, e in spans:
            stripped = self.strip(s, e)
            if stripped:
                out.extend(self.split(*stripped, level + 1))
        return out

    def _hard_cut(self, start: int, end: int) -> list[tuple[int, int]]:
        """Pieces filled to the budget, cut only where a cut is allowed (between characters,
        outside special tokens); a special token longer than the budget stands alone."""
        out, piece_start, last_fit = [], start, None
        for i in range(start + 1, end + 1):
            if i != end and i not in self.levels:
                continue
            if self.size(piece_start, i) > self.max_bytes and last_fit is not None:
                out.append((piece_start, last_fit))
                piece_start, last_fit = last_fit, None
            if self.size(piece_start, i) > self.max_bytes:  # one atom over the budget on its own
                out.append((piece_start, i))
                piece_start = i
            else:
                last_fit = i
        if piece_start < end:
            out.append((piece_start, end))
        return out

    def merge(self, spans: list[tuple[int, int]]) -> list[str]:
        """Neighbouring pieces joined again (with the text between them) while they fit."""
        pieces, current = [], None
        for span in spans:
            if current is not None and self.size(current[0], span[1]) <= self.max_bytes:
                current = (current[0], span[1])
                continue
            if current is not None:
                pieces.append(self.text[current[0] : current[1]])
            current = span
        if current is not None:
            pieces.append(self.text[current[0] : current[1]])
        return pieces


def split_text(text: str, max_bytes: int) -> list[str]:
    """Cut `text` into stripped, non-empty pieces of at most `max_bytes` UTF-8 bytes, the way
    upstream's text splitter does: cut at every sentence end; a sentence still too long at its
    clause marks; a clause still too long at whitespace; a run still too long anywhere between
    characters (never inside a UTF-8 character or a special token). Then neighbouring pieces
    are joined again, greedily from the start, while they fit. So a cut falls inside a
    sentence only when that sentence alone exceeds the budget. A special token longer than
    the budget (never in practice: budgets are >= MIN_SEGMENT_BYTES) is a piece of its own."""
    if max_bytes < 1:
        raise ValueError(f"max_bytes must be >= 1, got {max_bytes}")
    cutter = _Cutter(text, max_bytes)
    whole = cutter.strip(0, len(text))
    if whole is None:
        return []
    return cutter.merge(cutter.split(*whole, LEVEL_SENTENCE))


def split_turn(turn: str, max_bytes: int) -> list[str]:
    """A speaker turn longer than `max_bytes` cut into pieces that each start with the turn's
    tag, so every segment names its speaker; a turn that fits is returned as is."""
    if utf8_len(turn) <= max_bytes:
        return [turn]
    tag = SPEAKER_TAG.match(turn)
    if tag is None:
        return split_text(turn, max_bytes)
    body = turn[tag.end() :]
    room = max(1, max_bytes - utf8_len(tag.group()))
    return [tag.group() + piece for piece in split_text(body, room)]


def segment_text(text: str, max_bytes: int, max_turns: int = DEFAULT_MAX_TURNS) -> list[str]:
    """The segments of a row's text, in order. Text that fits in `max_bytes` is one segment,
    unchanged (so a short row's prompt is exactly what it was without long-form support).
    Speaker-tagged text: turns, cut where too long, grouped. Other text: cut."""
    if utf8_len(text) <= max_bytes:
        return [text]
    turns = speaker_turns(text)
    if not turns:
        return split_text(text, max_bytes)
    pieces = [piece for turn in turns for piece in split_turn(turn, max_bytes)]
    return group_turns(pieces, max_bytes, max_turns)


# ---- the byte budget -------------------------------------------------------------------
@dataclass(frozen=True)
class SegmentBudget:
    """How many text bytes one segment may hold, and why.

    One segment is one engine request: its prompt (the fixed part — system text, reference,
    chat markers — plus at most one token per text byte: byte-level and BPE tokenizers never
    produce more tokens than bytes) and its frame budget must fit the engine's `max_tokens`
    positions. With a frames-per-byte rule the frame budget grows with the text
    (min_frames + frames_per_byte x bytes); without one every segment gets `max_frames`. The segment's text must also be speakable within `max_frames`,
    or its audio would be cut off. `cap` (long_form.segment_bytes) bounds it all."""

    max_bytes: int
    limited_by: str  # "segment_bytes" | "max_tokens" | "max_frames"


def segment_budget(
    *,
    cap: int,
    max_tokens: int,
    fixed_tokens: int,
    max_frames: int,
    frames_per_byte: Optional[float],
    min_frames: int = 0,
    history_fraction: float = 0.0,
) -> SegmentBudget:
    """The largest segment (bytes) for a row whose prompt without text takes `fixed_tokens`
    positions. `history_fraction` of the positions left after those is kept for previous
    segments (their text and codes carry the voice from one segment to the next; a segment
    sized to fill the whole budget leaves room for none). Raises ValueError naming the setting
    to change when not even MIN_SEGMENT_BYTES fit."""
    room = math.floor((max_tokens - fixed_tokens) * (1.0 - history_fraction))
    candidates = [(cap, "segment_bytes")]
    if frames_per_byte:
        per_byte = float(frames_per_byte)
        candidates.append((math.floor((room - min_frames) / (1.0 + per_byte)), "max_tokens"))
        candidates.append((math.floor((max_frames - min_frames) / per_byte), "max_frames"))
    else:
        candidates.append((room - max_frames, "max_tokens"))
    max_bytes, limited_by = min(candidates)
    if max_bytes < MIN_SEGMENT_BYTES:
        raise ValueError(
            f"a segment would hold only {max(max_bytes, 0)} bytes of text (at least {MIN_SEGMENT_BYTES} needed): "
            f"the prompt without text takes {fixed_tokens} of engine.max_tokens={max_tokens} positions and "
            f"each segment needs frames too; raise engine.max_tokens, shorten the reference, or lower "
            f"model.budget.max_frames / model.budget.frames_per_byte (limited by {limited_by})"
        )
    return SegmentBudget(max_bytes, limited_by)


# ---- the previous segments a prompt keeps -----------------------------------------------
def kept_history(history_columns: list[int], room: int) -> int:
    """Index of the first previous segment that stays in segment k's prompt: the oldest ones
    drop out first until the newest kept ones fit `room` columns (what the per-row budget
    leaves after the reference part, segment k's own text and its frames). The reference is
    never dropped: it is not part of the history."""
    first, total = len(history_columns), 0
    for i in range(len(history_columns) - 1, -1, -1):
        if total + history_columns[i] > room:
            break
        total += history_columns[i]
        first = i
    return first
