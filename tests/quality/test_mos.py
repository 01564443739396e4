"""DNSMOS plumbing on a tiny ONNX model built here with the published sig_bak_ovr.onnx's
signature (input `input_1` float32 [N, 144160], output `Identity:0` float32 [N, 3]). Its three
outputs reveal what it saw: 1 + 4 * (first sample, last sample, mean) of each window. Fed a
ramp whose sample n is n / 2**20, the first two give back exactly where a window starts and
ends in the clip, so the windowing, the doubling of short clips, batching and averaging are
checked against positions written out here. The real model's quality judgement is not in
question (its weights are not in the repository)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import soxr

from actors.errors import ConfigError
from actors.quality.mos import DNSMOS, EMILIA_MIN_OVRL, MOS_BACKENDS, MOSScore, calibrate, window_starts
from actors.quality.tiny import build_tiny_dnsmos
from tests.helpers import REPO

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

RATE = 16000
WIDTH = 144160  # int(9.01 s * 16 kHz), the published model's input width
RAMP_STEP = 2.0**-20  # exact in float32 for every sample index used here


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return build_tiny_dnsmos(tmp_path_factory.mktemp("dnsmos") / "sig_bak_ovr.onnx")


@pytest.fixture(scope="module")
def dnsmos(model_path):
    return DNSMOS(model_path, threads=1, batch_windows=4)


def ramp(samples: int) -> np.ndarray:
    return (np.arange(samples) * RAMP_STEP).astype(np.float32)


def seen_positions(raw: np.ndarray) -> list[tuple[int, int]]:
    """(first, last) clip sample index of each window, read back from the tiny model's outputs."""
    index = np.rint((raw[:, :2].astype(np.float64) - 1.0) / 4.0 / RAMP_STEP).astype(int)
    return [(int(a), int(b)) for a, b in index]


def hand_calibrated(sig, bak, ovr):
    # the non-personalized P.835 polynomials of DNS-Challenge DNSMOS/dnsmos_local.py, written out
    return (
        -0.08397278 * sig * sig + 1.22083953 * sig + 0.0052439,
        -0.13166888 * bak * bak + 1.60915514 * bak - 0.39604546,
        -0.06766283 * ovr * ovr + 1.11546468 * ovr + 0.04602535,
    )


def test_constants():
    assert MOS_BACKENDS == ("dnsmos",)
    assert EMILIA_MIN_OVRL == 3.0


def test_loads_the_model_with_threads(model_path):
    scorer = DNSMOS(model_path, threads=1)
    assert scorer.session.get_session_options().intra_op_num_threads == 1
    assert scorer.session.get_providers() == ["CPUExecutionProvider"]


def test_importing_the_module_does_not_import_onnxruntime():
    code = "import sys, actors.quality.mos; assert 'onnxruntime' not in sys.modules, 'imported'"
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True)


def test_missing_file_names_the_path_and_the_source(tmp_path):
    missing = tmp_path / "nowhere.onnx"
    with pytest.raises(ConfigError, match="quality.mos_model") as error:
        DNSMOS(str(missing))
    assert str(missing) in str(error.value)
    assert "DNSMOS/DNSMOS/sig_bak_ovr.onnx" in str(error.value)


def test_not_an_onnx_file_is_a_config_error(tmp_path):
    garbage = tmp_path / "sig_bak_ovr.onnx"
    garbage.write_bytes(b"this is not a protobuf" * 10)
    with pytest.raises(ConfigError, match="not a loadable ONNX model") as error:
        DNSMOS(str(garbage))
    assert "DNSMOS/DNSMOS/sig_bak_ovr.onnx" in str(error.value)


@pytest.mark.parametrize(
    "kwargs, problem",
    [({"input_name": "audio"}, "expected one named 'input_1'"), ({"width": 16000}, "expected tensor\\(float\\)")],
)
def test_another_onnx_model_is_a_config_error(tmp_path, kwargs, problem):
    path = build_tiny_dnsmos(tmp_path / "other.onnx", **kwargs)
    with pytest.raises(ConfigError, match=problem) as error:
        DNSMOS(path)
    assert path in str(error.value) and "not DNSMOS" in str(error.value)


