"""Residual add + RMSNorm in one kernel, in upstream's cast order (docs/architecture.md §5.4):
h = x + delta (rounded to the stream's dtype, as the eager add rounds it), then h normalised in
float32, cast back to the dtype, then times the weight. Stock fused norms (e.g. apex's or
Liger's) multiply by the weight before the cast and round differently, which moves the float32
vectors; this one keeps the eager ops' order, so only the mean's summation order differs.

`add_rms_norm_reference` is the eager form (what the CPU runs); `add_rms_norm_triton` the kernel;
`add_rms_norm_op` the custom op the fused path calls (one kernel launch: CUDA runs the Triton
kernel, the CPU the reference, or the kernel under TRITON_INTERPRET=1).
"""

from typing import Optional

import torch
from torch import Tensor

from ...modules import compute_dtype
from .triton_shim import cast, launch_options, runs_on, tl, triton


def add_rms_norm_reference(x: Tensor, delta: Optional[Tensor], weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """(h, norm(h)) with h = x + delta (x itself when delta is None): the eager block's residual
    add then RMSNorm (actors/modules.py), op for op."""
    h = x if delta is None else x + delta
    wide = h.to(compute_dtype(h.dtype))
    normed = wide * torch.rsqrt(torch.mean(wide * wide, dim=-1, keepdim=True) + eps)
    return h, normed.to(h.dtype) * weight


@triton.jit
def _add_rms_norm_kernel(
    x_ptr, delta_ptr, weight_ptr, h_ptr, out_ptr, n_cols, eps,
    HAS_DELTA: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    inside = offs < n_cols
    x = tl.load(x_ptr + row * n_cols + offs, mask=inside, other=0.0)
    if HAS_DELTA:
        d = tl.load(delta_ptr + row * n_cols + offs, mask=inside, other=0.0)
        x = cast(x.to(tl.float32) + d.to(tl.float32), x.dtype)  # the eager add rounds here
        tl.store(h_ptr + row * n_cols + offs, x, mask=inside)
    wide = x.to(tl.float32)
    mean = tl.sum(wide * wide, axis=0) / n_cols
    scale = tl.div_rn(1.0, tl.sqrt_rn(mean + eps))  # IEEE, as torch.rsqrt computes it on CPU
    normed = cast(wide * scale, x.dtype)  # the cast before the weight: upstream's order
    w = tl.load(weight_ptr + offs, mask=inside, other=0.0)
    out = normed.to(tl.float32) * w.to(tl.float32)
    tl.store(out_ptr + row * n_cols + offs, cast(out, out_ptr.dtype.element_ty), mask=inside)


def add_rms_norm_triton(x: Tensor, delta: Optional[Tensor], weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """The kernel: one program per row of the last dimension."""
    shape, n = x.shape, x.shape[-1]
    flat = x.reshape(-1, n).contiguous()
    out = torch.empty(flat.shape, dtype=torch.promote_types(x.dtype, weight.dtype), device=x.device)
    if delta is None:
        h = x
        d = flat
    else:
        d = delta.reshape(-1, n).contiguous()
        h = torch.empty_like(flat)
    if flat.shape[0]:
        _add_rms_norm_kernel[(flat.shape[0],)](
            flat, d, weight, h if delta is not None else flat, out, n, float(eps),
            HAS_DELTA=delta is not None, BLOCK=triton.next_power_of_2(n), **launch_options(),
        )  # fmt: skip
    return h.reshape(shape), out.reshape(shape)


def _implementation(x: Tensor, delta: Optional[Tensor], weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    if runs_on(x.device.type) and x.dtype != torch.float64:
        return add_rms_norm_triton(x, delta, weight, eps)
    return add_rms_norm_reference(x, delta, weight, eps)


@torch.library.custom_op("chorus::add_rms_norm", mutates_args=())
def add_rms_norm_op(x: Tensor, delta: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """The fused path's residual add + norm: one launch. Returns (x + delta, its norm)."""
    return _implementation(x, delta, weight, eps)


@add_rms_norm_op.register_fake
def _(x, delta, weight, eps):
    return torch.empty_like(x), torch.empty(x.shape, dtype=torch.promote_types(x.dtype, weight.dtype), device=x.device)


@torch.library.custom_op("chorus::rms_norm", mutates_args=())
def rms_norm_op(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """The fused path's norm without a residual add (a stack's first block): one launch."""
    return _implementation(x, None, weight, eps)[1]


@rms_norm_op.register_fake
def _(x, weight, eps):
    return torch.empty(x.shape, dtype=torch.promote_types(x.dtype, weight.dtype), device=x.device)
