"""Decoding on a GPU: which path runs the decoder, CUDA graphs per batch shape, the codec's
own stream, and batches sized from the device's memory.

Paths (`Codec.configure_decode(backend=...)`; the GPU bench measures each):
  triton           the decoder's convolutions through the fused kernel (fused.py), each Snake
                   in the epilogue of the layer before it; `auto`'s choice on CUDA in
                   bfloat16 / float16 where triton imports
  triton-prologue  the same kernel, each Snake recomputed in its conv's prologue
  eager            layers.py's modules (cuDNN; no F.pad copy on a GPU: layers.py); `auto`'s
                   choice in float32, whose results stay those of the eager layers
  inductor         the eager decode compiled by torch.compile, one graph per shape
Every path runs on cuDNN's autotuned algorithms (`torch.backends.cudnn.benchmark`, set on
for the process once a CUDA codec decodes: the codec's shapes come in frame buckets).

Graphs: with `graphs` on (CUDA's default) a decode shape (rows, frames) met a second time is
captured as a CUDA graph and replayed from then on: a decode is ~400 kernels (the post
transformer's and the quantizer's eager ops, 30 convolutions), whose launches would otherwise
cost more than a short batch's work. A shape met once runs eagerly (its warm-up: triton
compiles, cuDNN autotunes), so one-off shapes never pay a capture. All graphs share one memory
pool and run one at a time (a lock), each output copied out before the next replay.

Memory: `bytes_per_sample` is what a decode holds per output sample on its path (fused.py's
count of live activations, at the dtype, plus the output and its float32 copy, times a
margin); `max_batch_samples` divides the budget -- `memory_budget` bytes if the actor's memory
plan set it, else DECODE_MEMORY_SHARE of what the device has free (plus torch's cached, unused
blocks) the first time it is asked -- by it. On CPU the cap stays model.py's cache-sized one.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Optional

import torch
from torch import Tensor

from . import triton_conv
from .fused import FusedDecoder, decode_values_per_sample
from .transformer import ROPE_TABLES

BACKENDS = ("auto", "triton", "triton-prologue", "eager", "inductor")
# the share of the device's free memory a decode may take when no memory plan says otherwise:
# the engine's KV cache is allocated before the first decode, and the checks' models may load
DECODE_MEMORY_SHARE = 0.5
# the caching allocator's rounding and fragmentation over the live tensors counted
ALLOCATOR_MARGIN = 1.25
# captured decode shapes kept (least recently used out): each holds only its output in the
# shared pool, so the pool is about the largest shape's decode
MAX_GRAPHS = 32
# the post transformer's attention when torch falls back to its math kernel: [rows, 16 heads,
# 1,024 queries, 1,151 keys] float32 per block of 1,024 frames (2,048 samples each)
ATTENTION_BYTES_PER_SAMPLE = 16 * 1151 * 4 / 2048
# grown once on a GPU so no capture ever sees the RoPE table replaced (positions per call:
# code frames, 21.5 a second: 2**15 is over 25 minutes)
ROPE_POSITIONS = 2**15


def resolve_backend(backend: str, device: torch.device, dtype: torch.dtype) -> str:
    """`auto` -> the path for this device and dtype; a named one checked (clear error if it
    cannot run here)."""
    if backend not in BACKENDS:
        raise ValueError(f"codec decode backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "auto":
        fused = device.type == "cuda" and dtype in (torch.bfloat16, torch.float16)
        return "triton" if fused and triton_conv.available(device) else "eager"
    if backend.startswith("triton") and not triton_conv.available(device):
        why = "triton is not installed" if not triton_conv.installed() else f"{device} is not CUDA"
        raise ValueError(f"codec decode backend {backend!r} cannot run: {why} (TRITON_INTERPRET=1 runs it on CPU)")
    return backend


def memory_path(backend: str) -> str:
    """The live-tensor pattern (fused.LIVE_TENSORS) of a backend's decode."""
    return {"triton": "epilogue", "triton-prologue": "prologue"}.get(backend, "eager")


