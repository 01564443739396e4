"""The engine's public request/result types: what callers (the Ray actor, the CLI, the
benchmarks) hand in and get back. Plain dataclasses over numpy so that nothing outside the
engine needs torch to build or read them."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Optional

import numpy as np

STOP_EOS = "eos"
STOP_BUDGET = "budget"
STOP_ERROR = "error"
STOP_REASONS = (STOP_EOS, STOP_BUDGET, STOP_ERROR)


@dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling settings, applied in upstream fish-speech's order: top-p over the
    softmax of the raw logits, then top-k, then temperature, then a seeded draw.

    temperature 0 (or top_k 1) means greedy: argmax with ties broken to the lowest id.
    `ras_window` > 0 turns on S2's repetition-aware sampling: when the sampled semantic token
    already appeared among the row's last `ras_window` frames, a second draw is taken with
    `ras_temperature` / `ras_top_p`. `repetition_penalty` != 1 applies S1's penalty to the
    semantic tokens seen in the last `repetition_window` frames.
    """

    temperature: float = 0.8
    top_p: float = 0.8
    top_k: int = 30
    seed: int = 0
    ras_window: int = 0
    ras_temperature: float = 1.0
    ras_top_p: float = 0.9
    repetition_penalty: float = 1.0
    repetition_window: int = 16

    def validate(self) -> None:
        if not (self.temperature >= 0.0):
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not (0.0 < self.top_p <= 1.0):
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = off), got {self.top_k}")
        if self.ras_window < 0 or self.repetition_window < 0:
            raise ValueError("ras_window and repetition_window must be >= 0")
        if not (0.0 < self.ras_top_p <= 1.0) or self.ras_temperature < 0:
            raise ValueError("ras_top_p must be in (0, 1] and ras_temperature >= 0")
        if not (self.repetition_penalty > 0.0):
            raise ValueError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1

    def with_seed(self, seed: int) -> SamplingParams:
        return replace(self, seed=int(seed))


def upstream_sampling(family: str, **overrides) -> SamplingParams:
    """Upstream's defaults for a model family ('s1' or 's2'): temperature 0.8, top_p 0.8,
    top_k 30; S2 adds repetition-aware sampling over 10 frames, S1 a 1.1 repetition penalty
    over 16 frames."""
    if family == "s2":
        base = SamplingParams(ras_window=10)
    elif family == "s1":
        base = SamplingParams(repetition_penalty=1.1, repetition_window=16)
    else:
        raise ValueError(f"unknown model family {family!r} (expected 's1' or 's2')")
    return replace(base, **overrides)


@dataclass
class Request:
    """One row to synthesise.

    prompt: int64 token matrix [1 + num_codebooks, T] (row 0 token ids, rows 1.. codes at
    semantic columns, zeros at text columns), as built by `actors.engine.prompt`.
    prefix_key / prefix_len: the first `prefix_len` columns are shared with every other request
    of the same `prefix_key` (e.g. one reference voice); the engine may reuse their KV.
    """

    request_id: str
    prompt: np.ndarray
    max_frames: int
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop_on_eos: bool = True
    prefix_key: Optional[str] = None
    prefix_len: int = 0


@dataclass
class Result:
    """What became of one request. codes: int64 [num_codebooks, frames] (the `<|im_end|>`
    frame excluded). Timings in milliseconds: queue = submission to slot admission, prefill =
    the row's prompt work, decode = admission-to-finish minus prefill, first_frame = submission
    to first frame."""

    request_id: str
    codes: np.ndarray
    stop_reason: str
    error: Optional[str] = None
    prompt_tokens: int = 0
    frames: int = 0
    prefix_reused_tokens: int = 0
    queue_ms: float = 0.0
    prefill_ms: float = 0.0
    decode_ms: float = 0.0
    first_frame_ms: float = 0.0
    total_ms: float = 0.0

    @property
    def ok(self) -> bool:
        return self.stop_reason != STOP_ERROR

    @property
    def frame_ms(self) -> float:
        return self.decode_ms / self.frames if self.frames else 0.0
