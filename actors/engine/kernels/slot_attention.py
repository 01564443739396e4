"""Attention of N query tokens, each over its own slot's keys 0..length-1, for GPUs: no mask, no
key bucket. A decode step's rows (N = rows, length = position + 1), a packed prefill's tokens
of rows of any widths (causal: each token's length is its position + 1) and the fast stack's
codebook steps all run through it, so a captured step needs one graph per batch size, not one
per batch size and key count, and reads only the keys each row has.

Split-K (flash-decoding): the slot's capacity is cut into `splits` fixed ranges of keys; a
program per (token, kv head, range) attends its query heads (the kv head's group, grouped-query
attention) to the keys of its range that the token sees (0..its position), online softmax in float32, and writes
its normalised part and log-sum-exp; a second kernel merges the ranges in order. The ranges
depend on the slot capacity alone, so a token's numbers never depend on its batch-mates or their
lengths. With one range the first kernel writes the result itself (one launch).

`slot_attention_reference` is the eager form (a masked softmax per token), `slot_attention_triton`
the kernels, `slot_attention_op` the fused path's custom op.
"""

import math

import torch
from torch import Tensor

from .triton_shim import cast, runs_on, tl, triton

KEYS_PER_SPLIT = 256  # a range's keys at least (a slot of S keys is cut into ceil(S / this), <= 16)
MAX_SPLITS = 16
BLOCK_KEYS = 32  # keys per tile of the online softmax
TOKENS_PER_CALL = 64  # the reference's tokens per gather


