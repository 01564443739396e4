"""The codec decoder's convolutions as one Triton kernel: a causal 1-d convolution, or a
transposed one, with Snake in its prologue or epilogue, bias, residual and tanh in its
epilogue, on a GPU in bfloat16 / float16 (float32 sums either way).

What it replaces on a GPU (the eager layers of layers.py): `Snake1d` is five passes over its
tensor and `F.pad` a copy before every causal conv, then a residual unit adds its input in a
pass of its own. Here one program computes a tile of BLOCK_CO output channels x BLOCK_T time
steps of one row: it sums taps x input-channel blocks with `tl.dot` (the causal padding is the
load's mask: no padded copy), and finishes the tile in registers -- bias, tanh, the residual,
and the Snake the next layer wants (written beside, or instead of, the plain output).

A transposed conv with kernel 2s and stride s (every DecoderBlock's upsampler; the last s
outputs trimmed) is the same kernel: output sample j*s + r is
    sum_ci W[ci, co, r] x[ci, j] + W[ci, co, r + s] x[ci, j - 1],
a causal 2-tap conv over input frames into co*s + r "channels" (`pack_transposed`), whose
tile is stored at (co, j*s + r) (UPSAMPLE = s).

Where the Snake goes (`snake="epilogue"`, the default, or `"prologue"`): in the epilogue each
Snake is computed once per value, by the layer that produces its input, at the cost of one
more tensor written and read per residual unit; in the prologue every tap of every output
channel block recomputes the Snake of what it loads (7 taps of a residual unit's wide conv) but
nothing more is written. Which pays is the GPU's to say: `python -m actors.codec gpu-bench
--backends triton,triton-prologue` measures both.

Off a GPU the kernel runs in Triton's interpreter (TRITON_INTERPRET=1, set before triton is
imported), which is how the tests check it against the eager layers on a CPU. The
interpreter's `tl.dot` mishandles bfloat16 operands (triton 3.9), so there (DOT_F32) they are
widened to float32 first: products of bf16 values are exact in float32, so the sums are the
ones a tensor core forms, up to their order. Its float32 -> bfloat16 casts truncate where a GPU
rounds to nearest even, so there (ROUND_BF16) the kernel rounds first, as the GPU would. Under
the interpreter a program's tile is numpy arrays, so tiles are long (INTERPRETER_BLOCK_T):
the cost is per program, not per value.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor

try:  # the lent GPU image has the triton torch ships; a CPU install may have none
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the install
    triton = None

SNAKE_PLACEMENTS = ("epilogue", "prologue")
INTERPRETER_BLOCK_T = 8192


def interpreting() -> bool:
    """Whether triton runs kernels in its interpreter (CPU tensors) in this process."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def available(device: torch.device) -> bool:
    """Whether the kernel can run on `device`: triton importable, and a CUDA device (or any
    device, under the interpreter)."""
    return triton is not None and (device.type == "cuda" or interpreting())


@dataclass(frozen=True)
class Tiles:
    """A launch's tile sizes (powers of two, each >= 16 for tl.dot) and warps / stages."""

    block_co: int
    block_t: int
    block_ci: int
    warps: int = 4
    stages: int = 3


def tiles_for(out_channels: int, in_channels: int, taps: int) -> Tiles:
    """Tile sizes by the layer's width. Wide layers (the real codec's 384-1536 channels) take
    128 x 128 output tiles, which keep a tensor core busy; narrow ones (96-192) cover their
    channels in as few blocks as the registers allow, so the input tile -- and a prologue's
    Snake -- is loaded by few programs. The GPU bench's figures are what to tune them by."""
    block_co, block_ci = _power_of_two(out_channels, 128), _power_of_two(in_channels, 64)
    if interpreting():
        return Tiles(block_co=block_co, block_t=INTERPRETER_BLOCK_T, block_ci=block_ci)
    if out_channels >= 256 and in_channels >= 256:
        return Tiles(block_co=128, block_t=128, block_ci=64, warps=8)
    return Tiles(block_co=block_co, block_t=128 if taps > 1 else 256, block_ci=block_ci, warps=8 if taps > 1 else 4)


