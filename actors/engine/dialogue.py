"""Dialogue rows: a text whose turns name their voices with `<|speaker:i|>` tags, split into the
turns each generated as its own segment (README, "Dialogue"). Pure functions over strings (no
torch, no numpy): the actor plans a row with them, the tests pin every rule.

A turn is split as upstream's `split_text_by_speaker` splits one (its tag and what follows,
stripped at both ends), so turn k's prompt text is exactly the batch text upstream's
`generate_long` puts in its user message when each turn is a batch of its own. Unlike
upstream, which drops text before the first tag and accepts any tag, a dialogue row's text is
judged: words before the first tag, a tag naming a voice the row lacks and an empty turn are
each the row's error (a dataset should not lose words, or speak them in a voice nobody chose).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .segment import SPEAKER_TAG, split_turn, utf8_len

_TAG_INDEX = re.compile(r"<\|speaker:(\d+)\|>")


class DialogueError(ValueError):
    """A dialogue row's text or voices cannot be spoken as given; the message names the fix."""


@dataclass(frozen=True)
class Turn:
    """One speaker turn: who speaks (`speaker` indexes the row's voices), the text as the prompt
    carries it (its tag included, as upstream's turn), and the words spoken (`spoken`: no tag)."""

    speaker: int
    prompt_text: str
    spoken: str


@dataclass(frozen=True)
class DialogueSegment:
    """A segment of a dialogue row: one turn, or one piece of a turn too long for one request
    (each piece repeats the turn's tag); `turn` indexes the row's turns."""

    text: str
    turn: int


def _shown(text: str, limit: int = 40) -> str:
    return repr(text if len(text) <= limit else text[: limit - 3] + "...")


def dialogue_turns(text: str, voices: int) -> list[Turn]:
    """The turns of a dialogue row's text with `voices` voices. A text without any tag is one
    turn of voice 0 when the row has one voice (its prompt text unchanged, as upstream's);
    DialogueError for everything a dataset would not want spoken."""
    if not text.strip():
        raise DialogueError("text is empty")
    first = SPEAKER_TAG.search(text)
    if first is None:
        if voices > 1:
            raise DialogueError(
                f"text has no <|speaker:N|> tag, but the row has {voices} voices: start each turn with the tag "
                f"of its voice (<|speaker:0|> for voices[0])"
            )
        return [Turn(0, text, text.strip())]
    before = text[: first.start()]
    if before.strip():
        raise DialogueError(
            f"text {_shown(before.strip())} comes before the first speaker tag and belongs to no voice: "
            f"start the text with <|speaker:N|>"
        )
    turns = []
    pieces = SPEAKER_TAG.split(text)
    tags = SPEAKER_TAG.findall(text)
    for index, (tag, body) in enumerate(zip(tags, pieces[1:])):
        speaker = int(_TAG_INDEX.fullmatch(tag).group(1))
        if speaker >= voices:
            raise DialogueError(
                f"turn {index + 1} is tagged {tag}, but the row has {voices} voice{'s' if voices != 1 else ''} "
                f"(<|speaker:0|>..<|speaker:{voices - 1}|>): add voices[{speaker}] or fix the tag"
            )
        if not body.strip():
            raise DialogueError(f"turn {index + 1} ({tag}) is empty: remove the tag or give it words")
        turns.append(Turn(speaker, (tag + body).strip(), body.strip()))
    return turns


def dialogue_segments(turns: list[Turn], max_bytes: int) -> list[DialogueSegment]:
    """Each turn its own segment, so a turn's audio starts and ends at a frame seam; a turn over
    `max_bytes` is cut into pieces that each repeat its tag (segment.split_turn)."""
    out = []
    for index, turn in enumerate(turns):
        pieces = (
            [turn.prompt_text] if utf8_len(turn.prompt_text) <= max_bytes else split_turn(turn.prompt_text, max_bytes)
        )
        out.extend(DialogueSegment(piece, index) for piece in pieces)
    return out


def spoken_text(text: str) -> str:
    """A segment's words without their speaker tag (what a speech rate or a transcript is
    measured against)."""
    return SPEAKER_TAG.sub("", text).strip()


def voice_text_problem(text: str, index: int) -> str | None:
    """Why voices[index]'s transcript cannot be used (None if it can): voices[i] is
    <|speaker:i|> by its place, so its text may carry only its own tag, first (upstream keeps
    a tagged transcript as it is and tags an untagged one)."""
    for match in SPEAKER_TAG.finditer(text):
        if match.group() != f"<|speaker:{index}|>" or match.start() != len(text) - len(text.lstrip()):
            return (
                f"voices[{index}].text contains {match.group()}: voices[{index}] is <|speaker:{index}|> by its "
                f"place in the list; remove the tag"
            )
    return None
