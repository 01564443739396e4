"""Reference-audio loading and audio byte encoding (actors/audio.py)."""

from __future__ import annotations

import io
import os

import numpy as np
import pytest
import soundfile

from actors.audio import (
    ReferenceAudioError,
    decode_audio,
    encode_audio,
    load_reference_audio,
)

TARGET = 44100


def tone(
    sample_rate: int, seconds: float = 1.0, frequency: float = 440.0, amplitude: float = 0.5, channels: int = 1
) -> np.ndarray:
    t = np.arange(int(round(seconds * sample_rate))) / sample_rate
    wave = amplitude * np.sin(2 * np.pi * frequency * t)
    if channels == 1:
        return wave.astype(np.float32)
    return np.stack([wave * (1.0 if c == 0 else 0.0) for c in range(channels)], axis=1).astype(np.float32)


def encoded(wave: np.ndarray, sample_rate: int, fmt: str = "WAV", subtype: str | None = None) -> bytes:
    buffer = io.BytesIO()
    soundfile.write(buffer, wave, sample_rate, format=fmt, subtype=subtype)
    return buffer.getvalue()


def dominant_frequency(wave: np.ndarray, sample_rate: int) -> float:
    spectrum = np.abs(np.fft.rfft(wave * np.hanning(len(wave))))
    return float(np.argmax(spectrum) * sample_rate / len(wave))


def rms(wave: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.square(wave, dtype=np.float64))))


CASES = [
    (8000, "WAV", "PCM_16"),
    (16000, "WAV", "PCM_U8"),
    (22050, "WAV", "PCM_24"),
    (48000, "WAV", "FLOAT"),
    (44100, "WAV", "PCM_16"),
    (48000, "FLAC", "PCM_16"),
    (22050, "FLAC", "PCM_24"),
    (16000, "OGG", "VORBIS"),
    (48000, "OGG", "VORBIS"),
]


@pytest.mark.parametrize("sample_rate,fmt,subtype", CASES)
def test_formats_and_rates_become_44k_float_mono(sample_rate, fmt, subtype):
    data = encoded(tone(sample_rate), sample_rate, fmt, subtype)
    wave = load_reference_audio(data)
    assert wave.dtype == np.float32 and wave.ndim == 1
    assert abs(len(wave) - TARGET) <= 2, len(wave)  # one second, whatever the input rate
    assert abs(dominant_frequency(wave, TARGET) - 440.0) <= 2.0
    # 0.5-amplitude sine: RMS 0.354, kept through decoding and resampling
    # (8-bit and Vorbis add a little noise).
    assert rms(wave) == pytest.approx(0.5 / np.sqrt(2), rel=0.03)


def test_stereo_is_mixed_down_to_the_channel_mean():
    stereo = tone(TARGET, channels=2)  # left: tone, right: silence
    wave = load_reference_audio(encoded(stereo, TARGET, "WAV", "FLOAT"))
    np.testing.assert_allclose(wave, stereo.mean(axis=1), atol=1e-7)


def test_path_and_bytes_give_the_same_wave(tmp_path):
    path = tmp_path / "voice.flac"
    soundfile.write(path, tone(22050), 22050, subtype="PCM_16")
    from_path = load_reference_audio(str(path))
    from_bytes = load_reference_audio(path.read_bytes())
    np.testing.assert_array_equal(from_path, from_bytes)
    np.testing.assert_array_equal(load_reference_audio(path), from_path)  # PathLike too


def test_target_rate_is_honoured():
    wave = load_reference_audio(encoded(tone(48000), 48000), target_sample_rate=24000)
    assert abs(len(wave) - 24000) <= 2


# ------------------------------------------------------------------ errors


def test_empty_bytes_are_refused():
    with pytest.raises(ReferenceAudioError, match=r"empty \(0 bytes\)"):
        load_reference_audio(b"")


def test_garbage_and_corrupt_bytes_are_refused():
    with pytest.raises(ReferenceAudioError, match="cannot decode.*WAV, FLAC or OGG"):
        load_reference_audio(b"this is not audio at all" * 10)
    good = encoded(tone(16000), 16000)
    corrupt = good[:12] + bytes(200)  # RIFF/WAVE header, then zeros instead of chunks
    with pytest.raises(ReferenceAudioError, match="cannot decode"):
        load_reference_audio(corrupt)


def test_zero_sample_clip_is_refused():
    with pytest.raises(ReferenceAudioError, match="no samples"):
        load_reference_audio(encoded(np.zeros(0, dtype=np.float32), 16000, "WAV", "PCM_16"))


