"""Prefill on the fused path (engine.kernels=fused): one call per round for every admitted row's
chunk, whatever their widths, packed into one token sequence (each token with its slot and
position; kernels/slot_attention.py attends each to its own slot's keys), padded to a token-count
bucket; on CUDA with graphs each bucket's call is captured once and replayed after.

The eager path (runner.py) batches only chunks of equal width: padding a row would change the
query count of its masked attention, and with it the row's float32 numbers; here no row is
padded, only the sequence's tail, whose tokens write junk where nothing reads it (position
max_tokens - 1 of a slot, overwritten before any row reads it) and whose outputs are dropped.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch

# the smallest token-count bucket, and the largest whose call is captured as a CUDA graph (a
# larger one runs eagerly: its launches are a small share of its work)
SMALLEST_TOKEN_BUCKET = 16
LARGEST_GRAPHED_BUCKET = 4096


def token_bucket(n: int) -> int:
    """The token count a packed call of n tokens is padded to: the next power of two, >= 16."""
    return max(SMALLEST_TOKEN_BUCKET, 1 << max(0, n - 1).bit_length())


class PackedPrefill:
    def __init__(self, model, cache, max_tokens: int, device: torch.device, graphs=None, path: str = "fused"):
        self.model, self.cache, self.max_tokens, self.device, self.graphs = model, cache, max_tokens, device, graphs
        self.path = path  # fused or compiled (kernels.kernel_path)
        self.width = 1 + model.config.num_codebooks
        # per bucket: the call's input buffers (a captured call reads the same addresses each time)
        self._buffers: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}
        self.calls = 0

    def run(self, slots: list[int], prompts: list[np.ndarray], chunks: list[tuple[int, int]]) -> int:
        """Write the K/V of each row's chunk (columns s..e-1 of its prompt, at positions s..e-1 of
        its slot) in one call. Returns the bucket's token count."""
        n = sum(e - s for s, e in chunks)
        size = token_bucket(n)
        tokens = np.zeros((self.width, size), np.int64)
        token_slots = np.full(size, slots[-1], np.int64)
        positions = np.full(size, self.max_tokens - 1, np.int64)
        at = 0
        for slot, prompt, (s, e) in zip(slots, prompts, chunks):
            tokens[:, at : at + e - s] = prompt[:, s:e]
            token_slots[at : at + e - s] = slot
            positions[at : at + e - s] = np.arange(s, e)
            at += e - s
        buffers = self._buffers_for(size)
        for buffer, values in zip(buffers, (tokens, token_slots, positions)):
            buffer.view(-1).copy_(torch.from_numpy(values.reshape(-1)), non_blocking=False)
        if self.graphs is not None and size <= LARGEST_GRAPHED_BUCKET:
            self.graphs.run(("prefill", size), lambda: self._forward(*buffers))
        else:
            self._forward(*buffers)
        self.calls += 1
        return size

    def _buffers_for(self, size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        found: Optional[tuple] = self._buffers.get(size)
        if found is None:
            found = (
                torch.zeros(1, self.width, size, dtype=torch.int64, device=self.device),
                torch.zeros(1, size, dtype=torch.int64, device=self.device),
                torch.zeros(1, size, dtype=torch.int64, device=self.device),
            )
            self._buffers[size] = found
        return found

    def _forward(self, tokens: torch.Tensor, slots: torch.Tensor, positions: torch.Tensor) -> None:
        self.model.forward_slow(
            tokens, positions, cache=self.cache.slow, attend_len=self.max_tokens, last_only=True, want_logits=False,
            fused=self.path, slots=slots,
        )  # fmt: skip
