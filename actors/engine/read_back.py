"""A decode frame's tokens read back without waiting: two pinned host buffers taking turns, each
filled by a copy queued on the device right after its step, so the host launches the next step
first and reads this one's tokens after (the scheduler's overlap, engine.overlap_host). The
turn ends before its buffer comes round again: the host reads a frame before it launches the
step after the next."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch


class TokenReadBack:
    def __init__(self, rows: int, width: int, device: torch.device):
        self.device = device
        pinned = device.type == "cuda"
        self.buffers = [torch.zeros(rows, width, dtype=torch.int64, pin_memory=pinned) for _ in range(2)]
        self.turn = 0

    def start(self, frame: torch.Tensor) -> Callable[[], np.ndarray]:
        """Queue the copy of `frame` [n, width]; the returned call waits for it and hands the tokens."""
        host = self.buffers[self.turn][: frame.shape[0]]
        self.turn ^= 1
        host.copy_(frame, non_blocking=self.device.type == "cuda")
        done = None
        if self.device.type == "cuda":
            done = torch.cuda.Event()
            done.record()

        def wait() -> np.ndarray:
            if done is not None:
                done.synchronize()
            return host.numpy().copy()

        return wait
