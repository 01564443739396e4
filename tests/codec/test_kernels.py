"""The codec's C++ kernel (actors/codec/kernels.py, snake_conv.cpp) against torch's layers:
the same numbers within float rounding for every width, dilation and length it may see, each
row's numbers independent of its batch, values beyond its sine's range reduction handled, and
only float32 CPU layers narrow enough switched. The vectors and every other codec behaviour
run through it too: tests/codec/test_codec.py's codec fixture has a `kernels` variant."""

from __future__ import annotations

import logging

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
    # alpha x up to ~1e5, past the kernel's fast reduction (8192): those values take std::sin
    unit = _unit(4, 3, seed=7, alpha_range=(2000.0, 20000.0))
    x = torch.randn(2, 4, 700, generator=torch.Generator().manual_seed(1)) * 3
    with torch.inference_mode():
        assert_layer_close(unit.forward_native(x, None), unit(x))


def test_only_narrow_float32_cpu_layers_switch_and_the_decode_agrees():
    config = CodecConfig.tiny()
    plain, fast = random_codec(config, seed=3), random_codec(config, seed=3)
    units = [m for m in fast.modules() if isinstance(m, ResidualUnit)]
    widest = kernels.max_channels()
    narrow = [u for u in units if u.block[1].conv.in_channels <= widest]
    assert fast.use_native_layers() == len(narrow) + 1  # and the decoder's last conv
    assert all(u.native == (u in narrow) for u in units) and fast.decoder.native
    codes = torch.stack([torch.randint(0, size, (2, 23), generator=torch.Generator().manual_seed(i))
                         for i, size in enumerate(fast.codebook_sizes)], dim=1)  # fmt: skip
    audio, reference = fast.decode(codes), plain.decode(codes)
    torch.testing.assert_close(audio, reference, rtol=0, atol=1e-5)
    assert reference.abs().max() > 0.01  # audio, not silence
    wide = random_codec(config, seed=3, dtype=torch.float64)
    assert wide.use_native_layers() == 0 and not any(getattr(m, "native", False) for m in wide.modules())


def test_a_kernel_that_cannot_be_built_leaves_torchs_code_with_a_warning(tmp_path, caplog):
    broken = tmp_path / "broken.cpp"
    broken.write_text("this is not C++\n")
    with caplog.at_level(logging.WARNING, logger="actors.native"):
        assert native.build("chorus_test_broken", broken, tmp_path / "build") is False
    assert "chorus_test_broken could not be built" in caplog.text
    assert native.build("chorus_test_broken", broken, tmp_path / "build") is False  # decided once a process
