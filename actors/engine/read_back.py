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


class StepBuffers:
    """A decode step's inputs and outputs: buffers that live as long as the engine, so a captured
    step reads and writes the same addresses every time (graphs.py). `positions` on the device
    and `host` (pinned on CUDA) to stage them; `out`, the frame's tokens; `read_back`, their copy
    to the host; `reach`, the keys a static CPU frame's rows reach (read at run time)."""

    def __init__(self, rows: int, width: int, device: torch.device):
        self.positions = torch.zeros(rows, 1, dtype=torch.int64, device=device)
        self.host = torch.zeros(rows, 1, dtype=torch.int64, pin_memory=device.type == "cuda")
        self.out = torch.zeros(rows, width, dtype=torch.int64, device=device)
        self.read_back = TokenReadBack(rows, width, device)
        self.reach = torch.zeros((), dtype=torch.int64, device=device)
