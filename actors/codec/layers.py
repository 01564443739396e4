"""Convolutional building blocks of the causal modded DAC.

Module and attribute names follow upstream (fish_speech/models/dac/modded_dac.py
and descript-audio-codec) so that checkpoint keys map one to one once weight
norm is folded into plain weights. Every layer is causal: output sample t
depends only on inputs <= t, which is what makes right padding harmless for
batching.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from . import kernels
from .config import CodecConfig, TransformerConfig
from .transformer import WindowLimitedTransformer

# How a conv's weight is stored in upstream checkpoints. The loader reads both
# storages whatever the tag says; the tag only chooses the key named in errors
# and the layout tiny.py writes.
WEIGHT_NORM_PARAMETRIZED = "parametrized"  # parametrizations.weight.original0/1
WEIGHT_NORM_LEGACY = "legacy"  # weight_g / weight_v
PLAIN_WEIGHT = "plain"

# The decoder's late stages hold tens of MB per tensor at audio rate. Running
# them over the whole clip at once spends much of the time faulting in fresh
# pages and streaming through memory; instead each conv (with the Snake before
# it and the residual after it) runs over blocks of rows x time steps holding
# about this many values, which stay in cache and reuse allocations.
CHUNK_ELEMENTS = 2**18
MIN_CHUNK_SAMPLES = 1024


def chunks_pay(x: torch.Tensor) -> bool:
    """Whether a layer runs over cache-sized chunks: on CPU. A GPU's caches are not what bounds
    it, and a chunk per few thousand values would make thousands of small launches a decode."""
    return x.device.type == "cpu"


def chunk_shape(batch: int, channels: int) -> tuple[int, int]:
    """(rows, time steps) per chunk of a [batch, channels, T] activation.
    Wide batches are split by rows first so chunks stay long in time (the
    causal left context is then a small overhead)."""
    rows = max(1, min(batch, CHUNK_ELEMENTS // max(1, channels * MIN_CHUNK_SAMPLES)))
    return rows, max(MIN_CHUNK_SAMPLES, CHUNK_ELEMENTS // (rows * channels))


class CausalConv1d(nn.Module):
    """Conv1d that pads zeros on the left only, then on the right so that the
    output has ceil(L / stride) frames (upstream CausalConvNet)."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int,
        *,
        stride: int = 1,
        dilation: int = 1,
        groups: int = 1,
        weight_norm: str = WEIGHT_NORM_PARAMETRIZED,
    ):
        super().__init__()
        self.conv = nn.Conv1d(in_channels, out_channels, kernel_size, stride=stride, dilation=dilation, groups=groups)
        self.conv.weight_norm_storage = weight_norm
        self.stride = stride
        self.left_padding = (kernel_size - 1) * dilation + 1 - stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        length = x.shape[-1]
        if x.device.type != "cpu" and self.stride == 1 and self.left_padding:
            # on a GPU, no padded copy: the conv pads both sides itself and the outputs the
            # right padding made are dropped (a view; the next op -- a Snake -- reads it as is)
            conv = self.conv
            y = F.conv1d(x, conv.weight, conv.bias, 1, self.left_padding, conv.dilation, conv.groups)
            return y[..., :length]
        frames = -(-length // self.stride)
        right_padding = frames * self.stride - length
        if self.left_padding or right_padding:
            x = F.pad(x, (self.left_padding, right_padding))
        return self.conv(x)

    def forward_chunked(
        self,
        x: torch.Tensor,
        before: Optional[nn.Module] = None,
        after: Optional[nn.Module] = None,
    ) -> torch.Tensor:
        """after(conv(before(x))) computed over time chunks; equals the
        unchunked result (before must map 0 to 0, as Snake does, because the
        causal zero padding is applied after it)."""
        if not chunks_pay(x):
            y = self.forward(x if before is None else before(x))
            return y if after is None else after(y)
        batch, _, length = x.shape
        frames = -(-length // self.stride)
        out = x.new_empty(batch, self.conv.out_channels, frames)
        rows, step = chunk_shape(batch, x.shape[1])
        step = max(1, step // self.stride)
        for row in range(0, batch, rows):
            for start in range(0, frames, step):
                end = min(start + step, frames)
                # Output frame j reads input samples j*stride - left_padding
                # through j*stride + stride - 1.
                low = start * self.stride - self.left_padding
                high = end * self.stride
                piece = x[row : row + rows, :, max(low, 0) : min(high, length)]
                if before is not None:
                    piece = before(piece)
                if low < 0 or high > length:
                    piece = F.pad(piece, (max(0, -low), max(0, high - length)))
                piece = self.conv(piece)
                out[row : row + rows, :, start:end] = piece if after is None else after(piece)
        return out


class CausalConvTranspose1d(nn.Module):
    """ConvTranspose1d whose last kernel_size - stride output samples are
    dropped, so L frames become L * stride samples (upstream CausalTransConvNet)."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int,
        *,
        stride: int,
        weight_norm: str = WEIGHT_NORM_PARAMETRIZED,
    ):
        super().__init__()
        self.conv = nn.ConvTranspose1d(in_channels, out_channels, kernel_size, stride=stride)
        self.conv.weight_norm_storage = weight_norm
        self.trim = kernel_size - stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        if self.trim:
            y = y[..., : y.shape[-1] - self.trim]
        return y

    def forward_chunked(self, x: torch.Tensor, before: Optional[nn.Module] = None) -> torch.Tensor:
        """conv(before(x)) over chunks of input frames (before(0) must be 0)."""
        if not chunks_pay(x):
            return self.forward(x if before is None else before(x))
        batch, _, frames = x.shape
        stride = self.conv.stride[0]
        kernel = self.conv.kernel_size[0]
        # Output samples of frame j also receive the tails of this many
        # earlier frames' kernels.
        overlap = (kernel - 1) // stride
        out = x.new_empty(batch, self.conv.out_channels, frames * stride)
        rows, _ = chunk_shape(batch, self.conv.out_channels)
        # A transposed conv on CPU goes through a column buffer of out_channels x kernel
        # values per input frame; past ~2**18 of them per call its cost per frame grows 2-5x
        # (measured: one row of 32768 frames 8->4 channels, 8 rows of 1024 frames 16->8), so
        # its chunks are sized by that buffer, not by the output -- but never below
        # MIN_CHUNK_SAMPLES of output: wide layers (a real codec's 1536 -> 768) would otherwise
        # get a few frames per call (15% slower decode measured on the real-size codec)
        step = max(MIN_CHUNK_SAMPLES // stride, CHUNK_ELEMENTS // (rows * self.conv.out_channels * kernel), 1)
        for row in range(0, batch, rows):
            for start in range(0, frames, step):
                end = min(start + step, frames)
                low = max(0, start - overlap)
                piece = x[row : row + rows, :, low:end]
                if before is not None:
                    piece = before(piece)
                piece = self.conv(piece)
                offset = (start - low) * stride
                out[row : row + rows, :, start * stride : end * stride] = piece[
                    ..., offset : offset + (end - start) * stride
                ]
        return out


class Snake1d(nn.Module):
    """x + sin(alpha x)^2 / (alpha + 1e-9), alpha per channel."""

    def __init__(self, channels: int):
        super().__init__()
        self.alpha = nn.Parameter(torch.ones(1, channels, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Upstream's expression, but one buffer updated in place: at audio
        # rate these tensors are tens of MB, and every temporary costs a full
        # pass through memory.
        inverse_alpha = (self.alpha + 1e-9).reciprocal()
        y = x * self.alpha
        if y.device.type == "cpu" and y.dtype == torch.float32 and not y.requires_grad:
            # numpy's float32 sine (its own AVX-512/AVX2 loops, within 1 ulp) runs 2.6x faster
            # than torch's here, and the sine was a third of the demo codec's decode; the result
            # differs from torch's by at most an ulp of the sine in ~6% of the values
            values = y.numpy()
            np.sin(values, out=values)
        else:
            y.sin_()
        y.square_()
        y.mul_(inverse_alpha)
        return y.add_(x)


class ResidualUnit(nn.Module):
    def __init__(self, channels: int, dilation: int):
        super().__init__()
        self.block = nn.Sequential(
            Snake1d(channels),
            CausalConv1d(channels, channels, 7, dilation=dilation),
            Snake1d(channels),
            CausalConv1d(channels, channels, 1),
        )
        self.native = False  # through kernels.py's C++ kernel (Codec.use_native_layers sets it)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Causal convs keep the length, so no cropping of x is needed.
        return self.block(x).add_(x)

    def forward_native(self, x: torch.Tensor, out: Optional[torch.Tensor]) -> torch.Tensor:
        first_snake, wide_conv, second_snake, point_conv = self.block
        inner = kernels.snake_conv(x, first_snake.alpha, wide_conv.conv, wide_conv.conv.dilation[0])
        out = torch.empty_like(x) if out is None else out
        return kernels.snake_conv(inner, second_snake.alpha, point_conv.conv, 1, residual=x, out=out)

    def forward_chunked(self, x: torch.Tensor, out: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Same result as forward, over time chunks, written into `out`
        (which may be x itself: chunks run last to first, so the left context
        a chunk reads is never one that was already overwritten)."""
        if self.native and kernels.serves(x):
            return self.forward_native(x, out)
        if not chunks_pay(x):
            y = self.block(x).add_(x)
            return y if out is None else out.copy_(y)
        first_snake, wide_conv, second_snake, point_conv = self.block
        batch, channels, length = x.shape
        if out is None:
            out = torch.empty_like(x)
        context = wide_conv.left_padding
        rows, step = chunk_shape(batch, channels)
        for row in range(0, batch, rows):
            block = slice(row, row + rows)
            for start in reversed(range(0, length, step)):
                end = min(start + step, length)
                low = start - context
                piece = first_snake(x[block, :, max(low, 0) : end])
                if low < 0:
                    piece = F.pad(piece, (-low, 0))
                piece = point_conv.conv(second_snake(wide_conv.conv(piece)))
                if out is x:
                    x[block, :, start:end] += piece
                else:
                    out[block, :, start:end] = piece.add_(x[block, :, start:end])
        return out


class EncoderBlock(nn.Module):
    def __init__(self, width: int, stride: int, transformer: Optional[TransformerConfig]):
        super().__init__()
        half = width // 2
        self.block = nn.Sequential(
            ResidualUnit(half, 1),
            ResidualUnit(half, 3),
            ResidualUnit(half, 9),
            Snake1d(half),
            CausalConv1d(half, width, 2 * stride, stride=stride),
            nn.Identity() if transformer is None else WindowLimitedTransformer(transformer),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        first, second, third, snake, down, transformer = self.block
        # The first unit writes a new buffer (x belongs to the caller); the
        # others update it in place.
        h = first.forward_chunked(x)
        h = third.forward_chunked(second.forward_chunked(h, out=h), out=h)
        return transformer(down.forward_chunked(h, before=snake))


class Encoder(nn.Module):
    def __init__(self, config: CodecConfig):
        super().__init__()
        width = config.encoder_dim
        layers: list[nn.Module] = [CausalConv1d(1, width, 7)]
        for stage, stride in enumerate(config.encoder_rates):
            width *= 2
            layers.append(EncoderBlock(width, stride, config.encoder_transformer(stage)))
        layers += [Snake1d(width), CausalConv1d(width, config.latent_width, 3)]
        self.block = nn.Sequential(*layers)

    def forward(self, audio: torch.Tensor) -> torch.Tensor:
        return self.block(audio)


class DecoderBlock(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, stride: int):
        super().__init__()
        self.block = nn.Sequential(
            Snake1d(in_channels),
            CausalConvTranspose1d(in_channels, out_channels, 2 * stride, stride=stride),
            ResidualUnit(out_channels, 1),
            ResidualUnit(out_channels, 3),
            ResidualUnit(out_channels, 9),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        snake, upsample, *units = self.block
        h = upsample.forward_chunked(x, before=snake)
        for unit in units:
            unit.forward_chunked(h, out=h)
        return h


class Decoder(nn.Module):
    def __init__(self, config: CodecConfig):
        super().__init__()
        channels = config.decoder_dim
        layers: list[nn.Module] = [CausalConv1d(config.latent_width, channels, 7)]
        for stage, stride in enumerate(config.decoder_rates):
            layers.append(DecoderBlock(channels // 2**stage, channels // 2 ** (stage + 1), stride))
        out_channels = channels // 2 ** len(config.decoder_rates)
        layers += [Snake1d(out_channels), CausalConv1d(out_channels, 1, 7), nn.Tanh()]
        self.model = nn.Sequential(*layers)
        self.native = False  # the last Snake + conv through kernels.py's C++ kernel

    def forward(self, latent: torch.Tensor) -> torch.Tensor:
        first_conv, *blocks, snake, last_conv, tanh = self.model
        h = first_conv(latent)
        for block in blocks:
            h = block(h)
        if self.native and kernels.serves(h):
            return kernels.snake_conv(h, snake.alpha, last_conv.conv, 1).tanh_()
        return last_conv.forward_chunked(h, before=snake, after=tanh)

    @property
    def last_channels(self) -> int:
        return self.model[-2].conv.in_channels


class ConvNeXtBlock(nn.Module):
    """Causal depthwise conv -> LayerNorm -> Linear 4x -> exact GELU -> Linear
    -> per-channel gamma, plus the input."""

    def __init__(self, dim: int, mlp_ratio: float = 4.0, kernel_size: int = 7):
        super().__init__()
        self.dwconv = CausalConv1d(dim, dim, kernel_size, groups=dim, weight_norm=PLAIN_WEIGHT)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, int(mlp_ratio * dim))
        self.pwconv2 = nn.Linear(int(mlp_ratio * dim), dim)
        self.gamma = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.dwconv(x).transpose(1, 2)
        y = self.pwconv2(F.gelu(self.pwconv1(self.norm(y)), approximate="none"))
        return x + (self.gamma * y).transpose(1, 2)
