"""q/k-norm + RoPE + the K/V write of one attention layer, in one kernel.

From the fused q/k/v product of N tokens (`qkv` [N, (H + 2 Hkv) D]), each token at its own
slot and position: the query heads normalised (q-norm, where the model has it) and rotated,
returned [N, H, D]; the key heads normalised and rotated and the value heads as they are,
written into the slot cache at the token's position. The eager form is ~14 launches (view,
q-norm and k-norm, cat, the four-pass rotation, split, two scatters).

Numerics are the eager layer's (docs/architecture.md §5.1, §5.2, §5.5): q/k-norm in float32 cast
back to the dtype then times the weight (torch's rms_norm), the rotation x*cos + swap(x)*sin
from the bf16-rounded table in float32, cast back; no fused multiply-adds.
"""

from typing import Optional

import torch
from torch import Tensor

from ...modules import compute_dtype
from .fp8 import to_fp8
from .triton_shim import cast, launch_options, runs_on, tl, triton


def qk_rope_write_reference(
    qkv: Tensor, slots: Tensor, positions: Tensor, rotation: Tensor, q_weight: Optional[Tensor],
    k_weight: Optional[Tensor], eps: float, k_cache: Tensor, v_cache: Tensor, n_head: int, n_kv: int,
) -> Tensor:  # fmt: skip
    """The eager form. qkv [N, (H + 2 Hkv) D]; slots, positions [N] int64; rotation
    (`rope_rotation`) [P, 2, D] float32; caches [slots, Hkv, S, D]. Returns q [N, H, D]."""
    n, d = qkv.shape[0], k_cache.shape[-1]
    q, k, v = qkv.view(n, n_head + 2 * n_kv, d).split([n_head, n_kv, n_kv], dim=1)
    if q_weight is not None:
        q = _head_norm(q, q_weight, eps)
        k = _head_norm(k, k_weight, eps)
    rot = rotation[positions].to(compute_dtype(qkv.dtype))  # [N, 2, D]
    cos, signed_sin = rot[:, 0].unsqueeze(1), rot[:, 1].unsqueeze(1)

    def rotate(x: Tensor) -> Tensor:
        wide = x.to(cos.dtype)
        swapped = wide.unflatten(-1, (-1, 2)).flip(-1).flatten(-2)
        return (wide * cos + swapped * signed_sin).to(x.dtype)

    k_cache[slots, :, positions] = _stored(rotate(k), k_cache.dtype)
    v_cache[slots, :, positions] = _stored(v, v_cache.dtype)
    return rotate(q)


def _stored(x: Tensor, dtype: torch.dtype) -> Tensor:
    """K/V as the cache keeps them: as they are, or saturated to FP8 (kernels/fp8.py)."""
    return x if x.dtype == dtype else to_fp8(x)


def _head_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """torch's rms_norm over the last dimension: float32, cast back, then times the weight."""
    wide = x.to(compute_dtype(x.dtype))
    normed = wide * torch.rsqrt(torch.mean(wide * wide, dim=-1, keepdim=True) + eps)
    return normed.to(x.dtype) * weight


