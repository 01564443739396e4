"""Predicted MOS for the quality gate: DNSMOS P.835 (Microsoft's non-intrusive speech quality
predictor) run through onnxruntime on CPU from its published ONNX file, a local path
(`quality.mos_model`; nothing is downloaded). Each clip gets OVRL, SIG and BAK on the 1..5 scale.

Imported only when `quality.mos` is set; onnxruntime itself is imported when a model is loaded
(an optional dependency: `pip install "chorus-tts[mos]"`).

The algorithm follows the reference scorer, microsoft/DNS-Challenge DNSMOS/dnsmos_local.py
(`ComputeScore.__call__`; the same code is in the PyPI package speechmos 0.0.1.1,
speechmos/dnsmos.py, and in Emilia-Pipe, open-mmlab/Amphion preprocessors/Emilia/models/dnsmos.py):

- 16 kHz input (SAMPLING_RATE = 16000); other rates are resampled first (the reference uses
  librosa.resample, whose default since librosa 0.10 is soxr HQ, as `actors.audio.resample` is).
- Window: INPUT_LENGTH = 9.01 s, int(9.01 * 16000) = 144160 samples, the model's fixed input width.
- A clip shorter than a window is DOUBLED (`while len(audio) < len_samples: audio =
  np.append(audio, audio)`) until it is at least one window long, not tiled to exactly 9.01 s:
  a 3 s clip becomes 12 s and gives 3 windows, a 4.5 s clip becomes 18 s.
- Hop 1 s: num_hops = int(floor(len / 16000) - 9.01) + 1, window idx spans
  [int(idx * 16000), int((idx + 9.01) * 16000)), and a window shorter than 144160 samples is
  skipped. In float64, (idx + 9.01) * 16000 falls just below the integer for idx 7..23, 119..122
  (and more later), so those windows are 144159 samples long and the reference silently drops
  them: a 20 s clip is scored on windows 0..6 only (the first 16.01 s). This module computes the
  windows with the same float expressions, so it scores exactly the windows the reference scores
  and a threshold taken from DNSMOS-filtered corpora means the same thing here.
- Per window the model gives raw [SIG, BAK, OVRL] (output column order, as unpacked by the
  reference: `mos_sig_raw, mos_bak_raw, mos_ovr_raw = ...[0][0]`).
- Calibration: the non-personalized P.835 polynomials of `get_polyfit_val` (below). The
  personalized set belongs to the other model file, pDNSMOS/sig_bak_ovr.onnx, trained to
  penalize interfering talkers for the personalized noise-suppression track; it has the same
  I/O signature, so only the path tells them apart. We load DNSMOS/DNSMOS/sig_bak_ovr.onnx, the
  model Emilia-Pipe runs (`dnsmos_compute_score(segment, 16000, False)`), so its coefficients.
- The clip's score is the mean over its windows of the CALIBRATED window scores (the polynomial
  is applied per window, then `np.mean(predicted_mos_ovr_seg)`); the polynomial is not linear,
  so this differs from calibrating the mean raw score.

The published sig_bak_ovr.onnx (keras2onnx 1.8.1, opset 12): input `input_1` float32
[N, 144160], output `Identity:0` float32 [N, 3], batch dimension N dynamic. No operator mixes
rows of a batch (its one reduction, a global max pool, is over axes 1 and 2), so windows of
different clips are batched together: on that file a window's raw scores came out bit-identical
for batch sizes 1..16, any position and any batch-mates (onnxruntime 1.32, 1 and 2 threads), so
a clip's score does not depend on the other clips in the call.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np

from actors.audio import resample
from actors.errors import ConfigError
from actors.quality.settings import EMILIA_MIN_OVRL, MOS_BACKENDS  # noqa: F401 (named here too)

DNSMOS_RATE = 16000
WINDOW_S = 9.01
WINDOW_SAMPLES = int(WINDOW_S * DNSMOS_RATE)  # 144160, the model's input width
HOP_SAMPLES = DNSMOS_RATE  # 1 s
INPUT_NAME = "input_1"


# P.835 calibration of the raw outputs, highest power first (np.poly1d order): the
# non-personalized set of get_polyfit_val in microsoft/DNS-Challenge DNSMOS/dnsmos_local.py
SIG_POLY = (-0.08397278, 1.22083953, 0.0052439)
BAK_POLY = (-0.13166888, 1.60915514, -0.39604546)
OVRL_POLY = (-0.06766283, 1.11546468, 0.04602535)

MODEL_SOURCE = "https://github.com/microsoft/DNS-Challenge, file DNSMOS/DNSMOS/sig_bak_ovr.onnx"


@dataclass(frozen=True)
class MOSScore:
    ovrl: float
    sig: float
    bak: float


def calibrate(sig_raw, bak_raw, ovr_raw) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Raw model outputs (scalars or arrays) -> calibrated (sig, bak, ovrl) on the MOS scale."""
    return (
        np.polyval(SIG_POLY, np.asarray(sig_raw, dtype=np.float64)),
        np.polyval(BAK_POLY, np.asarray(bak_raw, dtype=np.float64)),
        np.polyval(OVRL_POLY, np.asarray(ovr_raw, dtype=np.float64)),
    )


def extend_short(wave: np.ndarray) -> np.ndarray:
    """The reference's padding of a clip shorter than a window: doubled until it is long enough."""
    if len(wave) == 0:
        raise ValueError("DNSMOS cannot score an empty clip")
    while len(wave) < WINDOW_SAMPLES:
        wave = np.concatenate([wave, wave])
    return wave


