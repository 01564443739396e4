"""The decoder through triton_conv.py's fused kernel, and what a decode holds in memory.

`FusedDecoder` packs the decoder's weights once (in the decode dtype, transposed convs as
2-tap causal convs) and runs its 30 convolutions as 30 launches: every Snake, causal padding,
bias, residual add and the final tanh happen inside them. Its outputs follow the eager
decoder's (layers.py) within the dtype's rounding: float32 to float rounding of the sums'
order, bfloat16 within the bounds tests/codec/test_fused.py states.

`decode_values_per_sample` is the arithmetic the GPU batch cap rests on (device.py): how many
activation values are alive at once, per output sample, at the widest point of a decode, for
each path. Per output sample a stage of C channels at 1/r of the audio rate holds C / r values;
the real codec's last two stages both hold 96 (96 channels at the audio rate, 192 at half), its
first two 48 and 24.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from .config import CodecConfig
from .layers import Decoder
from .triton_conv import SNAKE_PLACEMENTS, PackedConv, SnakeParams, causal_conv, pack_conv, pack_transposed

# Tensors alive at a stage's widest step, in units of (input values, output values) per sample:
#   epilogue: upsample reads its input, writes h and Snake(h) (in + 2 out); a residual unit
#             holds h, Snake(h) and the wide conv's Snake'd output (3 out)
#   prologue: upsample in + h; a unit holds h and the wide conv's output (2 out); its 1-tap
#             conv writes over h
#   eager:    Snake1d's copy beside its input, the conv's output (in + in + out for the
#             upsample); a unit holds x, Snake(x), the padded/sliced conv output, its Snake,
#             the 1-tap conv's output (5 out)
LIVE_TENSORS = {"epilogue": ((1, 2), (0, 3)), "prologue": ((1, 1), (0, 2)), "eager": ((2, 1), (0, 5))}


@dataclass(frozen=True)
class FusedUnit:
    """A ResidualUnit: Snake, 7-tap conv, Snake, 1-tap conv, plus its input."""

    first_snake: SnakeParams
    wide: PackedConv
    second_snake: SnakeParams
    point: PackedConv


@dataclass(frozen=True)
class FusedStage:
    """A DecoderBlock: Snake, transposed conv, residual units."""

    snake: SnakeParams
    upsample: PackedConv
    units: tuple[FusedUnit, ...]


class FusedDecoder:
    """Decoder.forward through the fused kernel (weights packed in `dtype` at construction)."""

    def __init__(self, decoder: Decoder, dtype: torch.dtype, snake: str = "epilogue"):
        if snake not in SNAKE_PLACEMENTS:
            raise ValueError(f"snake must be one of {SNAKE_PLACEMENTS}, got {snake!r}")
        first_conv, *blocks, last_snake, last_conv, _ = decoder.model
        self.dtype, self.snake = dtype, snake
        self.first = pack_conv(first_conv.conv, dtype)
        self.stages = tuple(_stage(block, dtype) for block in blocks)
        if any(not stage.units for stage in self.stages):
            raise ValueError("every decoder block needs a residual unit (the real codec has three)")
        self.last_snake = SnakeParams.of(last_snake.alpha)
        self.last = pack_conv(last_conv.conv, dtype)

    def __call__(self, latent: Tensor) -> Tensor:
        """latent [B, C, F] -> audio [B, 1, F * hop] in the decode dtype."""
        x = latent.to(self.dtype).contiguous()
        return self._epilogue(x) if self.snake == "epilogue" else self._prologue(x)

    def _epilogue(self, x: Tensor) -> Tensor:
        """Each layer writes the Snake its consumer wants, so each Snake runs once per value."""
        _, s = causal_conv(x, self.first, out_snake=self.stages[0].snake, write_plain=False)
        for index, stage in enumerate(self.stages):
            following = self.stages[index + 1].snake if index + 1 < len(self.stages) else self.last_snake
            h, s = causal_conv(s, stage.upsample, out_snake=stage.units[0].first_snake)
            for number, unit in enumerate(stage.units):
                _, inner = causal_conv(s, unit.wide, out_snake=unit.second_snake, write_plain=False)
                del s  # its memory serves the next Snake
                if number + 1 < len(stage.units):
                    # h + conv(inner) over h itself: a tile reads only the residual values it writes
                    h, s = causal_conv(
                        inner, unit.point, residual=h, out=h, out_snake=stage.units[number + 1].first_snake
                    )
                else:  # the block's output is only ever read through the next Snake: write that alone
                    _, s = causal_conv(
                        inner, unit.point, residual=h, out_snake=following, write_plain=False, snake_out=h
                    )
                del inner
        audio, _ = causal_conv(s, self.last, tanh=True)
        return audio

    def _prologue(self, x: Tensor) -> Tensor:
        """Each layer computes the Snake of what it loads (again for every tap and channel block)."""
        h, _ = causal_conv(x, self.first)
        for stage in self.stages:
            h, _ = causal_conv(h, stage.upsample, in_snake=stage.snake)
            for unit in stage.units:
                inner, _ = causal_conv(h, unit.wide, in_snake=unit.first_snake)
                causal_conv(inner, unit.point, in_snake=unit.second_snake, residual=h, out=h)
                del inner
        audio, _ = causal_conv(h, self.last, in_snake=self.last_snake, tanh=True)
        return audio


def _stage(block, dtype: torch.dtype) -> FusedStage:
    snake, upsample, *units = block.block
    return FusedStage(
        SnakeParams.of(snake.alpha),
        pack_transposed(upsample.conv, dtype),
        tuple(_unit(unit, dtype) for unit in units),
    )


def _unit(unit, dtype: torch.dtype) -> FusedUnit:
    first_snake, wide, second_snake, point = unit.block
    return FusedUnit(
        SnakeParams.of(first_snake.alpha),
        pack_conv(wide.conv, dtype),
        SnakeParams.of(second_snake.alpha),
        pack_conv(point.conv, dtype),
    )


def decode_values_per_sample(config: CodecConfig, path: str) -> float:
    """Activation values alive at once per output sample, at the decoder's widest step, on
    `path` ("epilogue" / "prologue": the fused kernel's Snake placements; "eager": layers.py).
    Each sample's own output value is counted by the caller."""
    if path not in LIVE_TENSORS:
        raise ValueError(f"path must be one of {sorted(LIVE_TENSORS)}, got {path!r}")
    (upsample_in, upsample_out), (unit_in, unit_out) = LIVE_TENSORS[path]
    rates = list(config.decoder_rates)
    width = config.decoder_dim
    values_in = width / math.prod(rates)  # model.0's output per sample
    peak = values_in + config.latent_width / math.prod(rates)
    for stage, _ in enumerate(rates):
        width //= 2
        values_out = width / math.prod(rates[stage + 1 :])
        peak = max(peak, upsample_in * values_in + upsample_out * values_out, unit_in + unit_out * values_out)
        values_in = values_out
    return peak
