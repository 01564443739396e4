"""Building blocks shared by the dual-AR model (actors/engine/model.py) and the codec's
transformer (actors/codec/transformer.py), with upstream fish-speech's numerics (see
docs/architecture.md, "Numerics"). Both import torch; nothing here knows either model."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """Norms and RoPE run in float32 (upstream), or float64 when the whole model does."""
    return torch.float64 if dtype == torch.float64 else torch.float32


class RMSNorm(nn.Module):
    """Upstream's RMSNorm: normalise in float32, cast back to the input dtype, then times the
    weight (in that order: the cast before the weight is part of the numerics)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        wide = x.to(compute_dtype(x.dtype))
        normed = wide * torch.rsqrt(torch.mean(wide * wide, dim=-1, keepdim=True) + self.eps)
        return normed.to(x.dtype) * self.weight


def rope_table(n_positions: int, head_dim: int, base: float, device=None) -> Tensor:
    """[n_positions, head_dim // 2, 2] (cos, sin), computed in float32 as upstream does (unit
    complex numbers from torch.polar) and rounded to bfloat16, as upstream stores the table
    even for float32 runs: the rounding is part of the numerics (~1e-2 on the dual-AR model's
    logits, ~1e-4..1e-3 on the codec's outputs if skipped). A table is an ordinary tensor even
    when built under inference mode, so it can be cached and reused by any later call."""
    with torch.inference_mode(False), torch.no_grad():
        exponents = torch.arange(0, head_dim, 2, device=device)[: head_dim // 2].float() / head_dim
        angles = torch.outer(torch.arange(n_positions, device=device), 1.0 / (base**exponents))
        rotations = torch.polar(torch.ones_like(angles), angles)
        return torch.stack([rotations.real, rotations.imag], dim=-1).to(torch.bfloat16)


def rope_rotation(n_positions: int, head_dim: int, base: float, device=None) -> Tensor:
    """upstream's table (`rope_table`, bf16-rounded) laid out for `apply_rope`: [n_positions,
    2, head_dim] float32, row 0 the cosine of each pair twice (cos, cos), row 1 its sine with
    the sign each element of the pair takes (-sin, sin). The same values as the table, so the
    rotation is unchanged; the layout lets it run as two contiguous products and a sum."""
    table = rope_table(n_positions, head_dim, base, device).float()
    cos, sin = table[..., 0], table[..., 1]
    return torch.stack([torch.stack([cos, cos], dim=-1), torch.stack([-sin, sin], dim=-1)], dim=1).flatten(-2)


def apply_rope(x: Tensor, rotation: Tensor) -> Tensor:
    """Rotate ADJACENT pairs (x[2i], x[2i+1]), not the two halves of the head, in float32:
    (even*cos - odd*sin, odd*cos + even*sin), as upstream computes it (x*c + swapped*s is the
    same products and the same sums, bit for bit, in four whole-tensor passes instead of ten
    strided ones).

    x: [B, T, H, D]; rotation (`rope_rotation` rows): [B, T, 2, D] (each row its own positions)
    or [T, 2, D] (every row at the same positions)."""
    wide = x.to(compute_dtype(x.dtype))
    rotation = rotation.to(wide.dtype)
    if rotation.dim() == 3:
        rotation = rotation.unsqueeze(0)
    cos, signed_sin = rotation[:, :, 0].unsqueeze(2), rotation[:, :, 1].unsqueeze(2)  # [B, T, 1, D]
    swapped = wide.unflatten(-1, (-1, 2)).flip(-1).flatten(-2)  # (odd, even) of every pair
    return (wide * cos + swapped * signed_sin).to(x.dtype)


class FeedForward(nn.Module):
    """SwiGLU: w2(silu(w1 x) * w3 x), no biases."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


def uninitialised_embedding(rows: int, dim: int) -> nn.Embedding:
    """An embedding whose table is left uninitialised, for models that are built on the meta
    device and then filled from a checkpoint (or by a deterministic random writer).
    nn.Embedding's own random init would, on the meta device, import torch._dynamo: about
    1.4 s of every actor's start-up for each of the model and the codec."""
    return nn.Embedding(rows, dim, _weight=torch.empty(rows, dim))
