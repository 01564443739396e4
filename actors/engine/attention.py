"""Attention over a slot's cached keys, with a row's numbers independent of its batch-mates.

A batch reads the keys its longest row needs; every other row's extra keys are masked. Masked
keys add exact zeros to a softmax, but a kernel's blocking over the key axis, or its division of
the work among threads, can still follow the batch's shape and change how a row's sums are
rounded. On CPU, masked attention (prefill, and the slow stack's decode step) therefore runs in
chorus's own C++ op, `chorus_attend::attend_rows` (attend_rows.cpp, built once per node like the
packed linear): each (row, kv head) pair is computed whole by one thread, reading its keys up to
its query's last allowed one in one fixed order, and the pairs are spread over torch's threads.
A row's result is then the row's alone, bit for bit, whatever its batch, the batch's key count
and the thread count. It replaced torch's fused kernel on one thread (below), which lost ~18% of
the `small` model's 32-row bf16 step at 2 threads (docs/performance.md, "CPU attention").

Where the op cannot serve (no compiler on the node, float64, head sizes it is not built for),
torch's fused kernel does, in fixed chunks of ATTEND_CHUNK keys at fixed positions (0, 128, 256,
...), on the calling thread alone (`one_thread`): each chunk is one call over the same key count
whatever the batch, and the chunks' results are merged by their log-sum-exp in position order;
a chunk a row does not reach merges with weight exactly 0. Other devices round the key count up
to ATTEND_BLOCK, the CPU kernel's block, as before.

On CPU both attentions are ops opaque to the compiler, so a compiled frame runs them exactly
as an eager one does. `chorus::attend_reached` (the slow stack's decode step) takes the slot's
whole cache and the key count to read as a tensor: a frame with static shapes cannot slice its
keys by the rows' lengths without a graph per length, and this keeps one graph whatever the
lengths, reading only the chunks its rows reach. `chorus::attend_visible` (the fast stack's)
keeps inductor from rewriting it differently at different batch sizes.
"""

from __future__ import annotations

import contextlib
import math
from pathlib import Path
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from .. import native
from ..modules import compute_dtype

ATTEND_CHUNK = 128  # CPU: keys per fused-kernel call
# other devices: a batch's key count is rounded up to this (the CPU kernel's key block, for
# which trailing, fully masked keys add exactly 0; not yet measured on a GPU)
ATTEND_BLOCK = 512


NATIVE_NAME = "chorus_attend"
NATIVE_SOURCE = Path(__file__).with_name("attend_rows.cpp")
HEAD_SIZES = (16, 32, 64, 128, 256)  # the head sizes attend_rows.cpp is built for
_native: dict = {}  # "loaded": whether the C++ op was built and loaded in this process


def load_native(build_root: Optional[Path] = None) -> bool:
    """Build attend_rows.cpp (actors/native.py: once per node, torch version and CPU kind, under
    build_root, default chorus's compile cache) and load it, once per process. False, with a
    warning, where it cannot be built: the fused kernel on one thread serves."""
    if "loaded" not in _native:
        _native["loaded"] = native.build(NATIVE_NAME, NATIVE_SOURCE, build_root)
        if _native["loaded"]:
            torch.library.register_fake(f"{NATIVE_NAME}::attend_rows", _like_queries)
    return _native["loaded"]


def rows_apart_serves(q: Tensor) -> bool:
    """Whether the C++ op computes this masked attention: CPU, float32 or bfloat16, a head size
    it is built for, and a build at hand."""
    return (
        q.device.type == "cpu"
        and q.dtype in (torch.float32, torch.bfloat16)
        and q.shape[-1] in HEAD_SIZES
        and load_native()
    )


