"""SwiGLU's gate, silu(a) * b, in one kernel (the eager form is two: silu, then the product).
silu is computed in float32 and rounded to the dtype before the product, as the two eager ops
round it.

`silu_mul_reference` is the eager form, `silu_mul_triton` the kernel, `silu_mul_op` the fused
path's custom op (CUDA: the kernel; CPU: the reference, or the kernel under TRITON_INTERPRET=1).
"""

import torch
import torch.nn.functional as F
from torch import Tensor

from .triton_shim import cast, launch_options, runs_on, tl, triton

BLOCK = 1024


def silu_mul_reference(a: Tensor, b: Tensor) -> Tensor:
    return F.silu(a) * b


@triton.jit
def _silu_mul_kernel(a_ptr, b_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inside = offs < n
    a = tl.load(a_ptr + offs, mask=inside, other=0.0)
    b = tl.load(b_ptr + offs, mask=inside, other=0.0)
    wide = a.to(tl.float32)
    gate = cast(tl.div_rn(wide, 1.0 + tl.exp(-wide)), a.dtype)  # torch's silu: x / (1 + exp(-x))
    tl.store(out_ptr + offs, cast(gate.to(tl.float32) * b.to(tl.float32), a.dtype), mask=inside)


def silu_mul_triton(a: Tensor, b: Tensor) -> Tensor:
    a, b = a.contiguous(), b.contiguous()
    out = torch.empty_like(a)
    n = a.numel()
    if n:
        _silu_mul_kernel[(triton.cdiv(n, BLOCK),)](a, b, out, n, BLOCK=BLOCK, **launch_options())
    return out


@torch.library.custom_op("chorus::silu_mul", mutates_args=())
def silu_mul_op(a: Tensor, b: Tensor) -> Tensor:
    if runs_on(a.device.type) and a.dtype != torch.float64:
        return silu_mul_triton(a, b)
    return silu_mul_reference(a, b)


@silu_mul_op.register_fake
def _(a, b):
    return torch.empty_like(a)
