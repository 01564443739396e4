"""Batched sampling with per-row settings and per-row random streams, entirely on the device.

Order (upstream fish-speech): [repetition penalty] -> top-p over the softmax of the logits
-> top-k -> temperature -> softmax -> one draw. Greedy rows (temperature 0, or top_k 1) take
the argmax, ties to the lowest index. Nothing here reads a value back to the host, so a whole
decode frame can run as one captured graph.

Random numbers are counter-based: the uniform of a row's draw is a hash of (the row's seed,
its frame index, the draw's index within the frame), computed with 32-bit integer arithmetic
held in int64 tensors (every product stays below 2^63, so no platform's overflow rules are
involved). A row's stream therefore depends only on its request, never on which rows share
its batch, its slot, the thread count or the device, and it needs no host call per draw.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor

_MASK32 = 0xFFFFFFFF
# multipliers of a well-mixing 32-bit integer hash (xorshift-multiply, two rounds); both are
# below 2^31, so a 32-bit value times either stays inside int64
_MUL_A = 0x21F0AAAD
_MUL_B = 0x735A2D97
# draws of one frame: 0 = main token, 1 = its repetition-aware redraw, 1 + k = codebook k
DRAW_MAIN = 0
DRAW_RAS = 1
DRAWS_PER_FRAME = 64  # room for up to 62 codebooks in the counter


def _mix32(x):
    """The hash on int64 tensors or Python ints holding values in [0, 2^32)."""
    x = x ^ (x >> 16)
    x = (x * _MUL_A) & _MASK32
    x = x ^ (x >> 15)
    x = (x * _MUL_B) & _MASK32
    return x ^ (x >> 15)


def seed_keys(seed: int) -> tuple[int, int]:
    """A row's two 32-bit stream keys from its (any-size) integer seed; computed on the host
    once per request, at admission."""
    seed = int(seed) & 0xFFFFFFFFFFFFFFFF
    low, high = seed & _MASK32, seed >> 32
    key1 = _mix32(low ^ _mix32(high ^ 0x9E3779B9))
    key2 = _mix32(key1 ^ 0x85EBCA6B)
    return key1, key2


def counter_uniforms(key1: Tensor, key2: Tensor, frame: Tensor, draw_index) -> Tensor:
    """float32 uniforms in [0, 1 - 2^-24]: int64 key1, key2, frame [B] and a draw index (an
    int -> [B]; an int64 tensor [D] -> [B, D], every draw of a frame in one go). 24 bits, so
    u * total (float64) in `draw` stays strictly below the total."""
    if isinstance(draw_index, Tensor):
        key1, key2, frame = key1.unsqueeze(1), key2.unsqueeze(1), frame.unsqueeze(1)
    counter = (frame * DRAWS_PER_FRAME + draw_index) & _MASK32
    h = _mix32(_mix32(counter ^ key1) ^ key2)
    return (h >> 8).to(torch.float32) * (1.0 / (1 << 24))


@dataclass
class RowSampling:
    """Per-row settings as tensors for one batched call (rows in batch order)."""

    temperature: Tensor  # [B] float32
    top_p: Tensor  # [B] float32
    top_k: Tensor  # [B] int64, 0 = off
    greedy: Optional[Tensor]  # [B] bool (None where the sampling kernels decide it themselves)

    @staticmethod
    def stack(temperature, top_p, top_k, device) -> RowSampling:
        """From Python lists (tests and one-off callers; the engine keeps these per slot)."""
        t = torch.tensor(list(temperature), dtype=torch.float32, device=device)
        k = torch.tensor(list(top_k), dtype=torch.int64, device=device)
        p = torch.tensor(list(top_p), dtype=torch.float32, device=device)
        return RowSampling(temperature=t, top_p=p, top_k=k, greedy=(t == 0) | (k == 1))


def apply_repetition_penalty(logits: Tensor, history: Tensor, penalty: Tensor) -> Tensor:
    """S1's penalty: logits of ids in `history` [B, W] (-1 = nothing) become l*p if negative
    else l/p. penalty [B]; a row with penalty 1 keeps its logits bit for bit (l*1 = l/1 = l)."""
    b, v = logits.shape
    index = torch.where(history >= 0, history, torch.full_like(history, v))
    seen = torch.zeros(b, v + 1, dtype=torch.bool, device=logits.device)
    seen.scatter_(1, index, True)
    p = penalty.unsqueeze(1).to(logits.dtype)
    penalised = torch.where(logits < 0, logits * p, logits / p)
    return torch.where(seen[:, :v], penalised, logits)


def ranked_probs(logits: Tensor, s: RowSampling, width: Optional[int] = None) -> tuple[Tensor, Tensor]:
    """What each non-greedy row samples from, in rank order: (probs [B, width] float32, zeros
    outside the kept set and renormalised over it; the ids they belong to [B, width]). Top-p
    on the softmax of all V raw logits, then top-k, then temperature. `width` (a host-side
    int, >= every row's top_k, or V when a row has top_k off) bounds how many best ids are
    ranked, so the tensors are [B, width], not [B, V]; None ranks all V."""
    logits = logits.float()
    v = logits.shape[-1]
    width = v if width is None else min(int(width), v)
    if width < v:
        ranked, order = torch.topk(logits, width, dim=-1, sorted=True)
    else:
        ranked, order = torch.sort(logits, dim=-1, descending=True, stable=True)
    k = torch.where(s.top_k > 0, s.top_k, torch.full_like(s.top_k, v)).clamp(max=width)
    # the same arithmetic whatever the width, so a row's numbers never depend on its batch
    cum = torch.cumsum(torch.exp(ranked - torch.logsumexp(logits, dim=-1, keepdim=True)), dim=-1)
    rank = torch.arange(width, device=logits.device).unsqueeze(0)
    # the best id always stays, even when it alone exceeds top_p
    remove = ((cum > s.top_p.unsqueeze(1)) | (rank >= k.unsqueeze(1))) & (rank > 0)
    temperature = torch.clamp(s.temperature, min=1e-5).unsqueeze(1)
    return torch.softmax(torch.where(remove, float("-inf"), ranked) / temperature, dim=-1), order


def filtered_probs(logits: Tensor, s: RowSampling, width: Optional[int] = None) -> Tensor:
    """`ranked_probs` put back in id order: [B, V], zeros outside the kept set."""
    probs, order = ranked_probs(logits, s, width)
    return torch.zeros(logits.shape, dtype=torch.float32, device=logits.device).scatter_(1, order, probs)


def draw(probs: Tensor, uniforms: Tensor) -> Tensor:
    """Inverse-CDF draw, one uniform in [0, 1) per row. The CDF is accumulated in float64 and
    searched with right=True, so a zero-probability id is never returned (not even for u=0,
    the trap of the reference's exponential trick)."""
    cdf = torch.cumsum(probs.double(), dim=-1)
    target = uniforms.double().unsqueeze(1) * cdf[:, -1:]
    return torch.searchsorted(cdf, target, right=True).squeeze(1).clamp_(max=probs.shape[-1] - 1)


def sample(logits: Tensor, s: RowSampling, uniforms: Tensor, width: Optional[int] = None) -> Tensor:
    """ids [B] (int64) from logits [B, V]: the argmax for greedy rows, a draw with the row's
    uniform for the others. Both are computed for every row and selected without a sync.

    The draw works in the ranked space of the `width` best ids (top-k keeps no more): top-p
    on the softmax of all V raw logits, top-k, temperature, a softmax over the kept ids, and
    the inverse CDF over them in rank order (`ranked_probs`), so its tensors are [B, width],
    not [B, V]."""
    probs, order = ranked_probs(logits, s, width)
    drawn = order.gather(1, draw(probs, uniforms).unsqueeze(1)).squeeze(1)
    return torch.where(s.greedy, torch.argmax(logits, dim=-1), drawn)