def splits_for(capacity: int) -> int:
    """Key ranges of a slot of `capacity` keys: a power of two (the merge's block), <= MAX_SPLITS."""
    wanted = -(-capacity // KEYS_PER_SPLIT)
    return min(MAX_SPLITS, 1 << max(0, wanted - 1).bit_length())


def slot_attention_reference(q: Tensor, k_cache: Tensor, v_cache: Tensor, slots: Tensor, positions: Tensor) -> Tensor:
    """q [N, H, D]; caches [slots, Hkv, S, D]; slots, positions [N] int64 -> [N, H, D]: token i's
    query heads over keys 0..positions[i] of slot slots[i] (causal: a token sees its own key and
    those before; query head h reads kv head h // (H / Hkv))."""
    n = q.shape[0]
    if n > TOKENS_PER_CALL:  # a long packed prefill: bounded memory (each token's keys are gathered)
        parts = [slice(i, i + TOKENS_PER_CALL) for i in range(0, n, TOKENS_PER_CALL)]
        return torch.cat([slot_attention_reference(q[p], k_cache, v_cache, slots[p], positions[p]) for p in parts])
    h, d = q.shape[1:]
    hkv, s = k_cache.shape[1], k_cache.shape[2]
    keys, values = k_cache[slots], v_cache[slots]  # [N, Hkv, S, D]
    qg = q.view(n, hkv, h // hkv, d).float()
    scores = torch.matmul(qg, keys.float().transpose(-1, -2)) / math.sqrt(d)  # [N, Hkv, G, S]
    visible = torch.arange(s, device=q.device).unsqueeze(0) <= positions.unsqueeze(1)  # [N, S]
    scores = scores.masked_fill(~visible[:, None, None, :], float("-inf"))
    out = torch.matmul(torch.softmax(scores, dim=-1), values.float())
    return out.reshape(n, h, d).to(q.dtype)


@triton.jit
def _split_kernel(
    q_ptr, k_ptr, v_ptr, slot_ptr, pos_ptr, part_ptr, lse_ptr, out_ptr, scale, span,
    stride_slot, stride_head, stride_pos, slot_step, pos_step,
    N_HEAD: tl.constexpr, N_KV: tl.constexpr, D: tl.constexpr, GROUP: tl.constexpr, BLOCK_G: tl.constexpr,
    BLOCK_N: tl.constexpr, SPLITS: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    token = tl.program_id(0).to(tl.int64)
    kv = tl.program_id(1)
    split = tl.program_id(2)
    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, BLOCK_D)
    in_d = d < D
    in_group = g < GROUP
    q_rows = q_ptr + token * N_HEAD * D + (kv * GROUP + g)[:, None] * D + d[None, :]
    # float32 products (a bf16 x bf16 product is exact in float32; Triton's interpreter cannot
    # multiply bf16 tiles), accumulated in float32
    q = tl.load(q_rows, mask=in_group[:, None] & in_d[None, :], other=0.0).to(tl.float32)
    slot = tl.load(slot_ptr + token * slot_step)
    length = tl.load(pos_ptr + token * pos_step) + 1  # causal: keys 0..position
    lo = split * span
    hi = tl.minimum(lo + span, length)
    base = slot * stride_slot + kv * stride_head
    m = tl.full([BLOCK_G], float("-inf"), tl.float32)
    total = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    for start in range(lo, hi, BLOCK_N):
        n = start + tl.arange(0, BLOCK_N)
        visible = n < hi
        keys = tl.load(
            k_ptr + base + n[:, None] * stride_pos + d[None, :], mask=visible[:, None] & in_d[None, :], other=0.0
        )
        keys = keys.to(tl.float32)
        scores = tl.dot(q, tl.trans(keys), input_precision="ieee") * scale
        scores = tl.where(visible[None, :], scores, float("-inf"))
        m_new = tl.maximum(m, tl.max(scores, axis=1))
        alpha = tl.exp(m - m_new)
        p = tl.exp(scores - m_new[:, None])
        values = tl.load(
            v_ptr + base + n[:, None] * stride_pos + d[None, :], mask=visible[:, None] & in_d[None, :], other=0.0
        )
        acc = acc * alpha[:, None] + tl.dot(p, values.to(tl.float32), input_precision="ieee")
        total = total * alpha + tl.sum(p, axis=1)
        m = m_new
    heads = kv * GROUP + g
    if SPLITS == 1:
        out = acc / total[:, None]
        dst = out_ptr + token * N_HEAD * D + heads[:, None] * D + d[None, :]
        tl.store(dst, cast(out, out_ptr.dtype.element_ty), mask=in_group[:, None] & in_d[None, :])
    else:
        empty = total == 0.0  # no key of this token in the range: weight 0 in the merge
        out = tl.where(empty[:, None], 0.0, acc / tl.where(empty, 1.0, total)[:, None])
        lse = tl.where(empty, float("-inf"), m + tl.log(tl.where(empty, 1.0, total)))
        row = (token * N_HEAD + heads) * SPLITS + split
        tl.store(part_ptr + row[:, None] * D + d[None, :], out, mask=in_group[:, None] & in_d[None, :])
        tl.store(lse_ptr + row, lse, mask=in_group)


@triton.jit
def _merge_kernel(part_ptr, lse_ptr, out_ptr, D: tl.constexpr, SPLITS: tl.constexpr, BLOCK_D: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)  # token * H + head
    s = tl.arange(0, SPLITS)
    d = tl.arange(0, BLOCK_D)
    in_d = d < D
    lse = tl.load(lse_ptr + row * SPLITS + s)
    top = tl.max(lse, axis=0)
    w = tl.exp(lse - top)
    parts = tl.load(part_ptr + (row * SPLITS + s)[:, None] * D + d[None, :], mask=in_d[None, :], other=0.0)
    out = tl.sum(parts * w[:, None], axis=0) / tl.sum(w, axis=0)
    tl.store(out_ptr + row * D + d, cast(out, out_ptr.dtype.element_ty), mask=in_d)


def slot_attention_triton(q: Tensor, k_cache: Tensor, v_cache: Tensor, slots: Tensor, positions: Tensor) -> Tensor:
    n, h, d = q.shape
    hkv, capacity = k_cache.shape[1], k_cache.shape[2]
    if k_cache.stride() != v_cache.stride() or k_cache.stride(-1) != 1:
        raise ValueError("slot attention needs K and V caches of one layout, contiguous in the head dimension")
    splits = splits_for(capacity)
    span = triton.cdiv(triton.cdiv(capacity, splits), BLOCK_KEYS) * BLOCK_KEYS
    group = h // hkv
    q = q.contiguous()
    out = torch.empty_like(q)
    if n == 0:
        return out
    if splits > 1:
        part = torch.empty(n * h * splits, d, dtype=torch.float32, device=q.device)
        lse = torch.empty(n * h * splits, dtype=torch.float32, device=q.device)
    else:
        part = lse = out  # unused
    _split_kernel[(n, hkv, splits)](
        q, k_cache, v_cache, slots, positions, part, lse, out, 1.0 / math.sqrt(d), span,
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), slots.stride(0), positions.stride(0),
        N_HEAD=h, N_KV=hkv, D=d, GROUP=group, BLOCK_G=max(16, triton.next_power_of_2(group)), BLOCK_N=BLOCK_KEYS,
        SPLITS=splits, BLOCK_D=triton.next_power_of_2(d),
    )  # fmt: skip
    if splits > 1:
        _merge_kernel[(n * h,)](part, lse, out, D=d, SPLITS=splits, BLOCK_D=triton.next_power_of_2(d))
    return out


@torch.library.custom_op("chorus::slot_attention", mutates_args=())
def slot_attention_op(q: Tensor, k_cache: Tensor, v_cache: Tensor, slots: Tensor, positions: Tensor) -> Tensor:
    """The fused path's attention: one launch (two with more than one key range)."""
    if runs_on(q.device.type) and q.dtype != torch.float64:
        return slot_attention_triton(q, k_cache, v_cache, slots, positions)
    return slot_attention_reference(q, k_cache, v_cache, slots, positions)


@slot_attention_op.register_fake
def _(q, k_cache, v_cache, slots, positions):
    return torch.empty_like(q)
