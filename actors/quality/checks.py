"""The cheap checks run on every row and segment, from its codes, stop reasons, audio and text.

Each metric is a pure function; `code_flags` (what a segment's codes alone show, known as soon
as the engine returns it) and `audio_metrics` / `audio_flags` (what the decoded row shows) turn
them into the flag names of `FLAGS`, which `quality.reject` picks from.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Optional

import numpy as np

from actors.quality.loudness import integrated_loudness
from actors.quality.settings import (
    CLIPPING,
    FLAGS,
    LOUDNESS,
    NO_AUDIO,
    REPETITION,
    SILENCE,
    SPEECH_RATE,
    TRUNCATED,
    QualitySettings,
)

STOP_BUDGET = "budget"  # actors/engine/types.py's STOP_BUDGET, spelled here to stay torch- and engine-free

SILENCE_FRAME_S = 0.02  # the window the silence share is counted in (20 ms, a speech frame)


def is_truncated(stop_reasons: Sequence[str]) -> bool:
    """A row (or segment) that ran to its frame budget before drawing <|im_end|>."""
    return any(reason == STOP_BUDGET for reason in stop_reasons)


def repeat_ratio(semantic: np.ndarray, n: int = 4) -> float:
    """Share of the row's semantic n-grams (codebook 0, n frames each) that repeat an earlier
    one: 0 for tokens that never repeat a stretch, towards 1 for a loop.

    A ratio over the row rather than the longest repeated run: it is one number on the same
    scale for rows of any length, it does not depend on the loop's period (a 3-frame stutter
    and a 40-frame repeated phrase both drive it up, where a run search must try every
    period), and it is one pass with a set. Its weakness, a short loop diluted by a long row,
    is bounded because long rows are checked per segment (a few hundred bytes of text each).
    n = 4 frames (~190 ms) is shorter than a syllable's repetition but long enough that
    natural speech rarely repeats one exactly."""
    tokens = np.asarray(semantic).reshape(-1)
    count = len(tokens) - n + 1
    if count <= 1:
        return 0.0
    windows = np.lib.stride_tricks.sliding_window_view(tokens, n)
    distinct = len(np.unique(windows, axis=0))
    return (count - distinct) / count


def speech_rate(audio_seconds: float, text: Optional[str]) -> Optional[float]:
    """Seconds of audio per character of text, whitespace not counted (None without text)."""
    chars = sum(1 for c in text or "" if not c.isspace())
    return audio_seconds / chars if chars else None


def silence_ratio(audio: np.ndarray, sample_rate: int, threshold_dbfs: float = -45.0) -> float:
    """Share of 20 ms frames whose RMS is below threshold_dbfs (full scale = 1.0); a partial
    frame at the end counts as a frame."""
    x = np.asarray(audio, dtype=np.float64).reshape(-1)
    if len(x) == 0:
        return 1.0
    frame = max(1, int(round(SILENCE_FRAME_S * sample_rate)))
    padded = np.zeros(-(-len(x) // frame) * frame)
    padded[: len(x)] = x
    frames = padded.reshape(-1, frame)
    lengths = np.full(len(frames), frame)
    lengths[-1] = len(x) - frame * (len(frames) - 1)
    rms = np.sqrt((frames * frames).sum(axis=1) / lengths)
    return float(np.mean(rms < 10.0 ** (threshold_dbfs / 20.0)))


def clipped_ratio(audio: np.ndarray, level: float = 0.999) -> float:
    """Share of samples at full scale (|x| >= level)."""
    x = np.asarray(audio).reshape(-1)
    return float(np.mean(np.abs(x) >= level)) if len(x) else 0.0


def code_flags(codes: np.ndarray, stop_reasons: Sequence[str], limits: QualitySettings) -> tuple[list[str], float]:
    """The flags a segment's (or row's) codes [C, frames] and stop reasons show, and its repeat
    ratio: no frames, cut off by the budget, looping."""
    codes = np.asarray(codes)
    frames = codes.shape[-1] if codes.ndim == 2 else 0
    if frames == 0:
        return [NO_AUDIO], 0.0
    ratio = repeat_ratio(codes[0], limits.repeat_ngram)
    flags = []
    if is_truncated(stop_reasons):
        flags.append(TRUNCATED)
    if ratio > limits.max_repeat_ratio:
        flags.append(REPETITION)
    return flags, ratio


@dataclass(frozen=True)
class AudioMetrics:
    speech_rate_s_per_char: Optional[float]
    silence_ratio: float
    clipped_ratio: float
    # None: shorter than one 400 ms block, or below the absolute gate (-inf, not stored)
    loudness_lufs: Optional[float]
    below_gate: bool  # every block below -70 LUFS


def audio_metrics(audio: np.ndarray, sample_rate: int, text: Optional[str], limits: QualitySettings) -> AudioMetrics:
    audio = np.asarray(audio, dtype=np.float32).reshape(-1)
    lufs = integrated_loudness(audio, sample_rate) if len(audio) else None
    below_gate = lufs is not None and math.isinf(lufs)
    return AudioMetrics(
        speech_rate_s_per_char=speech_rate(len(audio) / sample_rate, text),
        silence_ratio=silence_ratio(audio, sample_rate, limits.silence_dbfs),
        clipped_ratio=clipped_ratio(audio, limits.clip_level),
        loudness_lufs=None if below_gate else lufs,
        below_gate=below_gate,
    )


def audio_flags(metrics: AudioMetrics, limits: QualitySettings) -> list[str]:
    """The flags a decoded row's audio metrics show (in FLAGS order)."""
    flags = []
    rate = metrics.speech_rate_s_per_char
    if rate is not None and not limits.min_s_per_char <= rate <= limits.max_s_per_char:
        flags.append(SPEECH_RATE)
    if metrics.silence_ratio > limits.max_silence_ratio:
        flags.append(SILENCE)
    if metrics.clipped_ratio > limits.max_clipped_ratio:
        flags.append(CLIPPING)
    lufs = metrics.loudness_lufs
    if metrics.below_gate or (lufs is not None and not limits.min_lufs <= lufs <= limits.max_lufs):
        flags.append(LOUDNESS)
    return flags


def ordered(flags: Sequence[str]) -> list[str]:
    """Flags without repeats, most severe first (the column's order)."""
    return [flag for flag in FLAGS if flag in set(flags)]
