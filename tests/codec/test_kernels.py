"""The codec's C++ kernel (actors/codec/kernels.py, snake_conv.cpp) against torch's layers:
the same numbers within float rounding for every width, dilation and length it may see, each
row's numbers independent of its batch, values beyond its sine's range reduction handled, and
only float32 CPU layers narrow enough switched. The vectors and every other codec behaviour
run through it too: tests/codec/test_codec.py's codec fixture has a `kernels` variant."""

from __future__ import annotations

import logging
import platform

import pytest
import torch

from actors import native
from actors.codec import kernels
from actors.codec.config import CodecConfig
from actors.codec.layers import ResidualUnit
from actors.codec.tiny import random_codec

# the kernel sums in another order than oneDNN, and its sine is its own (within ~2 ulp of
# numpy's): a few float32 steps of the layer's largest value
LAYER_RTOL = 2e-6


def assert_layer_close(got: torch.Tensor, expected: torch.Tensor) -> None:
    scale = float(expected.abs().max())
    assert scale > 0.1
    torch.testing.assert_close(got, expected, rtol=0, atol=LAYER_RTOL * scale)


@pytest.fixture(scope="module", autouse=True)
def built():
    if not kernels.load():
        pytest.fail("the codec's C++ kernel did not build (a C++ compiler is part of the test machine)")


def _unit(channels: int, dilation: int, seed: int, alpha_range=(0.5, 3.0)) -> ResidualUnit:
    generator = torch.Generator().manual_seed(seed)
    unit = ResidualUnit(channels, dilation).eval()
    with torch.no_grad():
        for parameter in unit.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator) / parameter.shape[-1] ** 0.5)
        for snake in (unit.block[0], unit.block[2]):
            snake.alpha.uniform_(*alpha_range, generator=generator)
    return unit


@pytest.mark.parametrize("channels", [4, 16, 64])
@pytest.mark.parametrize("dilation", [1, 9])
def test_a_residual_unit_through_the_kernel_equals_torchs_layers(channels, dilation):
    unit = _unit(channels, dilation, seed=channels + dilation)
    # lengths around the kernel's 512-sample tiles and its vector widths, and shorter than
    # the 7-tap conv's reach (54 samples at dilation 9)
    for length in (1, 37, 512, 1029):
        x = torch.randn(3, channels, length, generator=torch.Generator().manual_seed(length))
        with torch.inference_mode():
            expected = unit(x)
            got = unit.forward_native(x, None)
            in_place = x.clone()
            unit.forward_native(in_place, in_place)
            alone = [unit.forward_native(x[row : row + 1].clone(), None) for row in range(3)]
        assert_layer_close(got, expected)
        assert torch.equal(in_place, got), "written over its input, the unit gives the same numbers"
        for row in range(3):
            assert torch.equal(alone[row][0], got[row]), f"row {row} alone differs from the batch at {length}"


def test_arguments_beyond_the_range_reduction_take_the_exact_sine():
    """alpha x from 1e3 to 1e9, across the fast range reduction's limit (8192); past ~2e7 the
    reduction alone would give values of sin^2 up to ~1e27. A Snake alone: a 1-tap identity
    conv, no bias; against float64's sine."""
    generator = torch.Generator().manual_seed(1)
    channels, length = 4, 4000
    alpha = torch.tensor([10.0, 1e3, 1e4, 1e5])
    x = torch.empty(1, channels, length).uniform_(1e2, 1e4, generator=generator)
    x *= torch.where(torch.rand(x.shape, generator=generator) < 0.5, -1.0, 1.0)
    conv = torch.nn.Conv1d(channels, channels, 1)
    with torch.no_grad():
        conv.weight.copy_(torch.eye(channels)[:, :, None])
        conv.bias.zero_()
    with torch.inference_mode():
        got = kernels.snake_conv(x, alpha, conv, 1).double()
    a, wide = alpha.double().view(1, -1, 1), x.double()
    expected = wide + torch.sin(a * wide) ** 2 / (a + 1e-9)
    assert float((a * wide).abs().max()) > 1e8
    # float32's step at x (up to 1e4: ~1e-3) bounds what the output can hold
    torch.testing.assert_close(got, expected, rtol=2e-7, atol=1e-6)


def test_only_narrow_float32_cpu_layers_switch_and_the_decode_agrees(monkeypatch):
    # 8 channels at most (AVX2's limit) leaves wider units of the tiny codec (up to 32) on torch
    monkeypatch.setattr(kernels, "max_channels", lambda: 8)
    config = CodecConfig.tiny()
    plain, fast = random_codec(config, seed=3), random_codec(config, seed=3)
    units = [m for m in fast.modules() if isinstance(m, ResidualUnit)]
    narrow = [u for u in units if u.block[1].conv.in_channels <= 8]
    assert 0 < len(narrow) < len(units)
    assert fast.use_native_layers() == len(narrow) + 1  # and the decoder's last conv (4 channels)
    assert all(u.native == (u in narrow) for u in units) and fast.decoder.native
    codes = torch.stack([torch.randint(0, size, (2, 23), generator=torch.Generator().manual_seed(i))
                         for i, size in enumerate(fast.codebook_sizes)], dim=1)  # fmt: skip
    audio, reference = fast.decode(codes), plain.decode(codes)
    torch.testing.assert_close(audio, reference, rtol=0, atol=1e-5)
    assert reference.abs().max() > 0.01  # audio, not silence
    wide = random_codec(config, seed=3, dtype=torch.float64)
    assert wide.use_native_layers() == 0 and not any(getattr(m, "native", False) for m in wide.modules())


def test_a_kernel_that_cannot_be_built_leaves_torchs_code_with_a_warning(tmp_path, caplog, monkeypatch):
    broken = tmp_path / "broken.cpp"
    broken.write_text("this is not C++\n")
    from torch.utils import cpp_extension

    builds = []
    real_load = cpp_extension.load
    monkeypatch.setattr(cpp_extension, "load", lambda *a, **k: builds.append(a) or real_load(*a, **k))
    with caplog.at_level(logging.WARNING, logger="chorus.actors.native"):
        assert native.build("chorus_test_broken", broken, tmp_path / "build") is False
        assert native.build("chorus_test_broken", broken, tmp_path / "build") is False
    assert "chorus_test_broken could not be built" in caplog.text
    assert len(builds) == 1, "a process tries a build once"


def test_a_build_killed_midway_does_not_block_the_next(tmp_path, monkeypatch):
    """torch's builder marks a build in progress with a `lock` file and waits on it forever; a
    process killed mid-build leaves it. The next build clears it (it holds chorus's OS lock)."""
    from torch.utils import cpp_extension

    name = "chorus_test_stale"
    folder = tmp_path / f"{name}-{torch.__version__}-{platform.machine()}-{native.cpu_capability()}"
    folder.mkdir(parents=True)
    (folder / "lock").write_text("")  # what a killed build leaves
    seen = []
    monkeypatch.setattr(cpp_extension, "load", lambda *a, **k: seen.append((folder / "lock").exists()))
    assert native.build(name, kernels.SOURCE, tmp_path) is True
    assert seen == [False]
