"""The codec's narrow layers through one C++ kernel (snake_conv.cpp): Snake, then a causal
convolution, then optionally a residual, in one pass over cache-sized tiles, float32 on CPU.

Which layers: a residual unit (Snake, 7-tap conv, Snake, 1-tap conv, plus its input) and the
decoder's last Snake + conv, when they are at most `max_channels()` wide. Measured against the
torch layers on Sapphire Rapids, one thread, 2 rows (AVX-512 build): 2.8x at 4 channels, 2.2x
at 8, 1.6x at 16, 1.5x at 32, 1.3-1.4x at 64; an AVX2 build on the same CPU was 1.3-1.7x at 4-8
channels and slower from 16 on. The limit stops at 32 on AVX-512: a unit runs whole (its inner
activation is one tensor, where torch's path goes in time chunks), and the real codec's
encoder has 64-channel units at audio rate (a 2**21-sample batch: 512 MiB more); its other
layers (96-1536 channels) stay with oneDNN too. A layer's result differs from the torch
layers' by float rounding (~1e-6 of values around 1).
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import torch
from torch import Tensor, nn

from .. import native

SOURCE = Path(__file__).with_name("snake_conv.cpp")
NAME = "chorus_codec"


def max_channels() -> int:
    """The widest layer the kernel is faster for on this CPU (see above)."""
    return 32 if native.cpu_capability() == "AVX512" else 8


def load(build_root: Optional[Path] = None) -> bool:
    """Build (once per node) and load the kernel; False where it cannot be built."""
    return native.build(NAME, SOURCE, build_root)


def serves(x: Tensor) -> bool:
    """Whether the kernel can take this activation (the layer decided it is narrow enough)."""
    return x.dtype == torch.float32 and x.device.type == "cpu" and not torch.is_grad_enabled()


def snake_conv(
    x: Tensor, alpha: Tensor, conv: nn.Conv1d, dilation: int, residual: Optional[Tensor] = None,
    out: Optional[Tensor] = None,
) -> Tensor:  # fmt: skip
    """conv(snake(x)) with causal padding (+ residual), written to `out` (a new tensor when
    None; it may be the residual itself)."""
    if out is None:
        out = x.new_empty(x.shape[0], conv.out_channels, x.shape[-1])
    torch.ops.chorus_codec.snake_conv(x, alpha, conv.weight, conv.bias, dilation, residual, out)
    return out
