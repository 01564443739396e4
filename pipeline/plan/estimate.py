"""What a row will cost, planned as the run plans it: its segments and their frame budgets from
the same code the actor's chains use (actors/synth/segmenting.py), one row at a time in the
planning tasks (pipeline/plan/keys.py annotate), summed per decision (pipeline/plan/counts.py).

Two figures per row: `budget frames`, the sum of its segments' budgets -- the most the run can
generate for it, and exactly what it generates when every segment runs to its budget (EOS off,
engine.stop_on_eos=false; the demo's random model almost always: it rarely draws <|im_end|>)
-- and `speech frames`, what real speech of its text takes at a typical rate (each segment at
most its budget): what a real checkpoint, which ends each segment when its words are said,
generates (read speech's rates put it within about 0.8-1.3x: SPEECH_FRAMES_PER_BYTE).

What the driver cannot know without the model: the prompt's positions before the text (system
part, reference clip's codes, markers). Segments are planned as if they took none, which is
exact wherever segments are limited by long_form.segment_bytes or the budget's ceiling (the
demo's budget; real checkpoints with engine.max_tokens in the thousands); where engine.max_tokens
is what limits them (a long reference on a small engine) the run cuts more, smaller segments
than planned here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

import pyarrow as pa

from actors import schema as S
from actors.synth.budget import FrameBudget
from actors.synth.segmenting import SegmentingError, Sizing, dialogue_pieces, plain_pieces

# typical read speech in codec frames (21.5 a second) per UTF-8 byte of text: English at
# 150 words a minute (~12.5 characters a second, 1 byte each) 1.72, Mandarin at ~4.5
# characters a second (3 bytes each) 1.6; read speech from 120 to 180 words a minute (Mandarin
# 4-5 characters a second) spans 1.4-2.2, about 0.8-1.3x of it
SPEECH_FRAMES_PER_BYTE = 1.7
# the codec's frames per second of audio (44.1 kHz, 2048 samples a frame: S1's and S2's)
CODEC_FRAMES_PER_SECOND = 44100 / 2048


@dataclass(frozen=True)
class RowEstimate:
    """How the planning tasks plan each row's segments (picklable: each task gets it)."""

    budget: FrameBudget
    long_form: Any  # LongFormSettings
    positions: int  # engine.max_tokens (the model's context is larger for every family's checkpoints)

    def row(self, text: Any, voices: int, row_frames: Optional[int]) -> tuple[int, int, int]:
        """(segments, budget frames, speech frames) of one row; zeros for a row the run will
        refuse (no text, not a dialogue of its voices, too long to cut)."""
        if isinstance(text, (bytes, bytearray)):  # a binary text column: UTF-8, as the actor reads it
            text = bytes(text).decode("utf-8", "replace")
        if not isinstance(text, str) or not text.strip():
            return 0, 0, 0
        sizing = Sizing(self.budget, self.long_form, self.positions, 0, row_frames=row_frames)
        try:
            pieces = dialogue_pieces(text, voices, sizing) if voices else plain_pieces(text, text, sizing)
        except SegmentingError:
            return 0, 0, 0
        speech = sum(
            min(frames, math.ceil(SPEECH_FRAMES_PER_BYTE * len(words.encode("utf-8", "surrogatepass"))))
            for words, frames in zip(pieces.spoken, pieces.frames)
        )
        return len(pieces.texts), sum(pieces.frames), speech

    def columns(self, table: pa.Table) -> dict[str, list]:
        """Per row of a fragment (canonical names): segments, budget frames, speech frames."""
        n, names = table.num_rows, table.column_names
        texts = table.column(S.TEXT).to_pylist()
        voices = table.column(S.VOICES).to_pylist() if S.VOICES in names else [None] * n
        frames = table.column(S.MAX_FRAMES).to_pylist() if S.MAX_FRAMES in names else [None] * n
        rows = [self.row(t, len(v or ()), _frames(f)) for t, v, f in zip(texts, voices, frames)]
        return {
            "segments": [r[0] for r in rows],
            "budget_frames": [r[1] for r in rows],
            "speech_frames": [r[2] for r in rows],
        }


def _frames(value: Any) -> Optional[int]:
    """A max_frames cell as the actor reads it (a number, or text of one); None when unusable."""
    try:
        frames = int(value) if value is not None else None
    except (TypeError, ValueError):
        return None
    return frames if frames is not None and frames >= 0 else None