@triton.jit
def _qk_rope_write_kernel(
    qkv_ptr, slot_ptr, pos_ptr, rot_ptr, qw_ptr, kw_ptr, q_out_ptr, k_ptr, v_ptr, eps,
    stride_slot, stride_head, stride_pos, slot_step, pos_step,
    N_HEAD: tl.constexpr, N_KV: tl.constexpr, D: tl.constexpr, QK_NORM: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    token = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)  # 0..H-1 queries, H..H+Hkv-1 keys, then values
    offs = tl.arange(0, BLOCK_D)
    inside = offs < D
    row = qkv_ptr + token * (N_HEAD + 2 * N_KV) * D + head * D
    x = tl.load(row + offs, mask=inside, other=0.0)
    slot = tl.load(slot_ptr + token * slot_step)
    pos = tl.load(pos_ptr + token * pos_step)
    if head >= N_HEAD + N_KV:  # a value head: written as it is
        dst = v_ptr + slot * stride_slot + (head - N_HEAD - N_KV) * stride_head + pos * stride_pos
        tl.store(dst + offs, cast(x.to(tl.float32), v_ptr.dtype.element_ty), mask=inside)
    else:
        partner = tl.load(row + (offs ^ 1), mask=inside, other=0.0)  # the other element of each adjacent pair
        wide, other = x.to(tl.float32), partner.to(tl.float32)
        if QK_NORM:
            scale = tl.div_rn(1.0, tl.sqrt_rn(tl.sum(wide * wide, axis=0) / D + eps))
            if head < N_HEAD:
                w = tl.load(qw_ptr + offs, mask=inside, other=0.0).to(tl.float32)
                w_other = tl.load(qw_ptr + (offs ^ 1), mask=inside, other=0.0).to(tl.float32)
            else:
                w = tl.load(kw_ptr + offs, mask=inside, other=0.0).to(tl.float32)
                w_other = tl.load(kw_ptr + (offs ^ 1), mask=inside, other=0.0).to(tl.float32)
            wide = cast(cast(wide * scale, x.dtype).to(tl.float32) * w, x.dtype).to(tl.float32)
            other = cast(cast(other * scale, x.dtype).to(tl.float32) * w_other, x.dtype).to(tl.float32)
        cos = tl.load(rot_ptr + pos * 2 * D + offs, mask=inside, other=0.0)
        signed_sin = tl.load(rot_ptr + pos * 2 * D + D + offs, mask=inside, other=0.0)
        out = cast(wide * cos + other * signed_sin, x.dtype)
        if head < N_HEAD:
            tl.store(q_out_ptr + token * N_HEAD * D + head * D + offs, out, mask=inside)
        else:
            dst = k_ptr + slot * stride_slot + (head - N_HEAD) * stride_head + pos * stride_pos
            tl.store(dst + offs, cast(out.to(tl.float32), k_ptr.dtype.element_ty), mask=inside)


def qk_rope_write_triton(qkv, slots, positions, rotation, q_weight, k_weight, eps, k_cache, v_cache, n_head, n_kv):
    """The kernel: one program per (token, head) of the queries, keys and values. slots and
    positions are [N] (a stride of 0 serves one value for every token)."""
    n, d = qkv.shape[0], k_cache.shape[-1]
    if k_cache.stride() != v_cache.stride() or k_cache.stride(-1) != 1:
        raise ValueError("the fused RoPE kernel needs K and V caches of one contiguous layout")
    qkv = qkv.contiguous()
    q = torch.empty(n, n_head, d, dtype=qkv.dtype, device=qkv.device)
    if n:
        weights = (q_weight, k_weight) if q_weight is not None else (qkv, qkv)  # unread without q/k-norm
        _qk_rope_write_kernel[(n, n_head + 2 * n_kv)](
            qkv, slots, positions, rotation.contiguous(), *weights, q, k_cache, v_cache,
            float(eps), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), slots.stride(0), positions.stride(0),
            N_HEAD=n_head, N_KV=n_kv, D=d, QK_NORM=q_weight is not None, BLOCK_D=triton.next_power_of_2(d), **launch_options(),
        )  # fmt: skip
    return q


@torch.library.custom_op("chorus::qk_rope_write", mutates_args=("k_cache", "v_cache"))
def qk_rope_write_op(
    qkv: Tensor, slots: Tensor, positions: Tensor, rotation: Tensor, q_weight: Optional[Tensor],
    k_weight: Optional[Tensor], eps: float, k_cache: Tensor, v_cache: Tensor, n_head: int, n_kv: int,
) -> Tensor:  # fmt: skip
    """The fused path's q/k-norm + RoPE + K/V write: one launch; returns the rotated queries."""
    args = (qkv, slots, positions, rotation, q_weight, k_weight, eps, k_cache, v_cache, n_head, n_kv)
    if runs_on(qkv.device.type) and qkv.dtype != torch.float64:
        return qk_rope_write_triton(*args)
    return qk_rope_write_reference(*args)


@qk_rope_write_op.register_fake
def _(qkv, slots, positions, rotation, q_weight, k_weight, eps, k_cache, v_cache, n_head, n_kv):
    return qkv.new_empty(qkv.shape[0], n_head, k_cache.shape[-1])
