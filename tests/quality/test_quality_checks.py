"""The per-row checks on constructed inputs (a silent clip, a clipped sine, a looping code
sequence, a zero-frame result, a budget-hit result), the attempt logic and the quality
settings' checks."""

from __future__ import annotations

import numpy as np
import pytest

from actors.errors import ConfigError
from actors.quality import attempts, checks
from actors.quality.row_quality import RowQuality, SegmentAttempts
from actors.quality.settings import QualitySettings

SR = 44100
LIMITS = QualitySettings()


def sine(seconds: float, amplitude: float = 0.3, freq: float = 220.0) -> np.ndarray:
    return (amplitude * np.sin(2 * np.pi * freq * np.arange(int(seconds * SR)) / SR)).astype(np.float32)


def random_codes(frames: int, seed: int = 0, codebooks: int = 4) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 1024, size=(codebooks, frames))


def test_a_zero_frame_result_has_no_audio():
    assert checks.code_flags(np.zeros((4, 0), dtype=np.int64), ["eos"], LIMITS) == (["no_audio"], 0.0)


def test_a_budget_hit_result_is_truncated():
    flags, _ = checks.code_flags(random_codes(200), ["eos", "budget"], LIMITS)
    assert flags == ["truncated"]
    assert checks.code_flags(random_codes(200), ["eos", "eos"], LIMITS)[0] == []


def test_a_looping_code_sequence_repeats():
    phrase = np.random.default_rng(3).integers(0, 1024, size=9)
    looping = np.tile(phrase, 20)  # 180 frames: a 9-frame phrase, 20 times
    ratio = checks.repeat_ratio(looping, 4)
    # every 4-gram after the first period (9 distinct) repeats one: (177 - 9) / 177
    assert ratio == pytest.approx((177 - 9) / 177)
    codes = np.stack([looping, random_codes(180)[1]])
    assert checks.code_flags(codes, ["budget"], LIMITS) == (["truncated", "repetition"], ratio)
    assert checks.repeat_ratio(np.arange(180), 4) == 0.0
    # speech-like tokens: a little repetition, well under the bound
    assert checks.repeat_ratio(random_codes(300, seed=4)[0], 4) < 0.05
    assert checks.repeat_ratio(np.array([5, 5]), 4) == 0.0  # too short to judge


def test_a_silent_clip():
    quiet = np.concatenate([sine(1.0), np.zeros(3 * SR, dtype=np.float32)])
    assert checks.silence_ratio(quiet, SR) == pytest.approx(0.75, abs=0.01)
    assert checks.silence_ratio(sine(1.0), SR) == 0.0
    # -50 dBFS noise is silence at the -45 dBFS threshold, speech-level noise is not
    noise = np.random.default_rng(0).standard_normal(SR)
    assert checks.silence_ratio(noise * 10 ** (-50 / 20), SR) == 1.0
    assert checks.silence_ratio(noise * 10 ** (-30 / 20), SR) == 0.0
    metrics = checks.audio_metrics(np.zeros(2 * SR, dtype=np.float32), SR, "hello there", LIMITS)
    assert metrics.silence_ratio == 1.0 and metrics.below_gate and metrics.loudness_lufs is None
    assert checks.audio_flags(metrics, LIMITS) == ["silence", "loudness"]


def test_a_clipped_sine():
    clipped = np.clip(sine(1.0, amplitude=2.0), -1.0, 1.0)
    # |2 sin| >= 0.999 where |sin| >= 0.4995: 2/3 of the period (arcsin(0.4995) ~ pi/6)
    assert checks.clipped_ratio(clipped) == pytest.approx(2 / 3, abs=0.01)
    assert checks.clipped_ratio(sine(1.0, amplitude=0.9)) == 0.0
    metrics = checks.audio_metrics(clipped, SR, "x" * 12, LIMITS)
    assert "clipping" in checks.audio_flags(metrics, LIMITS)


def test_speech_rate_bounds():
    assert checks.speech_rate(2.0, "ab cd\n") == 0.5  # 4 characters, whitespace not counted
    assert checks.speech_rate(2.0, "  ") is None and checks.speech_rate(1.0, None) is None
    normal = checks.audio_metrics(sine(2.0), SR, "x" * 30, LIMITS)  # 0.067 s/char
    assert normal.speech_rate_s_per_char == pytest.approx(2 / 30, rel=1e-3)
    assert checks.audio_flags(normal, LIMITS) == []
    too_slow = checks.audio_metrics(sine(2.0), SR, "xy", LIMITS)  # 1 s/char: babble or silence
    assert checks.audio_flags(too_slow, LIMITS) == ["speech_rate"]


def test_flags_are_ordered_most_severe_first():
    assert checks.ordered(["loudness", "no_audio", "silence", "no_audio"]) == ["no_audio", "silence", "loudness"]


