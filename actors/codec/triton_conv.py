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

Off a GPU the kernel runs in Triton's interpreter (TRITON_INTERPRET=1, set before the kernel
imported), which is how the tests check it against the eager layers on a CPU. The
interpreter's `tl.dot` mishandles bfloat16 operands (triton 3.9), so there (DOT_F32) they are
widened to float32 first: products of bf16 values are exact in float32, so the sums are the
ones a tensor core forms, up to their order. Its float32 -> bfloat16 casts truncate where a GPU
rounds to nearest even, so there (ROUND_BF16) the kernel rounds first, as the GPU would. Under
the interpreter a program's tile is numpy arrays, so tiles span the whole length (up to
INTERPRETER_BLOCK_T): its cost is per program and per op, hardly per value.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from dataclasses import dataclass
from types import ModuleType
from typing import Optional

import torch
from torch import Tensor

SNAKE_PLACEMENTS = ("epilogue", "prologue")
INTERPRETER_BLOCK_T = 8192


def interpreting() -> bool:
    """Whether triton runs kernels in its interpreter (CPU tensors) in this process."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def installed() -> bool:
    """Whether triton can be imported (the lent GPU image has the one torch ships)."""
    return importlib.util.find_spec("triton") is not None


def available(device: torch.device) -> bool:
    """Whether the kernel can run on `device`: triton installed, and a CUDA device (or any
    device, under the interpreter)."""
    return installed() and (device.type == "cuda" or interpreting())


_KERNEL_MODULES: dict[bool, ModuleType] = {}


def kernel_module() -> ModuleType:
    """triton_kernels.py decorated for this process's mode (compiled, or interpreted under
    TRITON_INTERPRET=1): imported the first time it is asked for; asked for in the other mode
    later (a test), loaded again as a module of its own, so neither copy's kernels change."""
    mode = interpreting()
    if mode not in _KERNEL_MODULES:
        name = f"{__package__}.triton_kernels"
        module = importlib.import_module(name)
        if module.INTERPRETED != mode:
            spec = importlib.util.spec_from_file_location(
                f"{name}_{'interpreted' if mode else 'compiled'}", module.__file__
            )
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        _KERNEL_MODULES[mode] = module
    return _KERNEL_MODULES[mode]


def kernel():
    return kernel_module().causal_conv_kernel


@dataclass(frozen=True)
class Tiles:
    """A launch's tile sizes (powers of two, each >= 16 for tl.dot) and warps / stages."""

    block_co: int
    block_t: int
    block_ci: int
    warps: int = 4
    stages: int = 3


def tiles_for(out_channels: int, in_channels: int, taps: int, length: int) -> Tiles:
    """Tile sizes by the layer's width. 128 x 128 output tiles with 8 warps (a wgmma-sized tile,
    its float32 sums 64 registers a thread); input channels in blocks that divide them where a
    power of two does (the real codec's 96 in threes of 32), so no block is half masked. Under
    the interpreter a tile spans the whole length. The GPU bench's figures are what to tune by."""
    block_co = _power_of_two(out_channels, 128)
    block_ci = next((b for b in (64, 32, 16) if in_channels % b == 0), _power_of_two(in_channels, 64))
    if interpreting():
        return Tiles(block_co=block_co, block_t=_power_of_two(length, INTERPRETER_BLOCK_T), block_ci=block_ci)
    return Tiles(block_co=block_co, block_t=128, block_ci=block_ci, warps=8 if block_co >= 64 else 4)


def _power_of_two(count: int, most: int) -> int:
    """The smallest power of two >= count, within [16, most]."""
    return min(most, max(16, 1 << (count - 1).bit_length()))


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
    if not installed():
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
    tiles = tiles or tiles_for(conv.weight.shape[1], in_channels, conv.taps, length)
    packed_channels = conv.weight.shape[1]
    grid = (-(-length // tiles.block_t), -(-packed_channels // tiles.block_co), batch)
    dummy = conv.bias  # stands for absent operands (never read: their flags are off)
    kernel()[grid](
        x, conv.weight, conv.bias,
        in_snake.alpha if in_snake else dummy, in_snake.inverse if in_snake else dummy,
        residual if residual is not None else x,
        out_snake.alpha if out_snake else dummy, out_snake.inverse if out_snake else dummy,
        y if y is not None else s, s if s is not None else y, length,
        IN_CHANNELS=in_channels, OUT_CHANNELS=packed_channels, TAPS=conv.taps, DILATION=conv.dilation, UPSAMPLE=conv.upsample, IN_SNAKE=in_snake is not None,
        RESIDUAL=residual is not None, WRITE_Y=y is not None, OUT_SNAKE=s is not None, TANH=tanh,
        DOT_F32=interpreting() or x.dtype == torch.float32,
        ROUND_BF16=interpreting() and x.dtype == torch.bfloat16,
        FAST_SIN=not interpreting() and x.dtype != torch.float32,
        BLOCK_CO=tiles.block_co, BLOCK_T=tiles.block_t, BLOCK_CI=tiles.block_ci,
        num_warps=tiles.warps, num_stages=tiles.stages,
    )  # fmt: skip
    return y, s