def bytes_per_sample(config, dtype: torch.dtype, backend: str) -> float:
    """Device bytes a decode on `backend` holds per output sample (rows x frames x frame_length)."""
    item = torch.empty((), dtype=dtype).element_size()
    live = decode_values_per_sample(config, memory_path(backend)) + 1  # + the audio itself
    return (live * item + ATTENTION_BYTES_PER_SAMPLE + 4) * ALLOCATOR_MARGIN  # + its float32 copy


def samples_for_budget(budget_bytes: float, per_sample: float, frame_length: int) -> int:
    """Whole frames' worth of samples within the budget; one frame at least (a row longer than
    the cap still decodes, alone)."""
    frames = int(budget_bytes // (per_sample * frame_length))
    return max(1, frames) * frame_length


def free_device_bytes(device: torch.device) -> int:
    """Free on the device plus what torch's caching allocator holds unused."""
    free, _ = torch.cuda.mem_get_info(device)
    return int(free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device))


class DecodeGraphs:
    """One CUDA graph per decode shape, captured the second time the shape comes."""

    def __init__(self, device: torch.device, capacity: int = MAX_GRAPHS):
        self.pool = torch.cuda.graph_pool_handle()
        self.capture_stream = torch.cuda.Stream(device=device)
        self.capacity = capacity
        self.graphs: OrderedDict[tuple, tuple] = OrderedDict()  # shape -> (graph, input, output, held)
        self.seen: OrderedDict[tuple, None] = OrderedDict()
        self.stats = {"eager_calls": 0, "captures": 0, "replays": 0, "capture_s": 0.0}

    def run(self, codes: Tensor, forward: Callable[[Tensor], Tensor]) -> Tensor:
        key = tuple(codes.shape)
        entry = self.graphs.get(key)
        if entry is None:
            if key not in self.seen:  # first sighting: eager, which warms up what a capture needs
                self.seen[key] = None
                while len(self.seen) > 4 * self.capacity:
                    self.seen.popitem(last=False)
                self.stats["eager_calls"] += 1
                return self._on_capture_stream(lambda: forward(codes))
            entry = self._capture(key, codes, forward)
        self.graphs.move_to_end(key)
        graph, static_input, static_output, _ = entry
        static_input.copy_(codes)
        graph.replay()
        self.stats["replays"] += 1
        return static_output.clone()  # the next replay of any graph may reuse this memory

    def _on_capture_stream(self, work: Callable[[], Tensor]) -> Tensor:
        """work() on the capture stream (so its per-stream state -- cuBLAS workspaces, cuDNN
        plans -- exists before a capture there), ordered after and before the caller's stream."""
        current = torch.cuda.current_stream(self.capture_stream.device)
        self.capture_stream.wait_stream(current)
        with torch.cuda.stream(self.capture_stream):
            out = work()
        current.wait_stream(self.capture_stream)
        out.record_stream(current)  # its memory is not reused while the caller's stream reads it
        return out

    def _capture(self, key: tuple, codes: Tensor, forward: Callable[[Tensor], Tensor]) -> tuple:
        began = time.perf_counter()
        static_input = codes.clone()
        current = torch.cuda.current_stream(codes.device)
        self.capture_stream.wait_stream(current)
        graph = torch.cuda.CUDAGraph()
        # thread_local: the engine's thread may launch meanwhile; only this thread is held to
        # what a capture allows
        with torch.cuda.graph(graph, pool=self.pool, stream=self.capture_stream, capture_error_mode="thread_local"):
            static_output = forward(static_input)
        current.wait_stream(self.capture_stream)
        # the RoPE tables the graph read stay alive (and unmoved) as long as it does
        entry = (graph, static_input, static_output, ROPE_TABLES.held())
        self.graphs[key] = entry
        while len(self.graphs) > self.capacity:
            self.graphs.popitem(last=False)
        self.stats["captures"] += 1
        self.stats["capture_s"] += time.perf_counter() - began
        return entry