def test_window_starts_follow_the_reference_float_arithmetic():
    # (idx + 9.01) * 16000 in float64 lands just under the integer for idx 7..23, so the
    # reference cuts a 144159-sample window there and skips it
    assert (7 + 9.01) * 16000 < 256160 and (6 + 9.01) * 16000 >= 240160
    assert window_starts(144160) == [0]
    assert window_starts(159999) == [0]  # floor(9.99 s) - 9.01 < 1: still one hop
    assert window_starts(160000) == [0]  # 10 s: int(0.99) + 1 = 1 hop
    assert window_starts(176000) == [0, 16000]  # 11 s: 2 hops
    assert window_starts(40 * RATE) == [s * RATE for s in [0, 1, 2, 3, 4, 5, 6, 24, 25, 26, 27, 28, 29, 30]]


@pytest.mark.parametrize(
    "seconds, expected",
    [
        # 3 s is doubled to 6 s, then 12 s: 3 windows, the last ones running into the copies
        (3.0, [(0, 144159 % 48000), (16000, 160159 % 48000), (32000, 176159 % 48000)]),
        (9.01, [(0, 144159)]),  # exactly one window
        # 20 s: int(20 - 9.01) + 1 = 11 hops, of which the reference keeps 0..6
        (20.0, [(s * RATE, s * RATE + 144159) for s in range(7)]),
    ],
)
def test_windows_the_model_sees(dnsmos, seconds, expected):
    (raw,) = dnsmos.raw_window_scores([ramp(int(round(seconds * RATE)))], RATE)
    assert raw.shape == (len(expected), 3)
    assert seen_positions(raw) == expected


def test_short_clip_is_doubled_not_cut_to_one_window(dnsmos):
    # 4.505 s doubles to exactly 9.01 s (one window); 4.5 s doubles to 18 s (9 hops, 7 kept)
    short, shorter = dnsmos.raw_window_scores([ramp(72080), ramp(72000)], RATE)
    assert seen_positions(short) == [(0, 72079)]
    assert [first for first, _ in seen_positions(shorter)] == [0, 16000, 32000, 48000, 64000, 8000, 24000]


def test_score_is_the_mean_of_calibrated_windows(dnsmos):
    clip = ramp(20 * RATE)
    (score,) = dnsmos.score([clip], RATE)
    starts = np.arange(7) * RATE  # the windows the reference keeps in 20 s
    sig_raw = 1 + 4 * starts * RAMP_STEP
    bak_raw = 1 + 4 * (starts + 144159) * RAMP_STEP
    ovr_raw = 1 + 4 * (starts + 144159 / 2) * RAMP_STEP  # mean of an arithmetic ramp
    sig, bak, ovrl = hand_calibrated(sig_raw, bak_raw, ovr_raw)
    assert isinstance(score, MOSScore)
    assert score.sig == pytest.approx(sig.mean(), abs=1e-9)
    assert score.bak == pytest.approx(bak.mean(), abs=1e-9)
    assert score.ovrl == pytest.approx(ovrl.mean(), abs=1e-4)
    # the mean is taken after the polynomial; before it would be off by far more than that
    assert abs(hand_calibrated(sig_raw.mean(), 1, 1)[0] - score.sig) > 1e-4
    assert abs(hand_calibrated(1, 1, ovr_raw.mean())[2] - score.ovrl) > 5e-4


