"""Batched sampling with per-row settings and per-row random streams.

Order (upstream fish-speech): [repetition penalty] -> top-p over the softmax of the logits
-> top-k -> temperature -> softmax -> one seeded draw. Greedy rows (temperature 0, or top_k 1)
take the argmax, ties to the lowest index. Every draw consumes exactly one uniform from that
row's own CPU `torch.Generator`, so a row's output never depends on which rows share its batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class RowSampling:
    """Per-row settings stacked as tensors for one batched call (rows in batch order)."""

    temperature: Tensor  # [B] float32
    top_p: Tensor  # [B] float32
    top_k: Tensor  # [B] int64, 0 = off
    greedy: Tensor  # [B] bool

    @staticmethod
    def stack(temperature: Sequence[float], top_p: Sequence[float], top_k: Sequence[int], device) -> RowSampling:
        t = torch.tensor(list(temperature), dtype=torch.float32, device=device)
        k = torch.tensor(list(top_k), dtype=torch.int64, device=device)
        return RowSampling(
            temperature=t,
            top_p=torch.tensor(list(top_p), dtype=torch.float32, device=device),
            top_k=k,
            greedy=(t == 0) | (k == 1),
        )

    def select(self, index: Tensor) -> RowSampling:
        return RowSampling(self.temperature[index], self.top_p[index], self.top_k[index], self.greedy[index])


def apply_repetition_penalty(logits: Tensor, history: Tensor, penalty: Tensor) -> Tensor:
    """S1's penalty: logits of ids in `history` [B, W] (-1 = empty) become l*p if negative
    else l/p. penalty [B]; rows with penalty 1 are unchanged."""
    b, v = logits.shape
    index = torch.where(history >= 0, history, torch.full_like(history, v))
    seen = torch.zeros(b, v + 1, dtype=torch.bool, device=logits.device)
    seen.scatter_(1, index, True)
    seen = seen[:, :v]
    p = penalty.unsqueeze(1).to(logits.dtype)
    penalised = torch.where(logits < 0, logits * p, logits / p)
    return torch.where(seen, penalised, logits)


def filtered_probs(logits: Tensor, s: RowSampling) -> Tensor:
    """The distribution each non-greedy row samples from: [B, V] float32, zeros outside the
    kept set, renormalised over it."""
    logits = logits.float()
    v = logits.shape[-1]
    k = torch.where(s.top_k > 0, s.top_k, torch.full_like(s.top_k, v)).clamp(max=v)
    width = int(k.max())
    # only the `width` best ids can survive top-k: rank those instead of sorting all V (the
    # cumulative softmax still normalises over every id, as top-p on the raw softmax must)
    if width < v:
        sorted_logits, order = torch.topk(logits, width, dim=-1, sorted=True)
        probs = torch.exp(sorted_logits - torch.logsumexp(logits, dim=-1, keepdim=True))
    else:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True, stable=True)
        probs = torch.softmax(sorted_logits, dim=-1)
    cum = torch.cumsum(probs, dim=-1)
    rank = torch.arange(width, device=logits.device).unsqueeze(0)
    remove_sorted = (cum > s.top_p.unsqueeze(1)) | (rank >= k.unsqueeze(1))
    remove_sorted[:, 0] = False  # always keep the best candidate
    remove = torch.ones_like(logits, dtype=torch.bool).scatter_(1, order, remove_sorted)
    temperature = torch.clamp(s.temperature, min=1e-5).unsqueeze(1)
    scaled = torch.where(remove, torch.full_like(logits, float("-inf")), logits) / temperature
    return torch.softmax(scaled, dim=-1)


def draw(probs: Tensor, uniforms: Tensor) -> Tensor:
    """Inverse-CDF draw, one uniform in [0, 1) per row. The CDF is accumulated in float64 and
    searched with right=True, so a zero-probability id is never returned (not even for u=0,
    the trap of the reference's exponential trick)."""
    cdf = torch.cumsum(probs.double(), dim=-1)
    target = uniforms.double().unsqueeze(1) * cdf[:, -1:]
    return torch.searchsorted(cdf, target, right=True).squeeze(1)


def uniforms_for(generators: Sequence[torch.Generator], device) -> Tensor:
    """One uniform per row from its own CPU generator (device independent, batch independent)."""
    # float32 uniforms (u <= 1 - 2^-24): u * total in float64 stays strictly below the total,
    # so `draw` always lands on an id with positive probability.
    u = torch.cat([torch.rand(1, generator=g, dtype=torch.float32) for g in generators])
    return u.to(device)


def sample(logits: Tensor, s: RowSampling, generators: Sequence[torch.Generator]) -> Tensor:
    """ids [B] (int64) from logits [B, V]. Greedy rows consume no randomness."""
    out = torch.argmax(logits, dim=-1)
    sampled = (~s.greedy).nonzero().squeeze(1)
    if sampled.numel():
        rows = sampled.tolist()
        probs = filtered_probs(logits[sampled], s.select(sampled))
        u = uniforms_for([generators[r] for r in rows], logits.device)
        out[sampled] = draw(probs, u)
    return out