def _power_of_two(channels: int, most: int) -> int:
    """The smallest power of two >= channels, within [16, most]."""
    return min(most, max(16, 1 << (channels - 1).bit_length()))


if triton is not None:

    @triton.jit
    def _snake(x, alpha, inverse):
        """x + sin(alpha x)^2 / (alpha + 1e-9) on a [channels, time] float32 tile."""
        wave = tl.sin(x * alpha[:, None])
        return x + wave * wave * inverse[:, None]

    @triton.jit
    def _rounded(x, dtype: tl.constexpr, ROUND_BF16: tl.constexpr):
        """x (float32) in `dtype`, rounded to nearest even (by hand where ROUND_BF16)."""
        if ROUND_BF16:
            bits = x.to(tl.uint32, bitcast=True)
            bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
            x = bits.to(tl.float32, bitcast=True)
        return x.to(dtype)

    @triton.jit
    def _tap_sum(acc, x_row, w_ptr, in_alpha, in_inverse, t, co, in_channels, out_channels, length,
                 SHIFT: tl.constexpr, TAP: tl.constexpr, IN_SNAKE: tl.constexpr, DOT_F32: tl.constexpr,
                 ROUND_BF16: tl.constexpr, BLOCK_CI: tl.constexpr):  # fmt: skip
        """acc += W[TAP] @ x[:, t - SHIFT] over every input channel block (zeros before 0)."""
        source = t - SHIFT
        t_ok = (source >= 0) & (source < length)
        co_ok = co < out_channels
        for first in range(0, in_channels, BLOCK_CI):
            ci = first + tl.arange(0, BLOCK_CI)
            ci_ok = ci < in_channels
            x_ok = ci_ok[:, None] & t_ok[None, :]
            xs = tl.load(x_row + ci[:, None].to(tl.int64) * length + source[None, :], mask=x_ok, other=0.0)
            if IN_SNAKE:  # masked values stay 0: Snake(0) = 0, so the causal padding commutes with it
                alpha = tl.load(in_alpha + ci, mask=ci_ok, other=1.0)
                inverse = tl.load(in_inverse + ci, mask=ci_ok, other=0.0)
                xs = _rounded(_snake(xs.to(tl.float32), alpha, inverse), x_row.dtype.element_ty, ROUND_BF16)
            w_offsets = (TAP * out_channels + co[:, None]).to(tl.int64) * in_channels + ci[None, :]
            w = tl.load(w_ptr + w_offsets, mask=co_ok[:, None] & ci_ok[None, :], other=0.0)
            if DOT_F32:
                acc += tl.dot(w.to(tl.float32), xs.to(tl.float32), input_precision="ieee")
            else:
                acc = tl.dot(w, xs, acc)
        return acc

    @triton.jit
    def _causal_conv_kernel(
        x_ptr, w_ptr, bias_ptr, in_alpha, in_inverse, residual_ptr, out_alpha, out_inverse, y_ptr, s_ptr,
        in_channels, out_channels, length,
        TAPS: tl.constexpr, DILATION: tl.constexpr, UPSAMPLE: tl.constexpr, IN_SNAKE: tl.constexpr,
        RESIDUAL: tl.constexpr, WRITE_Y: tl.constexpr, OUT_SNAKE: tl.constexpr, TANH: tl.constexpr,
        DOT_F32: tl.constexpr, ROUND_BF16: tl.constexpr,
        BLOCK_CO: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_CI: tl.constexpr,
    ):  # fmt: skip
        """One [BLOCK_CO, BLOCK_T] tile of one row; `out_channels` counts packed rows (co * s + r
        for a transposed conv), `length` input frames."""
        t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
        co = tl.program_id(1) * BLOCK_CO + tl.arange(0, BLOCK_CO)
        row = tl.program_id(2).to(tl.int64)
        x_row = x_ptr + row * in_channels * length
        acc = tl.zeros((BLOCK_CO, BLOCK_T), dtype=tl.float32)
        for tap in tl.static_range(TAPS):
            acc = _tap_sum(acc, x_row, w_ptr, in_alpha, in_inverse, t, co, in_channels, out_channels, length,
                           (TAPS - 1 - tap) * DILATION, tap, IN_SNAKE, DOT_F32, ROUND_BF16, BLOCK_CI)  # fmt: skip
        co_ok = co < out_channels
        acc += tl.load(bias_ptr + co, mask=co_ok, other=0.0)[:, None]
        if TANH:  # 1 - 2 / (e^2x + 1): exact limits +-1 where e^2x over- or underflows
            acc = 1.0 - 2.0 / (tl.exp(2.0 * acc) + 1.0)
        channel = (co // UPSAMPLE).to(tl.int64)
        offsets = row * out_channels * length + channel[:, None] * (length * UPSAMPLE)
        offsets += t[None, :] * UPSAMPLE + (co % UPSAMPLE)[:, None]
        ok = co_ok[:, None] & (t < length)[None, :]
        if RESIDUAL:
            acc += tl.load(residual_ptr + offsets, mask=ok, other=0.0).to(tl.float32)
        if WRITE_Y:
            tl.store(y_ptr + offsets, _rounded(acc, y_ptr.dtype.element_ty, ROUND_BF16), mask=ok)
        if OUT_SNAKE:
            alpha = tl.load(out_alpha + channel, mask=co_ok, other=1.0)
            inverse = tl.load(out_inverse + channel, mask=co_ok, other=0.0)
            snaked = _rounded(_snake(acc, alpha, inverse), s_ptr.dtype.element_ty, ROUND_BF16)
            tl.store(s_ptr + offsets, snaked, mask=ok)


@dataclass(frozen=True)
class SnakeParams:
    """A Snake's alpha and 1 / (alpha + 1e-9), float32 [C], as the eager Snake1d computes them."""

    alpha: Tensor
    inverse: Tensor

    @classmethod
    def of(cls, alpha: Tensor) -> SnakeParams:
        flat = alpha.detach().reshape(-1).float()
        return cls(flat.contiguous(), (flat + 1e-9).reciprocal().contiguous())


@dataclass(frozen=True)
class PackedConv:
    """A conv's weight as [taps, packed out channels, in channels] in the compute dtype, its
    bias float32 per packed channel, and how the kernel reads it."""

    weight: Tensor
    bias: Tensor
    dilation: int = 1
    upsample: int = 1

    @property
    def taps(self) -> int:
        return self.weight.shape[0]

    @property
    def out_channels(self) -> int:
        """Real output channels (packed rows / upsample)."""
        return self.weight.shape[1] // self.upsample

    @property
    def in_channels(self) -> int:
        return self.weight.shape[2]


def pack_conv(conv: torch.nn.Conv1d, dtype: torch.dtype) -> PackedConv:
    """nn.Conv1d weight [out, in, k] -> [k, out, in] (a stride-1 causal conv)."""
    if conv.stride[0] != 1 or conv.groups != 1:
        raise ValueError(f"the kernel runs stride-1, ungrouped convs; got {conv}")
    weight = conv.weight.detach().permute(2, 0, 1).to(dtype).contiguous()
    return PackedConv(weight, _bias(conv, weight.shape[1]), dilation=conv.dilation[0])


def pack_transposed(conv: torch.nn.ConvTranspose1d, dtype: torch.dtype) -> PackedConv:
    """nn.ConvTranspose1d weight [in, out, 2s] (stride s) -> 2 causal taps over packed
    channels co * s + r: tap 0 reads frame j - 1 with W[..., r + s], tap 1 frame j with W[..., r]."""
    stride, kernel = conv.stride[0], conv.kernel_size[0]
    if kernel != 2 * stride or conv.padding[0] or conv.groups != 1:
        raise ValueError(f"the kernel runs transposed convs of kernel 2 x stride, unpadded; got {conv}")
    weight = conv.weight.detach()  # [in, out, 2s]
    in_channels, out_channels = weight.shape[0], weight.shape[1]
    taps = weight.view(in_channels, out_channels, 2, stride).permute(2, 1, 3, 0)  # [half, out, r, in]
    packed = taps.flip(0).reshape(2, out_channels * stride, in_channels).to(dtype).contiguous()
    bias = _bias(conv, out_channels).repeat_interleave(stride)
    return PackedConv(packed, bias, upsample=stride)


def _bias(conv: torch.nn.Module, channels: int) -> Tensor:
    if conv.bias is None:
        return torch.zeros(channels, dtype=torch.float32, device=conv.weight.device)
    return conv.bias.detach().float().contiguous()


def causal_conv(
    x: Tensor,
    conv: PackedConv,
    *,
    in_snake: Optional[SnakeParams] = None,
    residual: Optional[Tensor] = None,
    out_snake: Optional[SnakeParams] = None,
    write_plain: bool = True,
    tanh: bool = False,
    out: Optional[Tensor] = None,
    snake_out: Optional[Tensor] = None,
    tiles: Optional[Tiles] = None,
) -> tuple[Optional[Tensor], Optional[Tensor]]:
    """y = conv(in_snake(x)) + bias (tanh'd) + residual, and s = out_snake(y): x [B, C_in, T]
    -> ([B, C_out, T * upsample] or None, the same or None). `out` / `snake_out` may be given
    (`out` may be the residual itself: a tile reads only the residual values it writes)."""
    if triton is None:
        raise RuntimeError("the codec's Triton kernel needs triton (pip install triton)")
    batch, in_channels, length = x.shape
    if in_channels != conv.in_channels or not x.is_contiguous():
        raise ValueError(f"x must be a contiguous [B, {conv.in_channels}, T], got {tuple(x.shape)}")
    shape = (batch, conv.out_channels, length * conv.upsample)
    y = (out if out is not None else x.new_empty(shape)) if write_plain else None
    s = (snake_out if snake_out is not None else x.new_empty(shape)) if out_snake is not None else None
    if residual is not None and (tuple(residual.shape) != shape or not residual.is_contiguous()):
        raise ValueError(f"residual must be a contiguous {shape}, got {tuple(residual.shape)}")
    if y is None and s is None:
        raise ValueError("nothing to write: write_plain=False needs an out_snake")
    tiles = tiles or tiles_for(conv.weight.shape[1], in_channels, conv.taps)
    packed_channels = conv.weight.shape[1]
    grid = (triton.cdiv(length, tiles.block_t), triton.cdiv(packed_channels, tiles.block_co), batch)
    dummy = conv.bias  # stands for absent operands (never read: their flags are off)
    _causal_conv_kernel[grid](
        x, conv.weight, conv.bias,
        in_snake.alpha if in_snake else dummy, in_snake.inverse if in_snake else dummy,
        residual if residual is not None else x,
        out_snake.alpha if out_snake else dummy, out_snake.inverse if out_snake else dummy,
        y if y is not None else s, s if s is not None else y,
        in_channels, packed_channels, length,
        TAPS=conv.taps, DILATION=conv.dilation, UPSAMPLE=conv.upsample, IN_SNAKE=in_snake is not None,
        RESIDUAL=residual is not None, WRITE_Y=y is not None, OUT_SNAKE=s is not None, TANH=tanh,
        DOT_F32=interpreting() or x.dtype == torch.float32,
        ROUND_BF16=interpreting() and x.dtype == torch.bfloat16,
        BLOCK_CO=tiles.block_co, BLOCK_T=tiles.block_t, BLOCK_CI=tiles.block_ci,
        num_warps=tiles.warps, num_stages=tiles.stages,
    )  # fmt: skip
    return y, s
