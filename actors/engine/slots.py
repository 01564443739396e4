"""How many KV slots an engine gets: engine.max_rows, or on a GPU with engine.memory_fraction the
slots that fit in the memory the device has left (as vLLM sizes its KV cache from
gpu_memory_utilization).

A slot costs its K/V (slow: 2 x layers x max_tokens x kv heads x head_dim, at one byte an element
with engine.kv_dtype=fp8; fast: one frame of the fast stack's) plus an allowance for the
activations a row can add to a step: a prefill chunk of `prefill_chunk` columns through one
block (the SwiGLU's two wide products, the residual stream, q/k/v) and a decode step's float32
logits. The budget is the share of the device's whole memory the engine may fill, less
everything already on it (the weights, the codec, other processes), so whatever was loaded
first is counted."""

from __future__ import annotations

from dataclasses import replace

import torch

from .architecture import ModelArchitecture
from .kernels.fp8 import FP8
from .settings import EngineConfig

# engine.kv_dtype -> the slow stack's K/V element type ("auto": the model's own)
KV_DTYPES = {"fp8": FP8}


def slow_kv_dtype(config: EngineConfig, model_dtype: torch.dtype) -> torch.dtype:
    return KV_DTYPES.get(config.kv_dtype, model_dtype)


def slot_kv_bytes(mc: ModelArchitecture, config: EngineConfig, element_size: int) -> int:
    """A slot's K/V: the slow stack's max_tokens (at engine.kv_dtype's size), the fast stack's frame."""
    slow_size = KV_DTYPES[config.kv_dtype].itemsize if config.kv_dtype in KV_DTYPES else element_size
    return config.max_tokens * mc.slow_kv_bytes_per_token(slow_size) + mc.fast_kv_bytes_per_frame(element_size)


def slot_bytes(mc: ModelArchitecture, config: EngineConfig, element_size: int) -> int:
    """Device bytes one slot costs: its K/V and the activations its row may add to a step."""
    kv = slot_kv_bytes(mc, config, element_size)
    width = 2 * mc.intermediate_size + 4 * mc.dim + (mc.n_head + 2 * mc.n_local_heads) * mc.head_dim
    prefill = min(config.prefill_chunk, config.max_tokens) * width * element_size
    logits = 4 * (mc.vocab_size + mc.num_codebooks * mc.codebook_size)
    return kv + prefill + logits


def slots_that_fit(free: int, total: int, fraction: float, per_slot: int) -> int:
    """Slots of `per_slot` bytes within `fraction` of `total` device bytes, of which `free` are
    free now (the rest is already taken)."""
    budget = free - (1.0 - fraction) * total
    return max(0, int(budget // per_slot))


def sized_to_memory(
    config: EngineConfig, mc: ModelArchitecture, device: torch.device, dtype: torch.dtype
) -> EngineConfig:
    """`config` with max_rows the slots that fit (at most max_rows) when engine.memory_fraction is
    set and the engine is on CUDA; unchanged otherwise. ValueError when not one slot fits."""
    if config.memory_fraction is None or device.type != "cuda":
        return config
    free, total = torch.cuda.mem_get_info(device)
    per_slot = slot_bytes(mc, config, torch.empty((), dtype=dtype).element_size())
    fits = slots_that_fit(free, total, config.memory_fraction, per_slot)
    if fits < 1:
        raise ValueError(
            f"engine.memory_fraction={config.memory_fraction} of {total / 2**30:.1f} GiB leaves no room for one KV "
            f"slot of max_tokens={config.max_tokens} ({per_slot / 2**20:.0f} MiB; {free / 2**30:.1f} GiB free): "
            "raise engine.memory_fraction or lower engine.max_tokens"
        )
    rows = min(config.max_rows, fits)
    buckets = None if config.decode_buckets is None else [b for b in config.decode_buckets if b <= rows] or None
    return replace(config, max_rows=rows, decode_buckets=buckets)
