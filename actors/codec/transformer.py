"""Window-limited causal transformer used inside the codec.

Numerics follow upstream's WindowLimitedTransformer: pre-norm blocks with
LayerScale, and the building blocks the dual-AR model shares (actors/modules.py):
RMSNorm in float32, SwiGLU feed-forward, RoPE on adjacent pairs whose cos/sin
table is rounded to bfloat16.

Unlike upstream we never allocate block_size x block_size masks: masks are
built for the actual sequence, and long sequences attend block by block so
memory stays O(T * (block + window)) rather than O(T^2).
"""

from __future__ import annotations

import threading
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from ..modules import FeedForward, RMSNorm, apply_rope, rope_rotation
from .config import TransformerConfig

# Sequences up to this length attend in one call; longer ones go through
# query blocks of this size (keys limited to what the window can see).
ATTENTION_BLOCK = 1024


class _RopeTables:
    """bfloat16 cos/sin tables, grown on demand and shared by every module with
    the same (head_dim, base, device). Positions restart at 0 on every call,
    so a longer table's prefix is the shorter table."""

    def __init__(self) -> None:
        self._tables: dict[tuple, torch.Tensor] = {}
        self._lock = threading.Lock()

    def get(self, length: int, head_dim: int, base: float, device: torch.device) -> torch.Tensor:
        key = (head_dim, float(base), str(device))
        with self._lock:
            table = self._tables.get(key)
            if table is None or table.shape[0] < length:
                # Grow geometrically so a stream of slightly longer inputs does
                # not rebuild the table each time.
                size = max(length, 2 * (0 if table is None else table.shape[0]), 256)
                table = rope_rotation(size, head_dim, base, device)
                self._tables[key] = table
        return table[:length]

    def held(self) -> list[torch.Tensor]:
        """The tables as they are now (a CUDA graph that read them keeps them alive)."""
        with self._lock:
            return list(self._tables.values())


ROPE_TABLES = _RopeTables()


def window_mask(
    query_start: int,
    query_end: int,
    key_start: int,
    key_end: int,
    window: Optional[int],
    device: torch.device,
) -> torch.Tensor:
    """Boolean [queries, keys] mask: query i sees key j iff i - window < j <= i."""
    queries = torch.arange(query_start, query_end, device=device)[:, None]
    keys = torch.arange(key_start, key_end, device=device)[None, :]
    visible = keys <= queries
    if window is not None:
        visible &= keys > queries - window
    return visible


class LayerScale(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.gamma = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gamma


class CodecAttention(nn.Module):
    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.n_head = config.n_head
        self.kv_heads = config.kv_heads
        self.head_dim = config.head_dim
        self.rope_base = config.rope_base
        self.window = config.window_size
        self.wqkv = nn.Linear(config.dim, (config.n_head + 2 * config.kv_heads) * config.head_dim, bias=False)
        self.wo = nn.Linear(config.n_head * config.head_dim, config.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, _ = x.shape
        q_width = self.n_head * self.head_dim
        kv_width = self.kv_heads * self.head_dim
        q, k, v = self.wqkv(x).split([q_width, kv_width, kv_width], dim=-1)
        q = q.view(batch, length, self.n_head, self.head_dim)
        k = k.view(batch, length, self.kv_heads, self.head_dim)
        v = v.view(batch, length, self.kv_heads, self.head_dim)
        table = ROPE_TABLES.get(length, self.head_dim, self.rope_base, x.device)
        q = apply_rope(q, table).transpose(1, 2)
        k = apply_rope(k, table).transpose(1, 2)
        v = v.transpose(1, 2)
        if self.kv_heads != self.n_head:
            repeat = self.n_head // self.kv_heads
            k = k.repeat_interleave(repeat, dim=1)
            v = v.repeat_interleave(repeat, dim=1)
        y = windowed_attention(q, k, v, self.window)
        return self.wo(y.transpose(1, 2).reshape(batch, length, q_width))


def windowed_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    window: Optional[int],
    block: Optional[int] = None,
) -> torch.Tensor:
    """Causal (optionally window-limited) attention over [B, H, T, D]."""
    block = ATTENTION_BLOCK if block is None else block
    length = q.shape[2]
    if length <= block:
        mask = window_mask(0, length, 0, length, window, q.device)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    pieces = []
    for start in range(0, length, block):
        end = min(start + block, length)
        key_start = 0 if window is None else max(0, start - window + 1)
        mask = window_mask(start, end, key_start, end, window, q.device)
        pieces.append(
            F.scaled_dot_product_attention(
                q[:, :, start:end], k[:, :, key_start:end], v[:, :, key_start:end], attn_mask=mask
            )
        )
    return torch.cat(pieces, dim=2)


class CodecTransformerBlock(nn.Module):
    def __init__(self, config: TransformerConfig):
        super().__init__()
        # Registration order follows upstream so state dicts list keys alike.
        self.attention = CodecAttention(config)
        self.feed_forward = FeedForward(config.dim, config.intermediate_size)
        self.ffn_norm = RMSNorm(config.dim, config.norm_eps)
        self.attention_norm = RMSNorm(config.dim, config.norm_eps)
        self.attention_layer_scale = LayerScale(config.dim)
        self.ffn_layer_scale = LayerScale(config.dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + self.attention_layer_scale(self.attention(self.attention_norm(x)))
        return h + self.ffn_layer_scale(self.feed_forward(self.ffn_norm(h)))


class WindowLimitedTransformer(nn.Module):
    """[B, C, T] -> [B, C, T]; positions restart at 0 on every call."""

    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.config = config
        self.layers = nn.ModuleList(CodecTransformerBlock(config) for _ in range(config.n_layer))
        self.norm = RMSNorm(config.dim, config.norm_eps)
        projected = config.outer_dim != config.dim
        self.input_proj = nn.Linear(config.outer_dim, config.dim) if projected else nn.Identity()
        self.output_proj = nn.Linear(config.dim, config.outer_dim) if projected else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.input_proj(x.transpose(1, 2))
        for layer in self.layers:
            h = layer(h)
        return self.output_proj(self.norm(h)).transpose(1, 2)
