"""A row too long for one decode call, decoded in pieces whose audio is the whole row's.

The quantizer's decode (codes -> latent: the post transformer at the frame rate, the upsampling
ConvNeXt blocks) is cheap per sample and runs over the whole row; the decoder, which holds
hundreds of bytes per output sample, runs over consecutive pieces of the latent. Every decoder
layer is causal with a finite reach, so a piece given `receptive_steps` latent steps of left
context computes its own samples from the same inputs as the whole row would: the context's
samples are dropped, the rest written in place. A piece holds at most the call's sample cap
(context included), so the decoder's memory stays within what the actor's plan gave one call,
however long the row.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from torch import Tensor, nn

from .layers import CausalConv1d, CausalConvTranspose1d


def receptive_steps(decoder: nn.Module) -> int:
    """Latent steps to the left that any decoder output sample can depend on (an upper bound),
    walked from the last layer back: a causal conv reaches (kernel - 1) * dilation positions
    back at its own rate; a causal transposed conv of stride s maps a reach of r output samples
    to ceil((r + kernel - 1) / s) inputs. Pointwise layers (Snake, tanh) and residual adds
    reach nothing further."""
    reach = 0
    for module in reversed(list(decoder.modules())):
        if isinstance(module, CausalConv1d):
            conv = module.conv
            if conv.stride[0] != 1:
                raise ValueError("a decoder conv with a stride: its reach is not counted here")
            reach += (conv.kernel_size[0] - 1) * conv.dilation[0]
        elif isinstance(module, CausalConvTranspose1d):
            conv = module.conv
            reach = math.ceil((reach + conv.kernel_size[0] - 1) / conv.stride[0])
    return reach


def decode_in_pieces(
    latent: Tensor, decode: Callable[[Tensor], Tensor], samples_per_step: int, context: int, max_samples: int
) -> Tensor:
    """latent [B, D, S] -> audio [B, 1, S * samples_per_step], `decode` called on pieces of at
    most max(max_samples // samples_per_step, 2 * context) steps, context included."""
    steps = latent.shape[-1]
    fresh = max(max_samples // samples_per_step - context, context, 1)  # new steps per piece
    out = None
    for start in range(0, steps, fresh):
        low, end = max(0, start - context), min(steps, start + fresh)
        audio = decode(latent[..., low:end].contiguous())
        if out is None:
            out = audio.new_empty(audio.shape[0], audio.shape[1], steps * samples_per_step)
        out[..., start * samples_per_step : end * samples_per_step] = audio[..., (start - low) * samples_per_step :]
    assert out is not None, "decode_in_pieces needs at least one latent step"
    return out
