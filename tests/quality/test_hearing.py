"""Hearing a finished row (actors/quality/hearing.py) with the demo's codec: decoded padded to a
frame bucket and cut back, measured, FLAC-encoded; what the finisher and the codec's child
process both run. Faults are planted around the real codec's decode."""

from __future__ import annotations

import io

import numpy as np
import pytest
import soundfile as sf
import torch

from actors.codec import load_codec
from actors.demo import demo_assets
from actors.quality import checks, hearing
from actors.quality.settings import QualitySettings

STEP = 1.0 / 32768  # one 16-bit FLAC step


@pytest.fixture(scope="module")
def codec():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield load_codec(demo_assets()[1], dtype="float32")
    torch.set_num_threads(previous)


def random_codes(codec, frames: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.integers(0, min(codec.codebook_sizes), (codec.num_codebooks, frames))


def hear(codec, tasks, quality=None, bucket: int = 16, rows: int = 1, decode=None) -> list:
    return hearing.hear(
        decode or codec.decode_batch,
        tasks,
        quality or QualitySettings(),
        codec.sample_rate,
        codec.frame_length,
        rows,
        bucket,
    )


def test_a_row_is_heard_as_its_codes_decode_alone(codec):
    codes = random_codes(codec, 37, seed=1)
    (alone,) = codec.decode_batch([codes], max_batch_rows=1)
    (heard,) = hear(codec, [hearing.HearTask(codes, "a short text", (37,))])
    assert heard.failure is None and heard.wave is None  # the wave stays where it was decoded
    assert heard.samples == 37 * codec.frame_length == len(alone)
    written, rate = sf.read(io.BytesIO(heard.flac), dtype="float32")
    assert rate == codec.sample_rate and len(written) == heard.samples
    # padded to 48 frames and cut back: the row's own samples, to within float rounding
    np.testing.assert_allclose(written, np.clip(alone, -1, 1), atol=1.5 * STEP)
    expected = checks.audio_metrics(alone, codec.sample_rate, "a short text", QualitySettings())
    assert heard.metrics.speech_rate_s_per_char == pytest.approx(expected.speech_rate_s_per_char)
    assert heard.metrics.silence_ratio == pytest.approx(expected.silence_ratio, abs=0.02)
    assert heard.decode_ms > 0 and heard.checks_ms >= 0 and heard.flac_ms > 0
    (kept,) = hear(codec, [hearing.HearTask(codes, None, (37,), keep_wave=True)])
    np.testing.assert_array_equal(kept.wave, hear(codec, [hearing.HearTask(codes, None, (37,), True)])[0].wave)
    assert len(kept.wave) == heard.samples and np.abs(kept.wave - alone).max() < 1e-5


def test_a_bucket_pads_with_code_zero_and_changes_nothing_the_row_owns(codec):
    codes = random_codes(codec, 21, seed=2)
    padded = hearing.padded(codes, 16)
    assert padded.shape == (codec.num_codebooks, 32) and not padded[:, 21:].any()
    np.testing.assert_array_equal(padded[:, :21], codes)
    assert hearing.padded(codes, 7) is codes  # already a multiple
    waves = {b: hear(codec, [hearing.HearTask(codes, None, (21,), True)], bucket=b)[0].wave for b in (1, 16, 32)}
    assert {len(w) for w in waves.values()} == {21 * codec.frame_length}
    assert max(np.abs(waves[b] - waves[1]).max() for b in (16, 32)) < 1e-5


def test_a_row_whose_decode_fails_fails_alone_and_retryable(codec):
    tasks = [hearing.HearTask(random_codes(codec, 10 + i, seed=i), None, (10 + i,)) for i in range(3)]
    poison = tasks[1].codes

    def decode(codes, **kw):
        if any(c.shape[1] >= poison.shape[1] and np.array_equal(c[:, : poison.shape[1]], poison) for c in codes):
            raise RuntimeError("planted decode failure")
        return codec.decode_batch(codes, **kw)

    heard = hear(codec, tasks, rows=3, decode=decode)
    assert [h.failure is None for h in heard] == [True, False, True]
    assert heard[1].retryable and "codec decode" in heard[1].failure and "planted" in heard[1].failure
    assert all(h.flac for i, h in enumerate(heard) if i != 1)


def test_non_finite_samples_fail_the_row_not_as_retryable(codec):
    def decode(codes, **kw):
        waves = codec.decode_batch(codes, **kw)
        waves[0][5] = np.nan
        return waves

    (heard,) = hear(codec, [hearing.HearTask(random_codes(codec, 12, seed=3), None, (12,))], decode=decode)
    assert heard.failure == "codec decode produced non-finite samples" and not heard.retryable and heard.flac is None


def test_segments_are_measured_alone_only_when_a_rejected_local_flag_shows(codec):
    frames = (14, 14, 14)
    codes = random_codes(codec, sum(frames), seed=4)
    stretch = frames[0] * codec.frame_length

    def second_segment_silent(codes, **kw):
        waves = codec.decode_batch(codes, **kw)
        for wave in waves:
            wave[stretch : 2 * stretch] = 0.0
        return waves

    def heard(quality, segments=frames):
        task = hearing.HearTask(codes, None, segments)
        return hear(codec, [task], quality, decode=second_segment_silent)[0]

    rejecting = QualitySettings(reject=["no_audio", "silence"], max_silence_ratio=0.2)
    measured = heard(rejecting).segment_metrics
    assert [m.silence_ratio for m in measured][1] == 1.0 and max(
        measured[0].silence_ratio, measured[2].silence_ratio
    ) < 1
    assert heard(QualitySettings(reject=["no_audio"], max_silence_ratio=0.2)).segment_metrics is None  # not rejected
    assert heard(rejecting, segments=(sum(frames),)).segment_metrics is None  # one segment: the row is the stretch
    assert heard(QualitySettings(reject=["no_audio", "silence"], max_silence_ratio=0.9)).segment_metrics is None
