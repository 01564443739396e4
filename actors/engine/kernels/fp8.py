"""FP8 storage options, never the default (docs/engine.md, "Lower precision"):

- FP8 K/V (`engine.kv_dtype=fp8`): the slot cache in float8 e4m3 (half of bf16's bytes: the
  K/V reads dominate S1-mini's step past ~500 keys). Values are saturated to +-448 and rounded
  to nearest on the write; the fused kernels read them back into float32. The fused path only.
- W8A8 FP8 products (`engine.fp8_weights=true`, for S2-Pro, whose 256-row products are
  compute-bound): each linear of the slow stack holds its weight in e4m3 with one scale per
  output row (amax / 448), and each call quantizes its input the same way per row; on CUDA the
  product runs as torch._scaled_mm with those row-wise scales, elsewhere it is computed from
  the dequantized values (the numerics, for tests).

`quantize_rows` / `dequantize` are the numerics both share; tests bound their error and the
logits' (tests/engine/test_fp8.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0  # the largest finite e4m3fn value


def to_fp8(x: Tensor) -> Tensor:
    """Saturating round-to-nearest cast (torch's cast gives NaN past the range)."""
    return x.float().clamp(-FP8_MAX, FP8_MAX).to(FP8)


def quantize_rows(x: Tensor) -> tuple[Tensor, Tensor]:
    """x [..., K] -> (e4m3 values, float32 scale per row [..., 1]) with x ~ values * scale."""
    amax = x.float().abs().amax(dim=-1, keepdim=True).clamp(min=1e-12)
    scale = amax / FP8_MAX
    return to_fp8(x.float() / scale), scale


def dequantize(values: Tensor, scale: Tensor) -> Tensor:
    return values.float() * scale


class Fp8Linear(nn.Module):
    """A linear layer with an e4m3 weight (a scale per output row) and e4m3 inputs (a scale per
    row, computed per call): W8A8 with float32 accumulation, output in the input's dtype."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        weight, scale = quantize_rows(linear.weight.detach())
        self.register_buffer("weight_fp8", weight)
        self.register_buffer("weight_scale", scale.reshape(1, -1))  # [1, N]
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach(), requires_grad=False)
        self.in_features, self.out_features = linear.in_features, linear.out_features

    def forward(self, x: Tensor) -> Tensor:
        flat = x.reshape(-1, x.shape[-1])
        values, scale = quantize_rows(flat)
        if x.is_cuda:
            out = torch._scaled_mm(
                values, self.weight_fp8.t(), scale_a=scale, scale_b=self.weight_scale, out_dtype=x.dtype, bias=self.bias
            )
        else:
            weight = dequantize(self.weight_fp8, self.weight_scale.reshape(-1, 1))
            out = F.linear(dequantize(values, scale), weight, None if self.bias is None else self.bias.float())
        return out.to(x.dtype).reshape(*x.shape[:-1], self.out_features)


def quantize_slow_linears(model: nn.Module) -> int:
    """Replace every linear of the slow stack's blocks with an Fp8Linear (the weights' bytes halve
    against bf16); the feed-forward's gate and up products are kept side by side as one
    (`_gate_up_fp8`, used by the fused stack). Returns how many products are FP8 now."""
    count = 0
    if any(isinstance(layer.attention.wo, Fp8Linear) for layer in model.layers):
        return 0  # quantized by an engine before
    for layer in model.layers:
        attention, ff = layer.attention, layer.feed_forward
        both = nn.Linear(ff.w1.in_features, 2 * ff.w1.out_features, bias=False, device="meta")
        both.weight = nn.Parameter(torch.cat([ff.w1.weight.detach(), ff.w3.weight.detach()]), requires_grad=False)
        ff.__dict__["_gate_up_fp8"] = Fp8Linear(both)
        for owner, name in ((attention, "wqkv"), (attention, "wo"), (ff, "w1"), (ff, "w3"), (ff, "w2")):
            setattr(owner, name, Fp8Linear(getattr(owner, name)))
            count += 1
    return count