def test_calibrate_against_hand_computed_values():
    # SIG(3)   = -0.08397278*9    + 1.22083953*3   + 0.0052439   = -0.75575502 + 3.66251859 + 0.0052439 = 2.91200747
    # BAK(4)   = -0.13166888*16   + 1.60915514*4   - 0.39604546  = -2.10670208 + 6.43662056 - 0.39604546 = 3.93387302
    # OVRL(2.5)= -0.06766283*6.25 + 1.11546468*2.5 + 0.04602535  = -0.4228926875 + 2.7886617 + 0.04602535 = 2.4117943625
    # SIG(1)   = -0.08397278 + 1.22083953 + 0.0052439 = 1.14211065; BAK(1) = 1.0814408; OVRL(1) = 1.0938272
    # SIG(4.5) = -1.700448795 + 5.493777885 + 0.0052439 = 3.79857299
    # BAK(2)   = -0.52667552 + 3.21831028 - 0.39604546 = 2.2955893
    # OVRL(5)  = -1.69157075 + 5.5773234 + 0.04602535 = 3.931778
    sig, bak, ovrl = calibrate(np.array([3.0, 1.0, 4.5]), np.array([4.0, 1.0, 2.0]), np.array([2.5, 1.0, 5.0]))
    np.testing.assert_allclose(sig, [2.91200747, 1.14211065, 3.79857299], rtol=0, atol=1e-12)
    np.testing.assert_allclose(bak, [3.93387302, 1.0814408, 2.2955893], rtol=0, atol=1e-12)
    np.testing.assert_allclose(ovrl, [2.4117943625, 1.0938272, 3.931778], rtol=0, atol=1e-12)
    assert float(calibrate(3.0, 4.0, 2.5)[2]) == pytest.approx(2.4117943625, abs=1e-12)


def test_a_clip_scores_the_same_alone_and_among_others(model_path):
    rng = np.random.default_rng(7)
    alone_clip = (0.1 * rng.standard_normal(5 * RATE)).astype(np.float32)
    others = [(0.3 * rng.standard_normal(n)).astype(np.float32) for n in (20 * RATE, 3 * RATE, 12 * RATE)]
    for batch_windows in (1, 3, 16):
        scorer = DNSMOS(model_path, batch_windows=batch_windows)
        (alone,) = scorer.score([alone_clip], RATE)
        among = scorer.score([others[0], alone_clip, others[1], others[2]], RATE)
        assert among[1] == alone
        assert among[0] != alone and among[2] != among[3]  # the others are really different clips
        (alone_raw,) = scorer.raw_window_scores([alone_clip], RATE)
        np.testing.assert_array_equal(scorer.raw_window_scores(others[:2] + [alone_clip], RATE)[2], alone_raw)


def test_fixed_batch_of_one_is_looped(tmp_path):
    scorer = DNSMOS(build_tiny_dnsmos(tmp_path / "batch1.onnx", batch=1), batch_windows=8)
    assert scorer.batch_windows == 1
    (raw,) = scorer.raw_window_scores([ramp(12 * RATE)], RATE)
    assert [first for first, _ in seen_positions(raw)] == [0, 16000, 32000]


def test_resamples_from_44k(dnsmos):
    t = np.arange(20 * 44100) / 44100
    clip = (0.5 * np.sin(2 * np.pi * 220 * t) * np.linspace(0, 1, t.size)).astype(np.float32)
    (raw,) = dnsmos.raw_window_scores([clip], 44100)
    # 20 s at 16 kHz: 7 windows; read as 16 kHz samples the clip would be 55 s and give 29
    assert raw.shape == (7, 3)
    at_16k = soxr.resample(clip, 44100, 16000, quality="HQ").astype(np.float32)
    np.testing.assert_allclose(raw, dnsmos.raw_window_scores([at_16k], RATE)[0], rtol=0, atol=1e-6)
    assert dnsmos.score([clip], 44100) == dnsmos.score([at_16k], RATE)


def test_rejects_empty_and_multichannel_clips(dnsmos):
    with pytest.raises(ValueError, match="empty"):
        dnsmos.score([np.zeros(0, np.float32)], RATE)
    with pytest.raises(ValueError, match="mono"):
        dnsmos.score([np.zeros((RATE, 2), np.float32)], RATE)