class DeviceDecode:
    """A codec's decode on its device: `run(codes)` for in-range codes -> audio [B, 1, T]."""

    def __init__(
        self, codec, backend: str = "auto", graphs: Optional[bool] = None, memory_budget: Optional[int] = None
    ):
        device, dtype = codec.device, codec.dtype
        self.codec, self.device = codec, device
        self.backend = resolve_backend(backend, device, dtype)
        self.memory_budget = memory_budget
        self.lock = threading.Lock()
        self.fused = None
        if self.backend.startswith("triton"):
            self.fused = FusedDecoder(
                codec.decoder, dtype, "prologue" if self.backend == "triton-prologue" else "epilogue"
            )
        self.forward: Callable[[Tensor], Tensor] = self._eager
        if self.backend == "inductor":
            self.forward = torch.compile(self._eager, dynamic=False)
        if device.type == "cuda":
            torch.backends.cudnn.benchmark = True
            ROPE_TABLES.get(ROPE_POSITIONS, *_rope_key(codec), device)
            # the packed weights and tables were made on this thread's stream; decodes run on
            # the codec's own: let them be complete before any reads them
            torch.cuda.synchronize(device)
        use_graphs = device.type == "cuda" if graphs is None else graphs
        if use_graphs and device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA device, the codec is on {device}")
        self.graphs = DecodeGraphs(device) if use_graphs else None

    def _eager(self, codes: Tensor) -> Tensor:
        return self._decoder(self.codec.quantizer.decode(codes))

    def _decoder(self, latent: Tensor) -> Tensor:
        return self.fused(latent) if self.fused is not None else self.codec.decoder(latent)

    def run(self, codes: Tensor) -> Tensor:
        with self.lock:
            if self.graphs is None:
                return self.forward(codes)
            return self.graphs.run(codes, self.forward)

    def decode_latent(self, latent: Tensor) -> Tensor:
        """The decoder alone over a latent (a long row's piece, model.decode_long), uncaptured:
        each piece's shape comes once a row."""
        with self.lock:
            return self._decoder(latent)

    def warm_up(self, frames: int = 16, rows: int = 1) -> float:
        """Decode one batch of zeros, so what the first real call would pay -- Triton's compile
        of each layer (cached on disk for the next process), cuDNN's autotuning -- is paid at
        load; returns its seconds. Graphs are captured later, per shape met twice."""
        began = time.perf_counter()
        codes = torch.zeros(rows, self.codec.num_codebooks, frames, dtype=torch.long, device=self.device)
        with self.lock, torch.inference_mode():
            self.forward(codes)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter() - began

    @property
    def bytes_per_sample(self) -> float:
        return bytes_per_sample(self.codec.config, self.codec.dtype, self.backend)

    def max_batch_samples(self) -> int:
        """Samples one decode call may hold: the memory budget over bytes_per_sample. Without a
        budget set, DECODE_MEMORY_SHARE of the device's free memory, read once (and kept, so
        decode shapes -- and their graphs -- stay put)."""
        if self.memory_budget is None:
            self.memory_budget = int(DECODE_MEMORY_SHARE * free_device_bytes(self.device))
        return samples_for_budget(self.memory_budget, self.bytes_per_sample, self.codec.frame_length)

    def describe(self) -> dict:
        return {
            "backend": self.backend,
            "graphs": None if self.graphs is None else dict(self.graphs.stats, held=len(self.graphs.graphs)),
            "memory_budget": self.memory_budget,
            "bytes_per_sample": round(self.bytes_per_sample, 1),
        }


def _rope_key(codec) -> tuple[int, float]:
    post = codec.config.post_module
    return (post.head_dim, post.rope_base) if post is not None else (64, 10000.0)
