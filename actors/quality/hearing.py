"""The work on a finished row's audio, done where the audio is: its codes decoded, the checks on
the decoded wave measured, the wave encoded as FLAC. On a CPU node that is the codec's child
process (actors/synth/codec_process.py), so none of it runs in the engine loop's process
(neither its CPU time nor its hold on the GIL); on a GPU the finisher decodes (`decoded`) and the
listen pool's processes `listen` (actors/synth/listen_pool.py); with engine.codec_process off and
no pool, the finisher thread does both. Either way the same functions make the same bytes.

What comes back per row is small (`Heard`: the FLAC bytes, the metrics, timings); the wave only
when the actor needs it for checks on models it holds (ASR, speaker, MOS). No torch here: the
decode is the caller's function (the codec's `decode_batch`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Optional, Union

import numpy as np

from actors.alone import each_alone
from actors.quality import checks
from actors.quality.settings import LOCAL_FLAGS, QualitySettings


@dataclass(frozen=True)
class HearTask:
    """One finished row to hear: its codes [C, frames], its words (for the speech rate), the
    frames of each of its segments (for a stretch's own checks), its turns as (voice, frames)
    in order (a dialogue row's turns are each measured alone too), the channels its file gets
    (more than one: each voice's turns on its own channel, silence elsewhere), and whether the
    wave itself must come back."""

    codes: np.ndarray
    text: Optional[str]
    segment_frames: tuple[int, ...]
    keep_wave: bool = False
    turns: tuple[tuple[int, int], ...] = ()
    channels: int = 1


@dataclass
class Heard:
    """What hearing one row made. `failure` (with `retryable`): why it has no audio; then the
    other fields are empty. `segment_metrics`: each segment's stretch measured alone, only when
    the row has several and its audio shows a local flag `quality.reject` lists (the gate then
    needs the first segment that shows it); `turn_metrics`: each turn's, for a row of several
    turns (a dialogue's turn is a unit of its own: a silent turn fails the row). Times in ms: the row's share of its decode call,
    the checks' CPU time, the FLAC encoding's."""

    samples: int = 0
    flac: Optional[bytes] = None
    metrics: Optional[checks.AudioMetrics] = None
    segment_metrics: Optional[list] = None
    turn_metrics: Optional[list] = None  # each turn's stretch measured alone (dialogue rows)
    wave: Optional[np.ndarray] = None
    failure: Optional[str] = None
    retryable: bool = False
    decode_ms: float = 0.0
    checks_ms: float = 0.0
    flac_ms: float = 0.0


def hear(
    decode_batch: Callable[..., list],
    tasks: Sequence[HearTask],
    quality: QualitySettings,
    sample_rate: int,
    frame_length: int,
    max_batch_rows: int,
    frame_bucket: int = 1,
) -> list[Heard]:
    """Decode `tasks`' codes (`decoded`) and listen to each decoded row, here."""
    out = []
    for task, (wave, decode_ms) in zip(tasks, decoded(decode_batch, tasks, frame_length, max_batch_rows, frame_bucket)):
        if isinstance(wave, Heard):  # its decode failed
            out.append(wave)
            continue
        heard = listen(task, wave, quality, sample_rate, frame_length)
        heard.decode_ms = decode_ms
        out.append(heard)
    return out


def hear_with(
    codec, tasks: Sequence[HearTask], quality: QualitySettings, *, max_batch_rows: int, frame_bucket: int = 1
):
    """`hear` over a codec's own decode, sample rate and frame length: what the codec's child
    process serves and what the finisher calls when the codec is in its own process."""
    sample_rate, frame_length = codec.sample_rate, codec.frame_length
    return hear(codec.decode_batch, tasks, quality, sample_rate, frame_length, max_batch_rows, frame_bucket)


def decoded(
    decode_batch: Callable[..., list],
    tasks: Sequence[HearTask],
    frame_length: int,
    max_batch_rows: int,
    frame_bucket: int = 1,
) -> list[tuple[Union[np.ndarray, Heard], float]]:
    """Each task's wave (or, where its decode failed, a Heard saying why) and its share of its
    decode call's milliseconds (by frames): `max_batch_rows` rows per decode call, each padded to
    a multiple of `frame_bucket` frames and cut back; a call that raises is run again a row at a
    time, so a row whose codes break it fails alone, retryable. Where the rows are listened to is
    the caller's choice (`hear`: here; the finisher: on its listen pool)."""
    out: list[tuple[Union[np.ndarray, Heard], float]] = []
    step = max(1, max_batch_rows)

    def decode(codes: list) -> list:
        waves = decode_batch([padded(c, frame_bucket) for c in codes], max_batch_rows=len(codes))
        return [wave[: c.shape[-1] * frame_length] for c, wave in zip(codes, waves)]

    for start in range(0, len(tasks), step):
        group = list(tasks[start : start + step])
        began = time.perf_counter()
        waves = each_alone(
            group,
            lambda batch: decode([t.codes for t in batch]),
            lambda task, e: Heard(failure=f"codec decode: {e!r}", retryable=True),
        )
        elapsed_ms = (time.perf_counter() - began) * 1000.0
        frames = sum(t.codes.shape[-1] for t in group) or 1
        out.extend(
            (wave, 0.0 if isinstance(wave, Heard) else elapsed_ms * t.codes.shape[-1] / frames)
            for t, wave in zip(group, waves)
        )
    return out


def padded(codes: np.ndarray, bucket: int) -> np.ndarray:
    """`codes` [C, frames] with code-0 frames appended up to a multiple of `bucket` frames."""
    frames = codes.shape[-1]
    extra = -frames % max(1, bucket)
    if extra == 0:
        return codes
    return np.concatenate([codes, np.zeros((codes.shape[0], extra), dtype=codes.dtype)], axis=1)


def listen(task: HearTask, wave: np.ndarray, quality: QualitySettings, sample_rate: int, frame_length: int) -> Heard:
    """One decoded row: its checks measured and its FLAC made."""
    if not np.all(np.isfinite(wave)):
        return Heard(failure="codec decode produced non-finite samples")
    began = time.thread_time()
    metrics = checks.audio_metrics(wave, sample_rate, task.text, quality)
    segment_metrics = _segment_metrics(task, wave, metrics, quality, sample_rate, frame_length)
    turn_metrics = None
    if len(task.turns) > 1:
        spans = stretches([frames for _, frames in task.turns], frame_length)
        turn_metrics = [checks.audio_metrics(wave[a:b], sample_rate, None, quality) for a, b in spans]
    checks_ms = (time.thread_time() - began) * 1000.0
    began = time.perf_counter()
    from actors import audio

    try:
        placed = per_voice_channels(wave, task.turns, task.channels, frame_length) if task.channels > 1 else wave
        flac = audio.encode_audio(placed, sample_rate, "flac")
    except Exception as e:
        return Heard(failure=f"FLAC encoding: {e!r}")
    return Heard(
        samples=len(wave),
        flac=flac,
        metrics=metrics,
        segment_metrics=segment_metrics,
        turn_metrics=turn_metrics,
        wave=wave if task.keep_wave else None,
        checks_ms=checks_ms,
        flac_ms=(time.perf_counter() - began) * 1000.0,
    )


def _segment_metrics(
    task: HearTask,
    wave: np.ndarray,
    metrics: checks.AudioMetrics,
    quality: QualitySettings,
    sample_rate: int,
    frame_length: int,
) -> Optional[list]:
    """Each segment's stretch measured alone, when the row has several and shows a local flag
    that rejects it; else None (most rows: nothing more is measured)."""
    shown = checks.audio_flags(metrics, quality)
    if len(task.segment_frames) < 2 or not any(f in quality.reject for f in shown if f in LOCAL_FLAGS):
        return None
    spans = stretches(task.segment_frames, frame_length)
    return [checks.audio_metrics(wave[a:b], sample_rate, None, quality) for a, b in spans]


def stretches(frames: Sequence[int], frame_length: int) -> list[tuple[int, int]]:
    """The sample span [start, end) of each of consecutive stretches of `frames` frames."""
    spans, start = [], 0
    for n in frames:
        spans.append((start * frame_length, (start + n) * frame_length))
        start += n
    return spans


def per_voice_channels(
    wave: np.ndarray, turns: Sequence[tuple[int, int]], channels: int, frame_length: int
) -> np.ndarray:
    """The row's one decoded wave placed on `channels` channels, [samples, channels]: each turn's
    samples on its voice's channel, exact zeros everywhere else, so the channels sum to the wave
    (the decode ran once over the whole row: no seam of its own at a turn's edge)."""
    placed = np.zeros((len(wave), channels), dtype=wave.dtype)
    for (voice, _), (start, end) in zip(turns, stretches([frames for _, frames in turns], frame_length)):
        placed[start:end, voice] = wave[start:end]
    return placed
