"""Integrated loudness of a mono clip, ITU-R BS.1770-4: K-weighting, mean square over 400 ms
blocks overlapping 75%, an absolute gate at -70 LUFS and a relative gate 10 LU below the
loudness of the blocks the absolute gate kept.

numpy only (no scipy in chorus's dependencies). The K-weighting filter is linear and
time-invariant, so its output is the input convolved with its impulse response; that response
decays geometrically (poles inside the unit circle), so it is computed once per sample rate up
to where it has fallen below 1e-13 of its peak and applied as one FFT convolution, which agrees
with a sample-by-sample IIR filter to ~1e-12 and costs a few ms for a 10 s clip.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Optional

import numpy as np

BLOCK_S = 0.4
OVERLAP = 0.75
ABSOLUTE_GATE_LUFS = -70.0
RELATIVE_GATE_LU = -10.0
# the -0.691 dB offset makes a 997 Hz sine read its mean-square level: the K filter's gain there
LOUDNESS_OFFSET = -0.691

# The standard gives the two K-weighting biquads' coefficients at 48 kHz only. The analogue
# parameters below (a high shelf near 1.68 kHz, +4 dB, and a 38 Hz high pass) put through the
# bilinear transform reproduce that table (tests/quality/test_quality_loudness.py checks it) and give
# the filter at any other rate.
_SHELF_HZ = 1681.974450955533
_SHELF_GAIN_DB = 3.999843853973347
_SHELF_Q = 0.7071752369554196
_SHELF_BAND_EXPONENT = 0.4996667741545416
_HIGHPASS_HZ = 38.13547087602444
_HIGHPASS_Q = 0.5003270373238773

_TAIL = 1e-13  # the impulse response is cut where it stays below this share of its peak
_MAX_RESPONSE_S = 2.0


def shelf_coefficients(sample_rate: int) -> tuple[np.ndarray, np.ndarray]:
    """Stage 1 (the head's acoustic effect, a high shelf): (b, a), a[0] = 1."""
    k = math.tan(math.pi * _SHELF_HZ / sample_rate)
    vh = 10.0 ** (_SHELF_GAIN_DB / 20.0)
    vb = vh**_SHELF_BAND_EXPONENT
    a0 = 1.0 + k / _SHELF_Q + k * k
    b = np.array([vh + vb * k / _SHELF_Q + k * k, 2.0 * (k * k - vh), vh - vb * k / _SHELF_Q + k * k]) / a0
    a = np.array([a0, 2.0 * (k * k - 1.0), 1.0 - k / _SHELF_Q + k * k]) / a0
    return b, a


def highpass_coefficients(sample_rate: int) -> tuple[np.ndarray, np.ndarray]:
    """Stage 2 (the RLB weighting, a high pass): (b, a), a[0] = 1."""
    k = math.tan(math.pi * _HIGHPASS_HZ / sample_rate)
    a0 = 1.0 + k / _HIGHPASS_Q + k * k
    a = np.array([1.0, 2.0 * (k * k - 1.0) / a0, (1.0 - k / _HIGHPASS_Q + k * k) / a0])
    return np.array([1.0, -2.0, 1.0]), a


def _biquad_impulse(b: np.ndarray, a: np.ndarray, x: np.ndarray) -> np.ndarray:
    """The biquad applied to a short signal, sample by sample (only for impulse responses)."""
    b0, b1, b2 = (float(v) for v in b)
    _, a1, a2 = (float(v) for v in a)
    y = np.empty(len(x))
    x1 = x2 = y1 = y2 = 0.0
    for n, xn in enumerate(x.tolist()):
        yn = b0 * xn + b1 * x1 + b2 * x2 - a1 * y1 - a2 * y2
        y[n] = yn
        x2, x1, y2, y1 = x1, xn, y1, yn
    return y


@lru_cache(maxsize=8)
def k_weighting_response(sample_rate: int) -> np.ndarray:
    """The K-weighting filter's impulse response (both stages), cut where it has decayed."""
    impulse = np.zeros(int(_MAX_RESPONSE_S * sample_rate))
    impulse[0] = 1.0
    response = _biquad_impulse(
        *highpass_coefficients(sample_rate), _biquad_impulse(*shelf_coefficients(sample_rate), impulse)
    )
    above = np.nonzero(np.abs(response) > _TAIL * np.abs(response).max())[0]
    response = response[: above[-1] + 1]
    response.flags.writeable = False
    return response


def k_weighted(audio: np.ndarray, sample_rate: int) -> np.ndarray:
    """The clip through the K-weighting filter (zero initial state), float64, same length."""
    x = np.asarray(audio, dtype=np.float64)
    h = k_weighting_response(sample_rate)
    size = len(x) + len(h) - 1
    n_fft = 1 << max(0, (size - 1).bit_length())
    return np.fft.irfft(np.fft.rfft(x, n_fft) * np.fft.rfft(h, n_fft), n_fft)[: len(x)]


def block_mean_squares(weighted: np.ndarray, sample_rate: int) -> np.ndarray:
    """Mean square of each full 400 ms block, blocks starting every 100 ms (§2.3 of the
    standard: a partial block at the end is not measured)."""
    block = int(round(BLOCK_S * sample_rate))
    hop = int(round(BLOCK_S * (1.0 - OVERLAP) * sample_rate))
    if len(weighted) < block:
        return np.zeros(0)
    starts = np.arange(0, len(weighted) - block + 1, hop)
    cumulative = np.concatenate([[0.0], np.cumsum(weighted * weighted)])
    return (cumulative[starts + block] - cumulative[starts]) / block


def _lufs(mean_square: float) -> float:
    return LOUDNESS_OFFSET + 10.0 * math.log10(mean_square) if mean_square > 0 else -math.inf


def integrated_loudness(audio: np.ndarray, sample_rate: int) -> Optional[float]:
    """Gated integrated loudness in LUFS of a mono clip (float samples, full scale 1.0).

    None when the clip is shorter than one 400 ms block (nothing to measure); -inf when every
    block is below the absolute gate (digital silence or near it)."""
    z = block_mean_squares(k_weighted(audio, sample_rate), sample_rate)
    if len(z) == 0:
        return None
    with np.errstate(divide="ignore"):
        block_lufs = LOUDNESS_OFFSET + 10.0 * np.log10(z)
    kept = z[block_lufs > ABSOLUTE_GATE_LUFS]
    if len(kept) == 0:
        return -math.inf
    relative_gate = _lufs(float(kept.mean())) + RELATIVE_GATE_LU
    kept = z[(block_lufs > ABSOLUTE_GATE_LUFS) & (block_lufs > relative_gate)]
    return _lufs(float(kept.mean()))
