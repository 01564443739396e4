"""Integrated loudness (ITU-R BS.1770-4) against the standard's own numbers -- its 48 kHz
filter table, the 997 Hz calibration, the gates -- and against pyloudnorm where it is
installed (tests only: chorus does not depend on it)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from actors.quality.loudness import highpass_coefficients, integrated_loudness, k_weighted, shelf_coefficients

SR = 44100


def sine(freq: float, amplitude: float, seconds: float, sr: int = SR) -> np.ndarray:
    return amplitude * np.sin(2 * np.pi * freq * np.arange(int(seconds * sr)) / sr)


def test_the_filter_is_the_standards_table_at_48k():
    # BS.1770-4 Tables 1 and 2
    b, a = shelf_coefficients(48000)
    np.testing.assert_allclose(b, [1.53512485958697, -2.69169618940638, 1.19839281085285], atol=1e-9)
    np.testing.assert_allclose(a, [1.0, -1.69065929318241, 0.73248077421585], atol=1e-9)
    b, a = highpass_coefficients(48000)
    np.testing.assert_allclose(b, [1.0, -2.0, 1.0])
    np.testing.assert_allclose(a, [1.0, -1.99004745483398, 0.99007225036621], atol=1e-9)


def test_the_fft_filter_is_the_recursive_filter():
    x = np.random.default_rng(1).standard_normal(3000)
    y = np.zeros_like(x)
    stages = [shelf_coefficients(SR), highpass_coefficients(SR)]
    signal = x
    for b, a in stages:
        y = np.zeros_like(signal)
        for n in range(len(signal)):
            y[n] = sum(b[k] * signal[n - k] for k in range(3) if n >= k) - sum(
                a[k] * y[n - k] for k in (1, 2) if n >= k
            )
        signal = y
    np.testing.assert_allclose(k_weighted(x, SR), signal, atol=1e-10)


@pytest.mark.parametrize("sr", [44100, 48000])
def test_a_997_hz_sine_reads_its_mean_square_level(sr):
    # the -0.691 offset is the K filter's gain at 997 Hz: a sine of peak A reads 20 log10(A) - 3.01
    assert integrated_loudness(sine(997, 0.1, 5, sr), sr) == pytest.approx(-20 - 10 * math.log10(2), abs=0.02)
    assert integrated_loudness(sine(1000, 1.0, 5, sr), sr) == pytest.approx(-3.01, abs=0.02)


def test_the_absolute_gate_ignores_silence():
    tone = sine(997, 0.1, 4)
    with_silence = np.concatenate([tone, np.zeros(6 * SR)])
    # the 37 blocks inside the tone, and the 3 that straddle its end with 3/4, 1/2, 1/4 of it
    # (all above -70 LUFS); the 57 silent ones are gated out
    straddling = 10 * math.log10((37 + 0.75 + 0.5 + 0.25) / 40)
    assert integrated_loudness(with_silence, SR) == pytest.approx(integrated_loudness(tone, SR) + straddling, abs=0.01)
    assert integrated_loudness(np.zeros(2 * SR), SR) == -math.inf
    assert integrated_loudness(tone[: int(0.3 * SR)], SR) is None  # shorter than one block


def test_the_relative_gate_drops_what_is_20_lu_quieter_but_not_5_lu():
    loud = sine(997, 0.1, 4)  # -23 LUFS
    quiet = sine(997, 0.001, 4)  # -63 LUFS: above the absolute gate, below the relative one
    assert integrated_loudness(quiet, SR) == pytest.approx(-63.01, abs=0.02)
    straddling = 10 * math.log10((37 + 0.75 + 0.5 + 0.25) / 40)  # as above; quiet's share is 1e-4
    assert integrated_loudness(np.concatenate([loud, quiet]), SR) == pytest.approx(-23.01 + straddling, abs=0.01)
    # -28 LUFS: every block kept; the straddling blocks split evenly, so the mean energy of both
    softer = sine(997, 0.1 / 10 ** (5 / 20), 4)
    expected = 10 * math.log10((0.1**2 / 2 + (0.1 / 10 ** (5 / 20)) ** 2 / 2) / 2)
    assert integrated_loudness(np.concatenate([loud, softer]), SR) == pytest.approx(expected, abs=0.02)


def test_it_matches_pyloudnorm():
    pyln = pytest.importorskip("pyloudnorm")
    rng = np.random.default_rng(0)
    clips = [sine(440, 0.3, 3.0), rng.standard_normal(5 * SR) * 0.05, sine(60, 0.5, 2.0) + sine(8000, 0.2, 2.0)]
    clips.append(np.concatenate([clips[1][: 2 * SR] * 0.001, clips[1]]))  # gated blocks
    for clip in clips:
        ours = integrated_loudness(clip, SR)
        # pyloudnorm's "DeMan" filter is the standard's; its default "K-weighting" is an
        # approximation reading ~0.04 LU lower (its high pass has a 0.995 gain)
        assert ours == pytest.approx(pyln.Meter(SR, filter_class="DeMan").integrated_loudness(clip), abs=1e-6)
        assert ours == pytest.approx(pyln.Meter(SR).integrated_loudness(clip), abs=0.1)
