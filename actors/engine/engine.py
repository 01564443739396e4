"""The batched dual-AR generation engine: continuous batching over fixed KV slots.

Three roles, as in vLLM: the scheduler (`scheduler.py`: queue, admission, prefill planning,
compaction, retirement, results; no tensors), the slot KV-cache manager (`cache.py`: every
change of a slot's length and owner), and the runner (`runner.py`: batch tensors, one forward
plus sampling, tokens back). `Engine` is the streaming front of the three:

    engine.add(request)          # joins at the next step through a free slot
    engine.step() -> [Result]    # the requests that finished during this step
    engine.has_unfinished()
    engine.abort(request_id)
    engine.generate(requests)    # a loop over add/step; results in input order

Each row keeps its own slot, random stream and stop state, so its result is what it would
have produced alone, whenever it was added.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Optional

import numpy as np
import torch

from .allocator import tune_malloc
from .buckets import bucket_sizes
from .cache import SlotKVCache
from .compile_cache import save_artifacts
from .loader import LoadedModel
from .runner import ModelRunner
from .scheduler import LogitObserver, Scheduler
from .settings import EngineConfig
from .slots import sized_to_memory, slow_kv_dtype
from .types import Request, Result, SamplingParams, upstream_sampling

# the largest value a float32 holds: a setting above it would become inf on the device
_FLOAT32_MAX = float(np.finfo(np.float32).max)


class Engine:
    def __init__(self, loaded: LoadedModel, config: Optional[EngineConfig] = None):
        config = config or EngineConfig()
        config.validate()
        tune_malloc()
        self.model, self.mc = loaded.model, loaded.config
        self.device, self.dtype = loaded.device, loaded.dtype
        config = sized_to_memory(config, self.mc, self.device, self.dtype)
        self.loaded, self.config = loaded, config
        self.cache = SlotKVCache(
            self.mc, config.max_rows, config.max_tokens, self.device, self.dtype, model_id=id(self.model),
            kv_dtype=slow_kv_dtype(config, self.dtype),
        )  # fmt: skip
        self.runner = ModelRunner(loaded, config, self.cache)
        self.scheduler = Scheduler(config, self.mc, self.cache, self.runner)

    # -- streaming API -----------------------------------------------------------------
    def add(self, request: Request) -> None:
        """Queue a request. One that cannot run comes back from the next `step` as an error
        Result; nothing here raises for a bad request."""
        self.scheduler.add(request, self.validate(request))

    @torch.inference_mode()
    def step(self) -> list[Result]:
        """Admit, prefill, decode one frame; the Results of requests that finished."""
        self.cache.check_compatible(id(self.model), self.device, self.dtype)
        return [result for _, result in self.scheduler.step()]

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    def abort(self, request_id: str) -> bool:
        """Drop a queued or running request and free its slot; no Result is returned for it.
        False when no such request is queued or running."""
        return self.scheduler.abort(request_id)

    @torch.inference_mode()
    def generate(self, requests: Iterable[Request], observe: Optional[LogitObserver] = None) -> list[Result]:
        """Run every request to completion; results in input order. `observe` sees every
        row's raw logits at every frame (tests compare them with the uncached reference)."""
        self.cache.check_compatible(id(self.model), self.device, self.dtype)
        order = {self.scheduler.add(r, self.validate(r)): i for i, r in enumerate(requests)}
        results: list[Optional[Result]] = [None] * len(order)
        self.scheduler.observe = observe
        try:
            while any(r is None for r in results):
                for seq_id, result in self.scheduler.step():
                    if seq_id in order:
                        results[order[seq_id]] = result
        finally:
            self.scheduler.observe = None
        return results

    def warm_up(self, sampling: Optional[SamplingParams] = None) -> float:
        """Build the decode steps now instead of in real frames, for rows sampling as `sampling`
        does (default: upstream's for the model family): a step specialises on its rows'
        sampling (top-k widths, whether penalties run). CUDA graphs: capture every batch bucket
        x key bucket (compiling the frame first when it is compiled), within
        engine.warm_up_budget_s. A frame compiled on CPU: throw-away requests of two frames, as
        many at once as each batch-size bucket holds, so every bucket's graph is built (minutes
        on CPU; with the compile cache warm, much less). Seconds spent (0.0 when nothing is built)."""
        runner = self.runner
        if not runner.compiled and runner.graphs is None and runner.kernel_path != "compiled":
            return 0.0
        began = time.perf_counter()
        sampling = sampling or upstream_sampling(self.mc.family)
        if runner.graphs is not None:
            with torch.inference_mode():
                runner.capture_steps(sampling, self.config.warm_up_budget_s)
            save_artifacts(runner.compile_cache, self.device)
            return time.perf_counter() - began
        prompt = np.zeros((1 + self.mc.num_codebooks, 2), dtype=np.int64)
        for size in bucket_sizes(self.config.max_rows, self.runner.buckets):
            rows = [
                Request(f"chorus-warm-up-{i}", prompt, 2, sampling.with_seed(i), stop_on_eos=False) for i in range(size)
            ]
            self.generate(rows)
        save_artifacts(runner.compile_cache, self.device)  # the next start on any node loads it
        return time.perf_counter() - began

    def graph_stats(self) -> Optional[dict]:
        """CUDA graphs' captures, replays and capture seconds (None without graphs)."""
        return None if self.runner.graphs is None else self.runner.graphs.stats.as_dict()

    # -- facts -------------------------------------------------------------------------
    @property
    def prefixes(self):
        return self.runner.prefixes

    @property
    def steps(self):
        return self.runner.steps

    def clear_prefix_cache(self) -> None:
        self.runner.prefixes.clear()

    def kv_bytes(self) -> dict:
        return self.cache.bytes()

    def validate(self, request: Request) -> Optional[str]:
        """Why a request cannot run (None if it can): a per-request error, never an exception."""
        c = self.mc
        p = request.prompt
        if not isinstance(p, np.ndarray) or p.ndim != 2 or p.shape[0] != 1 + c.num_codebooks:
            shape = list(p.shape) if isinstance(p, np.ndarray) else type(p).__name__
            return f"prompt must be an int array of shape [{1 + c.num_codebooks}, T], got {shape}"
        if not np.issubdtype(p.dtype, np.integer):
            return f"prompt must hold integers, got {p.dtype}"
        if p.shape[1] == 0:
            return "prompt is empty"
        if p[0].min() < 0 or p[0].max() >= c.vocab_size:
            return f"prompt token ids must lie in [0, {c.vocab_size})"
        if p[1:].size and (p[1:].min() < 0 or p[1:].max() >= c.codebook_size):
            return f"prompt codes must lie in [0, {c.codebook_size})"
        if request.max_frames < 0:
            return f"max_frames must be >= 0, got {request.max_frames}"
        s = request.sampling
        try:
            s.validate()
        except ValueError as e:
            return f"bad sampling settings: {e}"
        for name in ("temperature", "ras_temperature", "repetition_penalty"):
            if not (getattr(s, name) <= _FLOAT32_MAX):  # also refuses NaN
                return f"bad sampling settings: {name} {getattr(s, name)} does not fit a float32"
        history = self.config.sampling_history
        windows = [s.ras_window, s.repetition_window if s.repetition_penalty != 1.0 else 0]
        if max(windows) > history:
            return (
                f"bad sampling settings: ras_window/repetition_window {max(windows)} exceeds the "
                f"engine's sampling_history ({history} frames); lower the window or raise engine.sampling_history"
            )
        need = p.shape[1] + request.max_frames
        if need > self.config.max_tokens or need > c.max_seq_len:
            return (
                f"prompt ({p.shape[1]} tokens) + max_frames ({request.max_frames}) = {need} positions "
                f"exceeds the per-row budget (engine max_tokens {self.config.max_tokens}, model "
                f"max_seq_len {c.max_seq_len}); shorten the text/reference or lower max_frames "
                f"(no sliding window is applied)"
            )
        if not (0 <= request.prefix_len <= p.shape[1]):
            return f"prefix_len {request.prefix_len} is outside the prompt (0..{p.shape[1]})"
        return None
