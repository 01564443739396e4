"""CUDA graphs of the decode step, captured and replayed by the engine itself.

A decode step on the GPU is thousands of small kernels (the slow stack, the fast stack once per
codebook, sampling): launched one by one from Python it is bound by launches whatever the
batch. Captured as a CUDA graph it is one launch. chorus captures the step itself, as vLLM and
sglang do, rather than through inductor's `mode="reduce-overhead"`: inductor skips its graphs
silently when a compiled function mutates an input it was not told is static (the KV cache
is mutated every step), re-records them in every thread that calls the function, and needs a
compile per shape. Here a step either runs as a graph or the capture raises.

What makes a step capturable (checked on any device by `audit.py`): it reads and writes only
tensors that live as long as the engine (weights, KV cache, per-slot sampling state, the
runner's input and output buffers), asks the host for no value, and keeps nothing it made.
Every graph is captured on one side stream into one memory pool shared by all of them: graphs
run one at a time, and each writes its results into the runner's own buffers, so none reads
memory another graph left behind. A graph is a device object: captured at warm-up in the
actor's loading thread, it replays on the current stream of whichever thread steps the engine
(the engine feeder), never recorded again.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass

import torch

# key counts a captured step attends over, from this up by doubling to the slot's capacity
SMALLEST_KV_BUCKET = 512


def kv_buckets(max_tokens: int, configured=None) -> list[int]:
    """The key counts a captured decode step is built for: `configured` (each within the slot),
    else 512, 1,024, 2,048, ... below max_tokens, and max_tokens itself. A batch attends over
    the smallest that holds its longest row, so a step reads the keys its rows reach, rounded
    up, instead of the slot's whole capacity."""
    if configured:
        return sorted({min(int(b), max_tokens) for b in configured} | {max_tokens})
    sizes, size = [], SMALLEST_KV_BUCKET
    while size < max_tokens:
        sizes.append(size)
        size *= 2
    return sizes + [max_tokens]


def kv_bucket(needed: int, buckets: list[int]) -> int:
    """The smallest bucket that holds `needed` keys (buckets end at the slot's capacity)."""
    return next((b for b in buckets if b >= needed), buckets[-1])


@dataclass
class GraphStats:
    """What the graphs did: captures (one per shape met), replays, and the seconds captures took
    (each with the one eager step that precedes it, which is that step's real work)."""

    captures: int = 0
    replays: int = 0
    capture_s: float = 0.0

    def as_dict(self) -> dict:
        return {"captures": self.captures, "replays": self.replays, "capture_s": round(self.capture_s, 3)}


class StepGraphs:
    """One CUDA graph per step shape (batch bucket, key bucket, the batch's sampling facts)."""

    def __init__(self, device: torch.device):
        if device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA device, got {device}")
        self.device = device
        self.pool = torch.cuda.graph_pool_handle()
        self.stream = torch.cuda.Stream(device=device)
        self.graphs: dict[Hashable, torch.cuda.CUDAGraph] = {}
        self.stats = GraphStats()

    def __contains__(self, shape: Hashable) -> bool:
        return shape in self.graphs

    def run(self, shape: Hashable, step: Callable[[], None]) -> None:
        """Do one step of this shape: replay its graph, or, the first time the shape comes, run
        the step eagerly (its real work, and the warm-up a capture needs: cuBLAS handles,
        compiled kernels) and capture it for the next time. `step` is device work only."""
        graph = self.graphs.get(shape)
        if graph is not None:
            graph.replay()
            self.stats.replays += 1
            return
        began = time.perf_counter()
        current = torch.cuda.current_stream(self.device)
        self.stream.wait_stream(current)
        with torch.cuda.stream(self.stream):
            step()
        graph = torch.cuda.CUDAGraph()
        # thread_local: the codec's thread may use the GPU meanwhile; only this thread's calls
        # are held to what a capture allows (and one that breaks it raises here)
        with torch.cuda.graph(graph, pool=self.pool, stream=self.stream, capture_error_mode="thread_local"):
            step()
        current.wait_stream(self.stream)
        self.graphs[shape] = graph
        self.stats.captures += 1
        self.stats.capture_s += time.perf_counter() - began
