"""SwiGLU's gate, silu(a) * b, in one kernel (the eager form is two: silu, then the product).
silu is computed in float32 and rounded to the dtype before the product, as the two eager ops
round it. The fused path feeds it one product of the gate and up weights side by side
(`gate_up` [.., 2F]: a = its first F columns, b the rest), one launch fewer than two products.

`silu_mul_reference` is the eager form, `silu_mul_triton` the kernel, `silu_mul_op` the fused
path's custom op (CUDA: the kernel; CPU: the reference, or the kernel under TRITON_INTERPRET=1).
"""

import torch
import torch.nn.functional as F
from torch import Tensor

from .triton_shim import cast, launch_options, runs_on, tl, triton

BLOCK = 1024


def silu_mul_reference(gate_up: Tensor) -> Tensor:
    a, b = gate_up.chunk(2, dim=-1)
    return F.silu(a) * b


@triton.jit
def _silu_mul_kernel(x_ptr, out_ptr, n, width, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inside = offs < n
    at = (offs // width) * 2 * width + offs % width  # row r, column c: x[r, c] and x[r, width + c]
    a = tl.load(x_ptr + at, mask=inside, other=0.0)
    b = tl.load(x_ptr + at + width, mask=inside, other=0.0)
    wide = a.to(tl.float32)
    gate = cast(tl.div_rn(wide, 1.0 + tl.exp(-wide)), a.dtype)  # torch's silu: x / (1 + exp(-x))
    tl.store(out_ptr + offs, cast(gate.to(tl.float32) * b.to(tl.float32), a.dtype), mask=inside)


def silu_mul_triton(gate_up: Tensor) -> Tensor:
    x = gate_up.contiguous()
    width = x.shape[-1] // 2
    out = x.new_empty(*x.shape[:-1], width)
    n = out.numel()
    if n:
        _silu_mul_kernel[(triton.cdiv(n, BLOCK),)](x, out, n, width, BLOCK=BLOCK, **launch_options())
    return out


@torch.library.custom_op("chorus::silu_mul", mutates_args=())
def silu_mul_op(gate_up: Tensor) -> Tensor:
    """silu(first half) * second half of the last dimension: one launch."""
    if runs_on(gate_up.device.type) and gate_up.dtype != torch.float64:
        return silu_mul_triton(gate_up)
    return silu_mul_reference(gate_up)


@silu_mul_op.register_fake
def _(gate_up):
    return gate_up.new_empty(*gate_up.shape[:-1], gate_up.shape[-1] // 2)