def test_the_best_attempt_has_the_least_severe_flags():
    # audio with flaws beats no audio; fewer flags beat more of the same severity; earliest wins ties
    assert attempts.best_attempt([["no_audio"], ["silence", "clipping"], ["no_audio"]]) == 1
    assert attempts.best_attempt([["truncated", "loudness"], ["truncated"]]) == 1
    assert attempts.best_attempt([["repetition"], ["speech_rate", "silence", "clipping", "loudness"]]) == 1
    assert attempts.best_attempt([["silence"], ["silence"], []]) == 2
    assert attempts.best_attempt([["silence"], ["clipping"], ["silence"]]) == 1
    assert attempts.best_attempt([["silence"], ["silence"]]) == 0
    with pytest.raises(ValueError):
        attempts.best_attempt([])


def test_the_reject_decision():
    reject = QualitySettings().reject
    assert reject == ["no_audio"]
    assert attempts.is_rejected(["no_audio"], reject) and not attempts.is_rejected(["silence"], reject)
    assert attempts.should_retry(["no_audio"], reject, attempt=1, max_attempts=3)
    assert not attempts.should_retry(["no_audio"], reject, attempt=2, max_attempts=3)
    assert not attempts.should_retry(["truncated"], reject, attempt=0, max_attempts=3)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"reject": ["no_audio", "nope"]}, "quality.reject: unknown flag 'nope'"),
        ({"reject": ["wer"]}, "quality.asr is null"),
        ({"max_attempts": 0}, "quality.max_attempts must be >= 1"),
        ({"max_silence_ratio": 1.5}, "quality.max_silence_ratio must be in [0, 1]"),
        ({"min_lufs": -3.0}, "quality.min_lufs (-3.0) must be <= quality.max_lufs"),
        ({"asr": "vosk", "asr_model": "/m"}, "quality.asr must be null or one of whisper"),
        ({"asr": "whisper"}, "quality.asr_model is null"),
        ({"clip_level": 0.0}, "quality.clip_level must be in (0, 1]"),
    ],
)
def test_bad_quality_settings_name_the_key(change, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        QualitySettings(**change).validate()
    QualitySettings().validate()


# ---- the gate's bookkeeping ----------------------------------------------------------------
FPS = 44100 / 2048  # the codec's frames per second


def test_a_segment_without_frames_is_tried_again_and_the_good_attempt_kept():
    segment = SegmentAttempts(QualitySettings(), "hello world", FPS)
    assert segment.offer("first", np.zeros((4, 0), dtype=np.int64), "eos") is True
    assert segment.next_attempt == 1
    assert segment.offer("second", random_codes(20), "eos") is False
    assert segment.kept().payload == "second" and segment.discarded_frames() == 0
    row = RowQuality(QualitySettings())
    row.add_segment(segment)
    assert (row.attempts, row.flags, row.rejected) == (2, [], False)


def test_a_segment_failing_every_attempt_keeps_its_best_and_rejects_the_row():
    strict = QualitySettings(reject=["no_audio", "truncated", "repetition"], max_attempts=3)
    segment = SegmentAttempts(strict, "a" * 20, FPS)
    loop = np.stack([np.tile([1, 2, 3], 30), np.zeros(90, dtype=np.int64)])
    assert segment.offer("loop+budget", loop, "budget") is True  # truncated, repetition
    assert segment.offer("empty", np.zeros((2, 0), dtype=np.int64), "eos") is True  # no_audio
    assert segment.offer("budget", random_codes(30, codebooks=2), "budget") is False  # the last attempt
    kept = segment.kept()
    assert kept.payload == "budget" and kept.flags == ["truncated"]
    assert segment.discarded_frames() == 90
    row = RowQuality(strict)
    row.add_segment(segment)
    assert row.rejected and row.attempts == 3 and row.discarded_frames == 90
    row.add_audio(checks.audio_metrics(np.zeros(SR, dtype=np.float32), SR, "a" * 20, strict))
    columns = row.columns()
    assert columns["quality_flags"] == ["truncated", "silence", "loudness"]
    assert columns["attempts"] == 3 and columns["silence_ratio"] == 1.0 and columns["loudness_lufs"] is None


def test_a_segments_speech_rate_is_judged_from_its_frames():
    settings = QualitySettings(reject=["speech_rate"], max_attempts=2)
    segment = SegmentAttempts(settings, "hi", FPS)  # 2 characters
    assert segment.offer("slow", random_codes(43), "eos") is True  # 2 s for 2 characters: 1 s/char
    assert segment.offer("also slow", random_codes(43), "eos") is False
    assert segment.kept().flags == ["speech_rate"] and segment.kept().payload == "slow"
