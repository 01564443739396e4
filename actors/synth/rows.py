"""A row's own settings, read once from its input values into a frozen `RowSpec`: id, text,
seed, sampling, frame budget and reference. Anything wrong with the row's content is a
`RowError` naming the column, which becomes the row's error.

No torch: what is parsed here is plain values (the reference's codes are a numpy array).
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Optional

import numpy as np

from actors import schema as S
from actors.engine.segment import SPEAKER_TAG
from actors.synth.settings import INT32_MAX, ActorSettings, sampling_problem

SEED_MASK = (1 << 63) - 1  # seeds are stored as int64
WORD_JOINER = "\u2060"  # zero width, no sound, not a control character: breaks `<|` for the tokenizer
_SPECIAL_SPELLING = re.compile(r"<\|[^<>|\s]{1,64}\|>")
MAX_FRAMES_LIMIT = 1 << 20


class RowError(Exception):
    """A problem with one row's content; its message becomes the row's `error`."""


def row_seed(row_id: str, global_seed: int) -> int:
    """A row's seed when the table gives none: a stable hash of the run seed and the id, so a
    row samples the same stream whichever batch, actor or run it lands in."""
    digest = hashlib.blake2b(f"{global_seed}\x00{row_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") & SEED_MASK


@dataclass(frozen=True)
class RefSpec:
    """A row's reference: `key` names it in the actor's cache (rows with the same key share one
    encode and one prompt prefix); `source` is the clip to read (bytes, or a path or URI
    already confined to the root), `codes` the codes a ref_codes cell gave (nothing to read)."""

    key: str
    source: Any = None
    codes: Optional[np.ndarray] = None


@dataclass(frozen=True)
class VoiceSpec:
    """One voice of a row: its clip (or codes) and the clip's transcript ("" when none). A plain
    row has at most one (its ref_* columns); a dialogue row one per entry of its `voices`."""

    ref: RefSpec
    text: Any = ""


@dataclass(frozen=True)
class RowSpec:
    """One input row as the actor reads it. A row whose content fails a check keeps what was
    read before the check (its output row shows it) and gets its `RowError` beside it."""

    index: int
    id: Any
    values: dict
    text: Optional[str] = None
    seed: Optional[int] = None
    sampling: Any = None
    max_frames: Optional[int] = None
    voices: tuple[VoiceSpec, ...] = ()

    @property
    def dialogue(self) -> bool:
        """A dialogue row: its voices come from a `voices` list, and each turn is a segment."""
        return bool(self.values.get(S.VOICES))

    @property
    def explicit_frames(self) -> bool:
        """A max_frames column caps each segment; otherwise budgets follow the text."""
        return self.values.get(S.MAX_FRAMES) is not None

    @property
    def content_hash(self) -> Optional[str]:
        return self.values.get(S.CONTENT_HASH)


def parse_row(
    index: int,
    values: dict,
    settings: ActorSettings,
    base_sampling: Any,
    voices: Callable[[dict], Optional[tuple[VoiceSpec, ...]]],
) -> tuple[RowSpec, Optional[RowError]]:
    """The row's spec, and the RowError of the first check it fails (None when it passes).
    `voices` reads the row's voices: its ref_* columns or its `voices` list (ReferenceStore.voices)."""
    spec = RowSpec(index, values.get(S.ID), values)
    try:
        spec = _read_text(spec, settings)
        seed = values.get(S.SEED)
        spec = replace(
            spec,
            seed=_int(seed, S.SEED, 0, SEED_MASK) if seed is not None else row_seed(spec.id, settings.sampling.seed),
        )
        spec = replace(spec, sampling=_sampling(values, base_sampling.with_seed(spec.seed)))
        frames = values.get(S.MAX_FRAMES)
        budget = _int(frames, S.MAX_FRAMES, 0, MAX_FRAMES_LIMIT) if frames is not None else None
        spec = replace(spec, max_frames=budget if budget is not None else settings.model.budget.frames(spec.text))
        return replace(spec, voices=tuple(voices(values) or ())), None
    except RowError as e:
        return spec, e


def _read_text(spec: RowSpec, settings: ActorSettings) -> RowSpec:
    if not isinstance(spec.id, str):
        raise RowError(S.id_problem(spec.id) or "id is not a string")
    raw = spec.values.get(S.TEXT)
    if raw is None:
        raise RowError("text is null")
    size = len(raw.encode("utf-8", "surrogatepass")) if isinstance(raw, str) else len(raw)
    limit = settings.data.text_byte_limit
    if size > limit:  # before anything tokenizes it
        raise RowError(f"text is {size} bytes; the limit is {limit} (data.max_text_bytes)")
    return replace(spec, text=_text_of(raw))


def _sampling(values: dict, sampling: Any) -> Any:
    overrides = {}
    if values.get(S.TEMPERATURE) is not None:
        overrides["temperature"] = _float(values[S.TEMPERATURE], S.TEMPERATURE)
    if values.get(S.TOP_P) is not None:
        overrides["top_p"] = _float(values[S.TOP_P], S.TOP_P)
    if values.get(S.TOP_K) is not None:
        overrides["top_k"] = _int(values[S.TOP_K], S.TOP_K, 0, INT32_MAX)
    if overrides:
        sampling = replace(sampling, **overrides)
    try:
        sampling.validate()
    except ValueError as e:
        raise RowError(f"bad sampling settings: {e}") from None
    problem = sampling_problem(sampling.temperature, sampling.top_p, sampling.top_k)
    if problem:
        raise RowError(f"bad sampling settings: {problem}")
    return sampling


def escape_special_tokens(text: Any, special_tokens: frozenset) -> Any:
    """A row's text is words to speak, never prompt structure: every spelling of one of the
    tokenizer's special tokens (`<|im_end|>`, `<|semantic:5|>`, ...) gets an invisible WORD
    JOINER after its '<', so the tokenizer encodes it as plain characters. Speaker tags stay:
    they are the one structure a row's text carries (who speaks each turn). Text without such
    spellings (or not a string) is unchanged."""
    if not isinstance(text, str) or "<|" not in text:
        return text

    def escaped(match: re.Match) -> str:
        token = match.group(0)
        if token not in special_tokens or SPEAKER_TAG.fullmatch(token):
            return token
        return "<" + WORD_JOINER + token[1:]

    return _SPECIAL_SPELLING.sub(escaped, text)


def _int(value: Any, column: str, low: int, high: int) -> int:
    if isinstance(value, str):
        try:
            value = int(value.strip())
        except ValueError:
            raise RowError(f"{column} {value!r} is not an integer") from None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise RowError(f"{column} must be an integer, got {type(value).__name__}")
    if not low <= int(value) <= high:
        raise RowError(f"{column} {value} is outside [{low}, {high}]")
    return int(value)


def _float(value: Any, column: str) -> float:
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            raise RowError(f"{column} {value!r} is not a number") from None
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise RowError(f"{column} must be a number, got {type(value).__name__}")
    if not math.isfinite(float(value)):
        raise RowError(f"{column} {value} is not finite")
    return float(value)


def _text_of(value: Any) -> Optional[str]:
    """The row's text as a string when it is one (for the output and the frame budget); the
    prompt builder judges the raw value itself and names what is wrong with it."""
    if isinstance(value, str):
        return value
    if isinstance(value, (bytes, bytearray)):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            return None
    return None
