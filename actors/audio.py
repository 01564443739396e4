"""Audio bytes <-> float32 waves for the actors: reference clips in, FLAC/WAV out.

Only numpy, soundfile and soxr are imported here (no torch), so the driver
side and tests can use it cheaply.
"""

from __future__ import annotations

import io
import math
import os
from pathlib import Path
from typing import Optional, Union

import numpy as np
import soundfile
import soxr

AudioSource = Union[bytes, bytearray, memoryview, str, os.PathLike]

SUPPORTED_CONTAINERS = "WAV, FLAC or OGG"


class ReferenceAudioError(ValueError):
    """A reference clip cannot be used; the message says why and what to do."""


def load_reference_audio(
    source: AudioSource,
    *,
    target_sample_rate: int = 44100,
    max_seconds: float = 30.0,
    root: Optional[Union[str, os.PathLike]] = None,
    min_rms: float = 1e-4,
) -> np.ndarray:
    """Decode a reference clip to float32 mono at target_sample_rate.

    `source` is encoded audio (bytes) or a file path. With `root`, a path
    must resolve (symlinks and '..' included) to a file inside root; a
    relative path is taken relative to root. Any sample rate, channel count
    and sample format soundfile reads is accepted: channels are averaged and
    the rate converted with soxr (high quality).

    Raises ReferenceAudioError for empty, undecodable, missing, out-of-root,
    too long, silent or non-finite audio.
    """
    if isinstance(source, (bytes, bytearray, memoryview)):
        data = bytes(source)
        if not data:
            raise ReferenceAudioError(f"reference audio is empty (0 bytes); pass {SUPPORTED_CONTAINERS} file bytes")
        handle: Union[io.BytesIO, str] = io.BytesIO(data)
        label = f"reference audio ({len(data)} bytes)"
    elif isinstance(source, (str, os.PathLike)):
        path = _resolve_reference_path(source, root)
        handle = str(path)
        label = f"reference audio file {path}"
    else:
        raise ReferenceAudioError(f"reference audio must be bytes or a file path, got {type(source).__name__}")

    wave, sample_rate = _read_limited(handle, label, max_seconds)
    if wave.shape[0] == 0:
        raise ReferenceAudioError(f"{label} holds no samples; provide a clip of speech (a few seconds is enough)")
    if not np.isfinite(wave).all():
        raise ReferenceAudioError(
            f"{label} contains NaN or infinite samples; re-export it as 16-bit PCM {SUPPORTED_CONTAINERS}"
        )
    mono = wave.mean(axis=1, dtype=np.float64).astype(np.float32) if wave.shape[1] > 1 else wave[:, 0]
    rms = float(np.sqrt(np.mean(np.square(mono, dtype=np.float64))))
    if rms < min_rms:
        raise ReferenceAudioError(
            f"{label} is silent (RMS {rms:.2e} < {min_rms:.0e}); provide a clip with audible speech"
        )
    return resample(mono, sample_rate, target_sample_rate)


def resample(wave: np.ndarray, source_rate: int, target_rate: int) -> np.ndarray:
    """float32 mono wave from source_rate to target_rate (soxr, high quality)."""
    wave = np.ascontiguousarray(wave, dtype=np.float32)
    if int(source_rate) == int(target_rate):
        return wave
    if source_rate <= 0 or target_rate <= 0:
        raise ValueError(f"sample rates must be positive, got {source_rate} -> {target_rate}")
    return np.ascontiguousarray(soxr.resample(wave, int(source_rate), int(target_rate), quality="HQ"), dtype=np.float32)


def encode_audio(wave: np.ndarray, sample_rate: int, fmt: str = "flac") -> bytes:
    """Encode a float wave ([T] or [T, channels]) as FLAC (16-bit PCM, clipped
    to [-1, 1]) or WAV (32-bit float, unclipped)."""
    kind = fmt.lower().lstrip(".")
    samples = np.asarray(wave, dtype=np.float32)
    if samples.ndim not in (1, 2):
        raise ValueError(f"wave must be [T] or [T, channels], got shape {samples.shape}")
    if not np.isfinite(samples).all():
        raise ValueError("wave contains NaN or infinite samples; refusing to encode it")
    buffer = io.BytesIO()
    if kind == "flac":
        soundfile.write(buffer, np.clip(samples, -1.0, 1.0), int(sample_rate), format="FLAC", subtype="PCM_16")
    elif kind == "wav":
        soundfile.write(buffer, samples, int(sample_rate), format="WAV", subtype="FLOAT")
    else:
        raise ValueError(f"unsupported audio format {fmt!r}; use 'flac' or 'wav'")
    return buffer.getvalue()


def decode_audio(data: bytes) -> tuple[np.ndarray, int]:
    """Decode audio bytes -> (float32 samples, sample_rate); samples are [T]
    for mono and [T, channels] otherwise."""
    if not data:
        raise ValueError("audio bytes are empty")
    try:
        samples, sample_rate = soundfile.read(io.BytesIO(bytes(data)), dtype="float32")
    except (soundfile.LibsndfileError, RuntimeError, TypeError) as exc:
        raise ValueError(f"cannot decode audio bytes as {SUPPORTED_CONTAINERS}: {exc}") from exc
    return samples, int(sample_rate)


def _resolve_reference_path(source: Union[str, os.PathLike], root) -> Path:
    raw = Path(os.fspath(source)).expanduser()
    if root is not None:
        base = Path(os.fspath(root)).expanduser().resolve()
        candidate = (raw if raw.is_absolute() else base / raw).resolve()
        if not candidate.is_relative_to(base):
            raise ReferenceAudioError(
                f"reference audio path {os.fspath(source)!r} resolves to {candidate}, outside the "
                f"allowed directory {base}; move the file under it or pass a path inside it"
            )
    else:
        candidate = raw.resolve()
    if not candidate.exists():
        raise ReferenceAudioError(
            f"reference audio file not found: {os.fspath(source)!r} (resolved to {candidate}); check the path"
        )
    if not candidate.is_file():
        raise ReferenceAudioError(f"reference audio path {candidate} is not a regular file")
    return candidate


def _read_limited(handle, label: str, max_seconds: float) -> tuple[np.ndarray, int]:
    """Read every channel as float32 [frames, channels], checking the length
    from the header first so an hour-long upload is refused before decoding."""
    try:
        with soundfile.SoundFile(handle) as reader:
            sample_rate = int(reader.samplerate)
            frames = reader.frames
            if sample_rate > 0 and frames > 0 and frames / sample_rate > max_seconds:
                raise ReferenceAudioError(
                    f"{label} is {frames / sample_rate:.1f} s long; the limit is "
                    f"{max_seconds:g} s. Trim it to a shorter clip"
                )
            wave = reader.read(dtype="float32", always_2d=True)
    except ReferenceAudioError:
        raise
    except (soundfile.LibsndfileError, RuntimeError, TypeError, ValueError) as exc:
        raise ReferenceAudioError(f"cannot decode {label}: {exc}. Provide {SUPPORTED_CONTAINERS} audio") from exc
    if sample_rate <= 0:
        raise ReferenceAudioError(f"{label} reports an invalid sample rate {sample_rate}")
    # Some containers do not store a frame count; check what was decoded.
    if wave.shape[0] / sample_rate > max_seconds and not math.isinf(max_seconds):
        raise ReferenceAudioError(
            f"{label} is {wave.shape[0] / sample_rate:.1f} s long; the limit is "
            f"{max_seconds:g} s. Trim it to a shorter clip"
        )
    return wave, sample_rate
