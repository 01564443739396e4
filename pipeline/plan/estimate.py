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

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from actors import schema as S
from actors.synth.budget import FrameBudget
from actors.synth.segmenting import SegmentingError, Sizing, dialogue_pieces, fit_bytes, plain_pieces

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
        """Per row of a fragment (canonical names): segments, budget frames, speech frames. A
        plain row of one segment -- most rows -- is computed over the whole column at once;
        the others one at a time (`row`), as the actor cuts them."""
        n = table.num_rows
        out = {key: np.zeros(n, np.int64) for key in ("segments", "budget_frames", "speech_frames")}
        one = self._one_segment(table)
        sizes = pc.fill_null(pc.binary_length(table.column(S.TEXT)), 0).to_numpy(zero_copy_only=False)[one]
        frames = np.full(len(sizes), self.budget.max_frames, np.int64)
        if self.budget.frames_per_byte is not None:
            wanted = self.budget.min_frames + np.ceil(float(self.budget.frames_per_byte) * sizes).astype(np.int64)
            frames = np.minimum(frames, wanted)
        out["segments"][one] = 1
        out["budget_frames"][one] = frames
        out["speech_frames"][one] = np.minimum(frames, np.ceil(SPEECH_FRAMES_PER_BYTE * sizes).astype(np.int64))
        others = np.flatnonzero(~one)
        if len(others):
            picked = table.take(pa.array(others))
            texts = picked.column(S.TEXT).to_pylist()
            voices = _cells(picked, S.VOICES)
            row_frames = _cells(picked, S.MAX_FRAMES)
            for i, text, v, f in zip(others, texts, voices, row_frames):
                out["segments"][i], out["budget_frames"][i], out["speech_frames"][i] = self.row(
                    text, len(v or ()), _frames(f)
                )
        return {key: values.tolist() for key, values in out.items()}

    def _one_segment(self, table: pa.Table) -> np.ndarray:
        """A mask of the rows that are certainly one segment: a plain text (no voices, no
        max_frames of its own) that is not blank and fits one segment's bytes."""
        n, names = table.num_rows, table.column_names
        texts = table.column(S.TEXT)
        if not (pa.types.is_string(texts.type) or pa.types.is_large_string(texts.type)):
            return np.zeros(n, bool)
        try:
            sizing = Sizing(self.budget, self.long_form, self.positions, 0)
            max_bytes = fit_bytes(sizing)
        except ValueError:  # no segment fits at all: every row the slow way (it says why)
            return np.zeros(n, bool)
        spoken = pc.greater(pc.utf8_length(pc.utf8_trim_whitespace(texts)), 0)
        small = pc.less_equal(pc.binary_length(texts), max_bytes)
        mask = pc.fill_null(pc.and_(spoken, small), False).to_numpy(zero_copy_only=False)
        if S.VOICES in names:
            plain = pc.fill_null(pc.list_value_length(table.column(S.VOICES)), 0)
            mask &= pc.equal(plain, 0).to_numpy(zero_copy_only=False)
        if S.MAX_FRAMES in names:
            mask &= pc.is_null(table.column(S.MAX_FRAMES)).to_numpy(zero_copy_only=False)
        return mask


def _cells(table: pa.Table, name: str) -> list:
    return table.column(name).to_pylist() if name in table.column_names else [None] * table.num_rows


def _frames(value: Any) -> Optional[int]:
    """A max_frames cell as the actor reads it (a number, or text of one); None when unusable."""
    try:
        frames = int(value) if value is not None else None
    except (TypeError, ValueError):
        return None
    return frames if frames is not None and frames >= 0 else None