def window_starts(num_samples: int) -> list[int]:
    """Start offsets of the windows the reference scores in an (already extended) 16 kHz clip.
    The float expressions are the reference's own, kept so the same windows are dropped."""
    num_hops = int(np.floor(num_samples / DNSMOS_RATE) - WINDOW_S) + 1
    starts = []
    for idx in range(num_hops):
        start, end = int(idx * HOP_SAMPLES), int((idx + WINDOW_S) * HOP_SAMPLES)
        if end - start >= WINDOW_SAMPLES:
            starts.append(start)
    return starts


class DNSMOS:
    """DNSMOS P.835 from a local sig_bak_ovr.onnx, on the CPU (or on a CUDA `device` where
    onnxruntime has CUDA); windows of all clips in one call go through the session
    batch_windows at a time."""

    def __init__(self, model_path: str, threads: Optional[int] = None, batch_windows: int = 16, device: str = "cpu"):
        if batch_windows < 1:
            raise ValueError(f"batch_windows must be >= 1, got {batch_windows}")
        self.model_path, self.batch_windows = str(model_path), batch_windows
        self.session = _open_session(self.model_path, threads, device)
        self.output_name = self.session.get_outputs()[0].name
        if self.session.get_inputs()[0].shape[0] == 1:
            # an export with the batch fixed at 1 (the published file's is dynamic, N)
            self.batch_windows = 1

    def raw_window_scores(self, clips: Sequence[np.ndarray], sample_rate: int) -> list[np.ndarray]:
        """Per clip, the model's raw [SIG, BAK, OVRL] for each window it scores: [windows, 3]."""
        waves = [extend_short(_mono_16k(clip, sample_rate)) for clip in clips]
        owners = [(index, start) for index, wave in enumerate(waves) for start in window_starts(len(wave))]
        rows: list[list[np.ndarray]] = [[] for _ in waves]
        for batch in _chunks(owners, self.batch_windows):
            stacked = np.stack([waves[index][start : start + WINDOW_SAMPLES] for index, start in batch])
            outputs = self.session.run([self.output_name], {INPUT_NAME: stacked})[0]
            for (index, _), output in zip(batch, outputs):
                rows[index].append(output)
        return [np.asarray(clip_rows, dtype=np.float32).reshape(-1, 3) for clip_rows in rows]

    def score(self, clips: Sequence[np.ndarray], sample_rate: int) -> list[MOSScore]:
        """One score per clip (float32 mono at sample_rate), in order: the mean of its windows'
        calibrated scores, as the reference averages them."""
        scores = []
        for raw in self.raw_window_scores(clips, sample_rate):
            sig, bak, ovrl = calibrate(raw[:, 0], raw[:, 1], raw[:, 2])
            scores.append(MOSScore(ovrl=float(ovrl.mean()), sig=float(sig.mean()), bak=float(bak.mean())))
        return scores


def _mono_16k(clip: np.ndarray, sample_rate: int) -> np.ndarray:
    wave = np.asarray(clip, dtype=np.float32)
    if wave.ndim != 1:
        raise ValueError(f"DNSMOS scores mono clips ([samples]), got shape {wave.shape}")
    return resample(wave, sample_rate, DNSMOS_RATE)


def _chunks(items: list, size: int) -> Iterator[list]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def session_providers(device: str, available: Sequence[str]) -> list[str]:
    """onnxruntime's providers for a model on `device`: CUDA's first on a CUDA device where
    onnxruntime has it (onnxruntime-gpu), the CPU's always."""
    cuda = str(device).startswith("cuda") and "CUDAExecutionProvider" in available
    return ["CUDAExecutionProvider", "CPUExecutionProvider"] if cuda else ["CPUExecutionProvider"]


def _open_session(model_path: str, threads: Optional[int], device: str = "cpu"):
    """An onnxruntime session on the file (session_providers), checked to have DNSMOS's input
    and output."""
    where = f"get sig_bak_ovr.onnx beforehand from {MODEL_SOURCE}"
    if not Path(model_path).is_file():
        raise ConfigError(f"quality.mos_model: {model_path} is not a file; {where}")
    import onnxruntime

    options = onnxruntime.SessionOptions()
    if threads is not None:
        options.intra_op_num_threads = int(threads)
    try:
        providers = session_providers(device, onnxruntime.get_available_providers())
        session = onnxruntime.InferenceSession(model_path, options, providers=providers)
    except Exception as error:  # onnxruntime raises its own pybind classes for unreadable models
        raise ConfigError(f"quality.mos_model: {model_path} is not a loadable ONNX model ({error}); {where}") from error
    problem = _signature_problem(session)
    if problem is not None:
        raise ConfigError(f"quality.mos_model: {model_path} is not DNSMOS sig_bak_ovr.onnx ({problem}); {where}")
    return session


def _signature_problem(session) -> Optional[str]:
    inputs, outputs = session.get_inputs(), session.get_outputs()
    if len(inputs) != 1 or inputs[0].name != INPUT_NAME:
        return f"inputs {[i.name for i in inputs]}, expected one named {INPUT_NAME!r}"
    shape = inputs[0].shape
    if inputs[0].type != "tensor(float)" or len(shape) != 2 or shape[1] != WINDOW_SAMPLES:
        return f"input {inputs[0].type} {shape}, expected tensor(float) [N, {WINDOW_SAMPLES}]"
    if isinstance(shape[0], int) and shape[0] != 1:
        return f"input batch fixed at {shape[0]}; only a dynamic batch or 1 fits clips of any length"
    if len(outputs) != 1 or len(outputs[0].shape) != 2 or outputs[0].shape[1] != 3:
        return f"outputs {[(o.name, o.shape) for o in outputs]}, expected one [N, 3] (SIG, BAK, OVRL)"
    return None