def test_missing_file_is_refused(tmp_path):
    with pytest.raises(ReferenceAudioError, match="not found.*check the path"):
        load_reference_audio(str(tmp_path / "absent.wav"))
    with pytest.raises(ReferenceAudioError, match="not a regular file"):
        load_reference_audio(str(tmp_path))


def test_paths_must_stay_inside_root(tmp_path):
    root = tmp_path / "refs"
    root.mkdir()
    soundfile.write(root / "inside.wav", tone(16000), 16000)
    outside = tmp_path / "secret.wav"
    soundfile.write(outside, tone(16000), 16000)
    os.symlink(outside, root / "link.wav")

    assert len(load_reference_audio("inside.wav", root=root)) > 0  # relative to root
    assert len(load_reference_audio(str(root / "inside.wav"), root=str(root))) > 0
    for escape in ("../secret.wav", str(outside), "link.wav", str(root / "sub" / ".." / ".." / "secret.wav")):
        with pytest.raises(ReferenceAudioError, match="outside the allowed directory"):
            load_reference_audio(escape, root=root)
    with pytest.raises(ReferenceAudioError, match="not found"):
        load_reference_audio("absent.wav", root=root)


def test_too_long_clip_is_refused():
    data = encoded(tone(8000, seconds=31.0), 8000)
    with pytest.raises(ReferenceAudioError, match=r"31\.0 s long; the limit is 30 s.*Trim"):
        load_reference_audio(data)
    with pytest.raises(ReferenceAudioError, match="limit is 2 s"):
        load_reference_audio(encoded(tone(8000, seconds=3.0), 8000), max_seconds=2.0)
    assert len(load_reference_audio(data, max_seconds=40.0)) > 0


def test_silent_clip_is_refused():
    with pytest.raises(ReferenceAudioError, match="silent"):
        load_reference_audio(encoded(np.zeros(16000, dtype=np.float32), 16000, "WAV", "PCM_16"))
    whisper = tone(16000, amplitude=1e-5)
    with pytest.raises(ReferenceAudioError, match=r"silent \(RMS 7\.\d+e-06"):
        load_reference_audio(encoded(whisper, 16000, "WAV", "FLOAT"))
    assert len(load_reference_audio(encoded(whisper, 16000, "WAV", "FLOAT"), min_rms=1e-6)) > 0


def test_non_finite_samples_are_refused():
    for bad in (np.nan, np.inf):
        wave = tone(16000)
        wave[100] = bad
        with pytest.raises(ReferenceAudioError, match="NaN or infinite"):
            load_reference_audio(encoded(wave, 16000, "WAV", "FLOAT"))


def test_other_source_types_are_refused():
    with pytest.raises(ReferenceAudioError, match="bytes or a file path, got int"):
        load_reference_audio(12345)  # type: ignore[arg-type]


def test_errors_are_value_errors():
    assert issubclass(ReferenceAudioError, ValueError)


# --------------------------------------------------------- encode / decode


def test_flac_is_16_bit_and_clipped():
    wave = np.array([0.0, 0.5, 1.5, -2.0, -0.25] * 100, dtype=np.float32)
    data = encode_audio(wave, 44100, "flac")
    assert soundfile.info(io.BytesIO(data)).subtype == "PCM_16"
    decoded, rate = decode_audio(data)
    assert rate == 44100 and decoded.dtype == np.float32
    assert decoded.max() <= 1.0 and decoded.min() >= -1.0
    np.testing.assert_allclose(decoded, np.clip(wave, -1, 1), atol=1 / 2**15)


def test_wav_is_float_and_exact():
    wave = tone(22050) * 3  # beyond [-1, 1] survives in float WAV
    data = encode_audio(wave, 22050, fmt="WAV")
    assert soundfile.info(io.BytesIO(data)).subtype == "FLOAT"
    decoded, rate = decode_audio(data)
    assert rate == 22050
    np.testing.assert_array_equal(decoded, wave)


def test_encode_and_decode_refuse_bad_input():
    with pytest.raises(ValueError, match="unsupported audio format 'mp3'"):
        encode_audio(tone(8000), 8000, "mp3")
    with pytest.raises(ValueError, match="NaN or infinite"):
        encode_audio(np.array([0.0, np.nan], dtype=np.float32), 8000)
    with pytest.raises(ValueError, match="empty"):
        decode_audio(b"")
    with pytest.raises(ValueError, match="cannot decode"):
        decode_audio(b"garbage" * 20)
