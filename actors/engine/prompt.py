"""Request -> the exact token matrix an S1 or S2 checkpoint was trained on (docs/architecture.md §5.10).

Each text piece is tokenized on its own, as upstream encodes each part of its content
sequence separately (with a merging BPE, joining first could change the tokens).

S2 (chat form):
  <|im_start|>system\\n | convert the provided text to speech reference to the following:\\n\\nText:\\n
  | {ref texts, each tagged <|speaker:i|>, joined by \\n} | \\n\\nSpeech:\\n | {ref codes}
  | <|im_end|>\\n | <|im_start|>user\\n | {text} | <|im_end|>\\n | <|im_start|>assistant\\n<|voice|>
  (without a reference the system text is just "convert the provided text to speech").
S1 (interleave form):
  <|interleave|> | per ref: <|speaker:0|> | {ref_text} | {ref codes} | <|im_end|>
  | <|speaker:0|> | {text}

`prefix_len` counts the leading columns that depend only on the references (and the
format), so rows sharing references can share that part of the KV cache.

Long-form continuation (`build_segment`): segment k of a row carries the row's previous
segments (text + the codes generated for it) between the reference part and its own text,
as upstream's `generate_long` grows its conversation:
S2: ... <|im_end|>\n | per previous: <|im_start|>user\n | {text} | <|im_end|>\n
  | <|im_start|>assistant\n<|voice|> | {codes} | <|im_end|>\n | then segment k as above.
S1: (upstream's S1 `generate_long` never segments; a previous segment is encoded as the
  interleave sequence encodes any text + audio pair, i.e. like a reference turn)
  ... <|im_end|> | per previous: <|speaker:0|> | {text} | {codes} | <|im_end|> | <|speaker:0|> | {text}
Both keep the reference part first, so `prefix_len` (and prefix reuse) is that of `build`.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Optional

import numpy as np

from .architecture import FAMILY_S2, ModelArchitecture
from .segment import kept_history
from .tokenizer import IM_END, IM_START, INTERLEAVE, SPEAKER_TEMPLATE, VOICE, Tokenizer

S2_SYSTEM_WITH_REFERENCE = "convert the provided text to speech reference to the following:\n\nText:\n"
S2_SYSTEM_PLAIN = "convert the provided text to speech"
S2_SPEECH_HEADER = "\n\nSpeech:\n"
_SPEAKER_TAG = re.compile(r"<\|speaker:\d+\|>")
_ALLOWED_CONTROLS = {"\n", "\t", "\r"}


class PromptError(ValueError):
    """Bad request content (text or reference codes); the message names the problem."""


@dataclass(frozen=True)
class Reference:
    text: str
    codes: np.ndarray  # int64 [num_codebooks, frames]


@dataclass(frozen=True)
class PreviousSegment:
    """A segment of the same row generated earlier: its text and the codes generated for it."""

    text: str
    codes: np.ndarray  # int64 [num_codebooks, frames]


@dataclass
class Prompt:
    tokens: np.ndarray  # int64 [1 + num_codebooks, T]
    prefix_len: int
    # build_segment: how many of the previous segments (the newest ones) the prompt carries
    history_kept: int = 0


def check_text(text, what: str = "text") -> str:
    """Reject what no tokenizer should see: non-strings, invalid UTF-8, control characters.
    Normalisation is the user's business and is left alone."""
    if isinstance(text, (bytes, bytearray)):
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError as e:
            raise PromptError(f"{what} is not valid UTF-8 ({e})") from None
    if not isinstance(text, str):
        raise PromptError(f"{what} must be a string, got {type(text).__name__}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise PromptError(f"{what} is not valid UTF-8 (it contains an unpaired surrogate)") from None
    for i, ch in enumerate(text):
        if ch not in _ALLOWED_CONTROLS and unicodedata.category(ch) == "Cc":
            raise PromptError(
                f"{what} contains control character U+{ord(ch):04X} at position {i}; "
                f"remove it (only tab and newlines are allowed)"
            )
    return text


def split_speaker_turns(text: str) -> str:
    """Upstream splits text at <|speaker:N|> tags, strips each turn and joins them with a
    newline; text without tags is used unchanged."""
    pieces = re.split(r"(<\|speaker:\d+\|>)", text)
    turns = []
    i = 0
    while i < len(pieces):
        piece = pieces[i].strip()
        if _SPEAKER_TAG.fullmatch(piece):
            turns.append((piece + pieces[i + 1]).strip() if i + 1 < len(pieces) else piece)
            i += 2
        else:
            i += 1
    return "\n".join(turns) if turns else text


class PromptBuilder:
    def __init__(self, tokenizer: Tokenizer, config: ModelArchitecture):
        self.tokenizer, self.config = tokenizer, config
        self.rows = 1 + config.num_codebooks

    @classmethod
    def for_model(cls, loaded) -> PromptBuilder:
        return cls(loaded.tokenizer, loaded.config)

    def _text(self, text: str) -> np.ndarray:
        ids = self.tokenizer.encode(text)
        cols = np.zeros((self.rows, len(ids)), dtype=np.int64)
        cols[0] = ids
        return cols

    def _codes(self, ref: Reference, index: int, what: str = "reference") -> np.ndarray:
        c = self.config
        codes = np.asarray(ref.codes)
        if codes.ndim != 2 or codes.shape[0] != c.num_codebooks:
            raise PromptError(
                f"{what} {index}: codes must have shape [{c.num_codebooks}, frames], got {list(codes.shape)}"
            )
        if codes.shape[1] == 0:
            raise PromptError(f"{what} {index}: codes have no frames")
        if not np.issubdtype(codes.dtype, np.integer):
            raise PromptError(f"{what} {index}: codes must be integers, got {codes.dtype}")
        if codes.min() < 0 or codes.max() >= c.codebook_size:
            raise PromptError(
                f"{what} {index}: codes must lie in [0, {c.codebook_size}), got [{codes.min()}, {codes.max()}]"
            )
        cols = np.zeros((self.rows, codes.shape[1]), dtype=np.int64)
        cols[0] = codes[0] + c.semantic_begin_id
        cols[1:] = codes
        return cols

    def build(
        self,
        text: str,
        ref_text: Optional[str] = None,
        ref_codes: Optional[np.ndarray] = None,
        references: Optional[Sequence[Reference]] = None,
    ) -> Prompt:
        return self.build_segment(text, (), ref_text=ref_text, ref_codes=ref_codes, references=references)

    def build_segment(
        self,
        text: str,
        previous: Sequence[PreviousSegment],
        ref_text: Optional[str] = None,
        ref_codes: Optional[np.ndarray] = None,
        references: Optional[Sequence[Reference]] = None,
        max_columns: Optional[int] = None,
    ) -> Prompt:
        """Segment k's prompt: the reference part, then the row's `previous` segments (oldest
        first), then `text`. With `max_columns` (the per-row budget minus the segment's frames)
        the oldest previous segments drop out until the prompt fits; the reference part and
        the segment's own text never do (a prompt too long even so is left for the engine to
        reject, naming the budget). Without previous segments this is exactly `build`."""
        text = check_text(text)
        if not text.strip():
            raise PromptError("text is empty")
        refs = list(references or [])
        if ref_codes is not None:
            refs.insert(0, Reference(ref_text or "", ref_codes))
        elif ref_text:
            raise PromptError("ref_text was given without a reference clip/codes")
        for i, r in enumerate(refs):
            check_text(r.text, f"reference {i} text")
        history = []
        for i, seg in enumerate(previous):
            check_text(seg.text, f"previous segment {i} text")
            history.append(np.concatenate(self._history_block(seg, i), axis=1))
        if self.config.family == FAMILY_S2:
            prefix, suffix = self._s2(text, refs)
        else:
            prefix, suffix = self._s1(text, refs)
        prefix_cols = np.concatenate(prefix, axis=1)
        suffix_cols = np.concatenate(suffix, axis=1)
        first = 0
        if max_columns is not None:
            room = max_columns - prefix_cols.shape[1] - suffix_cols.shape[1]
            first = kept_history([h.shape[1] for h in history], room)
        tokens = np.concatenate([prefix_cols, *history[first:], suffix_cols], axis=1)
        return Prompt(tokens=tokens, prefix_len=prefix_cols.shape[1], history_kept=len(history) - first)

    def _history_block(self, seg: PreviousSegment, index: int) -> list[np.ndarray]:
        """A previous segment's columns, placed right after the reference part. Both formats'
        reference parts end with the opening of the next text turn (S2 `<|im_start|>user\n`,
        S1 `<|speaker:0|>`), so a block is: text, codes and closing markers, then that
        opening again for what follows; the reference part stays a shareable prefix."""
        t = self._text
        codes = self._codes(Reference(seg.text, seg.codes), index, "previous segment")
        if self.config.family == FAMILY_S2:
            return [
                t(split_speaker_turns(seg.text)),
                t(IM_END + "\n"),
                t(f"{IM_START}assistant\n{VOICE}"),
                codes,
                t(IM_END + "\n"),
                t(f"{IM_START}user\n"),
            ]
        return [t(seg.text), codes, t(IM_END), t(SPEAKER_TEMPLATE.format(0))]

    def _s2(self, text: str, refs: list[Reference]):
        t = self._text
        prefix = [t(f"{IM_START}system\n")]
        if refs:
            tagged = [
                r.text if _SPEAKER_TAG.search(r.text) else SPEAKER_TEMPLATE.format(i) + r.text
                for i, r in enumerate(refs)
            ]
            prefix += [t(S2_SYSTEM_WITH_REFERENCE), t("\n".join(tagged)), t(S2_SPEECH_HEADER)]
            prefix += [self._codes(r, i) for i, r in enumerate(refs)]
        else:
            prefix.append(t(S2_SYSTEM_PLAIN))
        prefix += [t(IM_END + "\n"), t(f"{IM_START}user\n")]
        suffix = [t(split_speaker_turns(text)), t(IM_END + "\n"), t(f"{IM_START}assistant\n{VOICE}")]
        return prefix, suffix

    def _s1(self, text: str, refs: list[Reference]):
        t = self._text
        speaker = SPEAKER_TEMPLATE.format(0)
        prefix = [t(INTERLEAVE)]
        for i, r in enumerate(refs):
            prefix += [t(speaker), t(r.text), self._codes(r, i), t(IM_END)]
        prefix.append(t(speaker))
        return prefix, [t(text)]
