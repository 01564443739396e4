"""The slot KV-cache manager: fixed `max_rows` slots x `max_tokens` positions, allocated once
per engine and reused; who owns which slot and how long each slot's sequence is; a bounded
cache of shared prompt prefixes (e.g. one reference voice used by many rows).

Every change of a slot's length or owner goes through a method here (allocate, release, move,
set_written, advance, restore): nothing outside writes them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from ..lru import LRU
from .architecture import ModelArchitecture
from .model import LayerKV


class CacheMismatchError(RuntimeError):
    pass


class SlotKVCache:
    def __init__(
        self,
        config: ModelArchitecture,
        max_rows: int,
        max_tokens: int,
        device: torch.device,
        dtype: torch.dtype,
        model_id: int,
        kv_dtype: Optional[torch.dtype] = None,
    ):
        if max_rows < 1 or max_tokens < 2:
            raise ValueError(f"the KV cache needs max_rows >= 1 and max_tokens >= 2, got {max_rows}, {max_tokens}")
        self.config, self.max_rows, self.max_tokens = config, max_rows, max_tokens
        self.device, self.dtype, self.model_id = device, dtype, model_id
        # the slow stack's K/V: the model's dtype, or FP8 (engine.kv_dtype; kernels/fp8.py)
        self.kv_dtype = kv_dtype or dtype
        c = config

        def alloc(slots, heads, length, head_dim, dtype=dtype):
            return LayerKV(
                k=torch.zeros(slots, heads, length, head_dim, device=device, dtype=dtype),
                v=torch.zeros(slots, heads, length, head_dim, device=device, dtype=dtype),
            )

        self.slow = [alloc(max_rows, c.n_local_heads, max_tokens, c.head_dim, self.kv_dtype) for _ in range(c.n_layer)]
        # The fast stack's cache lives for one frame (num_codebooks positions) and is indexed
        # by batch position, not slot: every decode step rebuilds it from position 0.
        self.fast = [
            alloc(max_rows, c.fast_n_local_heads, c.num_codebooks, c.fast_head_dim) for _ in range(c.n_fast_layer)
        ]
        self._lengths = [0] * max_rows
        self._owner: list[Optional[str]] = [None] * max_rows

    @property
    def lengths(self) -> tuple[int, ...]:
        """Positions written per slot (read-only: change them through the methods)."""
        return tuple(self._lengths)

    @property
    def owner(self) -> tuple[Optional[str], ...]:
        return tuple(self._owner)

    # -- contracts ---------------------------------------------------------------------
    def check_compatible(self, model_id: int, device: torch.device, dtype: torch.dtype) -> None:
        """A cache never serves another model, dtype or device."""
        if model_id != self.model_id:
            raise CacheMismatchError("this KV cache was allocated for a different model instance")
        if torch.device(device) != torch.device(self.device) or dtype != self.dtype:
            raise CacheMismatchError(
                f"this KV cache holds {self.dtype} on {self.device}, the model runs {dtype} on {device}"
            )

    # -- slots -------------------------------------------------------------------------
    def free_slots(self) -> int:
        return sum(o is None for o in self._owner)

    def allocate(self, owner: str) -> int:
        for slot, o in enumerate(self._owner):  # lowest free slot keeps live slots contiguous
            if o is None:
                self._owner[slot] = owner
                self._lengths[slot] = 0
                return slot
        raise RuntimeError("no free KV slot")

    def release(self, slot: int) -> None:
        self._owner[slot] = None
        self._lengths[slot] = 0

    def set_written(self, slot: int, length: int) -> None:
        """A prefill chunk wrote positions up to `length` of this slot."""
        if self._owner[slot] is None or not (0 <= length <= self.max_tokens):
            raise RuntimeError(f"slot {slot} ({self._owner[slot]}) cannot hold {length} positions")
        self._lengths[slot] = length

    def advance(self, slots, count: int = 1) -> None:
        """A decode step appended `count` positions to each of these slots."""
        for slot in slots:
            self._lengths[slot] += count

    def move(self, src: int, dst: int) -> None:
        """Move a live row's K/V (its first `length` positions) and ownership from slot `src`
        to the free slot `dst`."""
        if self._owner[dst] is not None or self._owner[src] is None:
            raise RuntimeError(f"cannot move slot {src} ({self._owner[src]}) onto slot {dst} ({self._owner[dst]})")
        n = self._lengths[src]
        for layer in self.slow:
            layer.k[dst, :, :n] = layer.k[src, :, :n]
            layer.v[dst, :, :n] = layer.v[src, :, :n]
        self._owner[dst], self._lengths[dst] = self._owner[src], n
        self.release(src)

    # -- sizes -------------------------------------------------------------------------
    @property
    def element_size(self) -> int:
        return torch.empty((), dtype=self.dtype).element_size()

    def bytes(self) -> dict:
        """Allocated bytes: slow 2 x n_layer x slots x max_tokens x kv_heads x head_dim x bytes,
        fast 2 x n_fast_layer x slots x num_codebooks x fast_kv_heads x fast_head_dim x bytes."""
        c, e = self.config, self.element_size
        slow_e = torch.empty((), dtype=self.kv_dtype).element_size()
        slow = 2 * c.n_layer * self.max_rows * self.max_tokens * c.n_local_heads * c.head_dim * slow_e
        fast = 2 * c.n_fast_layer * self.max_rows * c.num_codebooks * c.fast_n_local_heads * c.fast_head_dim * e
        return {"slow": slow, "fast": fast, "total": slow + fast}

    def allocated_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for layer in self.slow + self.fast for t in (layer.k, layer.v))


@dataclass
class _Prefix:
    tokens: np.ndarray
    layers: list[LayerKV]  # [n_kv, P, head_dim] per layer


class PrefixCache:
    """LRU of prompt-prefix K/V keyed by the caller's prefix key, verified against the exact
    prefix tokens so a stale or colliding key can never leak another prompt's K/V."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self._entries: LRU[_Prefix] = LRU(capacity)
        self.hits = 0
        self.misses = 0

    def lookup(self, key: str, tokens: np.ndarray) -> Optional[_Prefix]:
        entry = self._entries.get(key)
        if entry is None or entry.tokens.shape != tokens.shape or not np.array_equal(entry.tokens, tokens):
            self.misses += 1
            return None
        self.hits += 1
        return entry

    def store(self, key: str, tokens: np.ndarray, cache: SlotKVCache, slot: int) -> None:
        if self.capacity <= 0:
            return
        n = tokens.shape[1]
        layers = [LayerKV(k=l.k[slot, :, :n].clone(), v=l.v[slot, :, :n].clone()) for l in cache.slow]
        self._entries.put(key, _Prefix(tokens=tokens.copy(), layers=layers))

    @staticmethod
    def restore(entry: _Prefix, cache: SlotKVCache, slot: int) -> int:
        """Copy a stored prefix's K/V into a freshly allocated slot; returns its length."""
        n = entry.tokens.shape[1]
        for src, dst in zip(entry.layers, cache.slow):
            dst.k[slot, :, :n] = src.k
            dst.v[slot, :, :n] = src.v
        cache.set_written(slot, n)
        return n

    def clear(self) -> None:
        self._entries = LRU(self.capacity)

    def bytes(self) -> int:
        return sum(l.k.numel() * l.k.element_size() * 2 for e in self._entries.values() for l in e.layers)

    def __len__(self) -> int:
        return len(self._entries)
