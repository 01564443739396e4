"""The fused forward of a stack of transformer blocks (the slow stack or the fast stack) over N
tokens, each at its own slot and position, with the K/V cache: per block 1 norm (the previous
block's residual add folded in), the q/k/v product, 1 q/k-norm + RoPE + K/V write, the slot
attention (1-2), the output product, 1 add + norm, the gate and up products, 1 SiLU x mul, the
down product: ~10 launches where the eager block makes ~44. The block's numbers are the eager
block's op for op (docs/architecture.md §5.3-5.5) but for the attention's and the norms'
summation order, which the kernels' tests bound.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .norm import add_rms_norm_op, add_rms_norm_reference, rms_norm_op
from .rope import qk_rope_write_op, qk_rope_write_reference
from .slot_attention import slot_attention_op, slot_attention_reference
from .swiglu import silu_mul_op, silu_mul_reference


@dataclass
class TokenView:
    """Where N = B x T tokens read and write K/V: per token its slot and position (it sees keys
    0..position: causal), int64 [N]; the stack's RoPE table [P, 2, D] (`rope_rotation`);
    which ops run the regions ("fused": the custom ops; "compiled": their references compiled)."""

    slots: Tensor
    positions: Tensor
    table: Tensor
    path: str = "fused"


FUSED_OPS = SimpleNamespace(
    rms_norm=rms_norm_op, add_rms_norm=add_rms_norm_op, qk_rope_write=qk_rope_write_op,
    slot_attention=slot_attention_op, silu_mul=silu_mul_op,
)  # fmt: skip
_COMPILED: list = []


def compiled_ops() -> SimpleNamespace:
    """The regions' references compiled by inductor, once per process: each compiled function
    serves every layer of both stacks (a graph per input shape: the slow and fast widths, the
    batch sizes, dynamic after the second). The attention stays its eager reference."""
    if not _COMPILED:

        def rms_norm(x, weight, eps):
            return add_rms_norm_reference(x, None, weight, eps)[1]

        _COMPILED.append(
            SimpleNamespace(
                rms_norm=torch.compile(rms_norm, fullgraph=True, dynamic=True),
                add_rms_norm=torch.compile(add_rms_norm_reference, fullgraph=True, dynamic=True),
                qk_rope_write=torch.compile(qk_rope_write_reference, fullgraph=True, dynamic=True),
                slot_attention=slot_attention_reference,
                silu_mul=torch.compile(silu_mul_reference, fullgraph=True, dynamic=True),
            )
        )
    return _COMPILED[0]


def _ops(view: TokenView) -> SimpleNamespace:
    return compiled_ops() if view.path == "compiled" else FUSED_OPS


def fused_attention(attn: nn.Module, x: Tensor, cache, view: TokenView) -> Tensor:
    b, t, _ = x.shape
    qkv = attn.wqkv(x).view(b * t, -1)
    q_weight = attn.q_norm.weight if attn.qk_norm else None
    k_weight = attn.k_norm.weight if attn.qk_norm else None
    eps = attn.q_norm.eps if attn.qk_norm else 0.0
    ops = _ops(view)
    q = ops.qk_rope_write(
        qkv, view.slots, view.positions, view.table, q_weight, k_weight, eps, cache.k, cache.v, attn.n_head, attn.n_kv
    )
    y = ops.slot_attention(q, cache.k, cache.v, view.slots, view.positions)
    return attn.wo(y.view(b, t, attn.n_head * attn.head_dim))


def fused_layers(layers: nn.ModuleList, x: Tensor, caches: list, view: TokenView) -> tuple[Tensor, Tensor]:
    """Run the blocks; returns (the residual stream before the last block's output is added, that
    output): the caller folds the last add into the stack's final norm (`finish`)."""
    delta: Optional[Tensor] = None
    ops = _ops(view)
    for layer, cache in zip(layers, caches):
        norm = layer.attention_norm
        if delta is None:
            normed = ops.rms_norm(x, norm.weight, norm.eps)
        else:
            x, normed = ops.add_rms_norm(x, delta, norm.weight, norm.eps)
        attended = fused_attention(layer.attention, normed, cache, view)
        x, normed = ops.add_rms_norm(x, attended, layer.ffn_norm.weight, layer.ffn_norm.eps)
        ff = layer.feed_forward
        fp8 = ff.__dict__.get("_gate_up_fp8")  # W8A8 products (kernels/fp8.py)
        gate_up = fp8(normed) if fp8 is not None else F.linear(normed, gate_up_weight(ff))
        delta = ff.w2(ops.silu_mul(gate_up))
    return x, delta


def gate_up_weight(ff: nn.Module) -> Tensor:
    """The feed-forward's gate (w1) and up (w3) weights side by side, [2F, dim], made once and
    kept on the module as a plain tensor (not a submodule: CPU packing leaves it alone); w1 and
    w3 then hold views of it, so it costs no memory. One product instead of two."""
    both = ff.__dict__.get("_gate_up")
    w1, w3 = ff.w1.weight, ff.w3.weight
    if both is None or both.device != w1.device or both.dtype != w1.dtype:
        with torch.inference_mode(False), torch.no_grad():
            both = torch.cat([w1.detach(), w3.detach()])
            ff.w1.weight = nn.Parameter(both[: w1.shape[0]], requires_grad=False)
            ff.w3.weight = nn.Parameter(both[w1.shape[0] :], requires_grad=False)
        ff.__dict__["_gate_up"] = both
    return both


def finish(x: Tensor, delta: Tensor, norm: nn.Module, path: str = "fused") -> tuple[Tensor, Tensor]:
    """(x + delta, its norm): the stack's last residual add and its final norm, one launch."""
    ops = compiled_ops() if path == "compiled" else FUSED_OPS
    return ops.add_rms_norm(x, delta, norm.weight, norm.eps)