def attend_length(needed: int, capacity: int, device_type: str) -> int:
    """Keys a batched attention call reads: `needed` rounded up to whole chunks (CPU) or blocks,
    within the slot's capacity, so a row's numbers never depend on how long its batch-mates are."""
    unit = ATTEND_CHUNK if device_type == "cpu" else ATTEND_BLOCK
    return min(capacity, -(-needed // unit) * unit)


def attend(q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor]) -> Tensor:
    """Grouped-query attention without materialising repeated K/V.

    q [B, H, T, D]; k, v [B, Hkv, L, D]; mask [B, T, L] bool (True = may attend), or None when
    every query sees every key. Query head h uses kv head h // (H / Hkv) (repeat_interleave
    semantics), so fold each group of query heads into the query length of its kv head."""
    if mask is None and q.device.type == "cpu":
        return attend_visible_op(q, k, v)
    if mask is not None and rows_apart_serves(q):
        return torch.ops.chorus_attend.attend_rows(q, k, v, mask)
    b, h, t, d = q.shape
    hkv = k.shape[1]
    group = h // hkv
    qg = q.reshape(b, hkv, group * t, d)
    m = None if mask is None else mask.unsqueeze(1)
    if m is not None and group > 1:
        m = m.repeat(1, 1, group, 1)
    if m is not None and q.device.type == "cpu":
        y = attend_in_chunks(qg, k, v, m)
    else:
        y = F.scaled_dot_product_attention(qg, k, v, attn_mask=m)
    return y.reshape(b, h, t, d)


def attend_visible(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Attention of q [B, H, T, D] over every key of k, v [B, Hkv, L, D] (CPU): the fast stack's
    decode step (one query column, every key of the frame visible, the same key count for every
    row). Plain matmul-softmax-matmul is ~3.5x faster than the fused kernel there, whose
    per-(row, head) set-up dominates at these sizes (32 rows x 10 keys: 0.13 vs 0.44 ms). As an
    op (`attend_visible_op`) a compiled frame cannot rewrite it: inductor turns this pattern into
    the fused kernel at some batch sizes and not at others (seen at 1 row against 3, bf16),
    which made a row's bfloat16 codes depend on its batch. In float32 whatever the cache's
    dtype (float64 stays): bfloat16 batched products of 4 keys gave some rows of 32 other
    results than the same rows alone (Sapphire Rapids; 4 of 160 rows in random trials, and one
    `small` row's codes from its fifth codebook on), float32 none at 1..10 keys."""
    b, h, t, d = q.shape
    hkv = k.shape[1]
    wide = compute_dtype(q.dtype)
    qg = q.reshape(b, hkv, (h // hkv) * t, d).to(wide)
    scores = torch.matmul(qg, k.to(wide).transpose(-1, -2)) * (1.0 / math.sqrt(d))
    return torch.matmul(torch.softmax(scores, dim=-1), v.to(wide)).reshape(b, h, t, d).to(q.dtype)


def attend_reached(q: Tensor, k: Tensor, v: Tensor, positions: Tensor, reach: Tensor) -> Tensor:
    """Attention of q [B, H, T, D] at `positions` [B, T] over keys 0..reach-1 of the slots' whole
    caches k, v [B, Hkv, S, D], masked to key position <= query position, as an eager frame
    attending to `reach` keys computes it. `reach` is a 0-d int64 tensor so that a compiled graph
    reads it at run time instead of specialising on it. Returns a new contiguous tensor."""
    n = int(reach)
    allowed = torch.arange(n, device=q.device).expand(q.shape[0], n).unsqueeze(1) <= positions.unsqueeze(2)
    return attend(q, k[:, :, :n], v[:, :, :n], allowed).contiguous()


def _like_queries(q: Tensor, *_) -> Tensor:
    return torch.empty_like(q, memory_format=torch.contiguous_format)


# ops a compiled frame calls as they are, opaque to inductor (packing.py defines another)
_LIBRARY = torch.library.Library("chorus", "FRAGMENT")
_LIBRARY.define("attend_visible(Tensor q, Tensor k, Tensor v) -> Tensor")
_LIBRARY.define("attend_reached(Tensor q, Tensor k, Tensor v, Tensor positions, Tensor reach) -> Tensor")
for _name, _kernel in (("attend_visible", attend_visible), ("attend_reached", attend_reached)):
    _LIBRARY.impl(_name, _kernel, "CPU")
    torch.library.register_fake(f"chorus::{_name}", _like_queries, lib=_LIBRARY)
attend_visible_op = torch.ops.chorus.attend_visible.default
attend_reached_op = torch.ops.chorus.attend_reached.default


@contextlib.contextmanager
def one_thread():
    """Run the enclosed torch CPU ops on the calling thread alone. torch's fused CPU attention
    divides a call's work among its threads by the batch's shape, and with more than one
    thread a row's last bits then depend on its batch-mates (torch 2.13 on an AMD EPYC with
    AVX-512 at 2 threads: ~3e-8 apart in float32, one row alone against the same row among
    others); on one thread they never do. OpenMP's thread count is the calling thread's own
    (MKL's, set with it, is the process's for that moment); setting it costs < 1 us. A CPU
    actor runs one torch thread by default (cluster.threads_per_actor), so this binds in tests
    and on actors given more."""
    threads = torch.get_num_threads()
    if threads == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def attend_in_chunks(q: Tensor, k: Tensor, v: Tensor, allowed: Tensor) -> Tensor:
    """Masked attention (CPU) chunk by chunk: q [B, Hkv, Q, D], k/v [B, Hkv, L, D], allowed
    [B, 1, Q, L] bool. Each chunk's normalised output and log-sum-exp come from the fused kernel;
    the output is sum_c w_c * out_c / sum_c w_c with w_c = exp(lse_c - max lse), summed in chunk
    order in float32 (float64 for float64), so a chunk past a row's keys (w = 0) leaves the row's
    result bit for bit as it is without that chunk."""
    bias = torch.zeros(allowed.shape, dtype=q.dtype, device=q.device).masked_fill_(~allowed, float("-inf"))
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    chunks = [slice(s, s + ATTEND_CHUNK) for s in range(0, k.shape[2], ATTEND_CHUNK)]
    with one_thread():
        parts = [flash(q, k[:, :, c], v[:, :, c], attn_mask=bias[..., c]) for c in chunks]
    if len(parts) == 1:
        return parts[0][0]  # the merge below would give it back unchanged
    # for a query with no key in a chunk the kernel gives lse 0 (and output 0): weigh it 0
    lses = [torch.where(allowed[..., c].any(-1), lse, float("-inf")) for c, (_, lse) in zip(chunks, parts)]
    top = lses[0]
    for lse in lses[1:]:
        top = torch.maximum(top, lse)
    weights, merged = None, None
    wide = torch.promote_types(q.dtype, torch.float32)
    for (out, _), lse in zip(parts, lses):
        w = torch.exp(lse - top).unsqueeze(-1)
        # NaN-proof: 0 * NaN would be NaN, should a kernel leave NaN where a query has no key
        term = torch.nan_to_num(out.to(wide)) * w
        weights = w if weights is None else weights + w
        merged = term if merged is None else merged + term
    return (merged / weights).to(q.dtype)
