"""The engine's settings: one typed dataclass, free of torch, so that the driver's Hydra schema
can nest it and the actor hands it to `Engine` unchanged. Each default lives here once."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

# re-exported for actors/settings.py, until it imports the leaf itself
from actors.dtype_names import DTYPE_NAMES  # noqa: F401

# what engine.compile may say (actors/engine/compiling.py acts on it); true/false, which is what
# YAML and Hydra's command line make of a bare on/off, are read as on/off
COMPILE_MODES = ("off", "on", "auto")
_COMPILE_SPELLINGS = {"true": "on", "false": "off", "on": "on", "off": "off", "auto": "auto"}


def compile_mode(value) -> str:
    """engine.compile as one of COMPILE_MODES (bools and any case accepted); ValueError otherwise."""
    mode = _COMPILE_SPELLINGS.get(str(value).strip().lower())
    if mode is None:
        raise ValueError(f"engine.compile must be one of {', '.join(COMPILE_MODES)} (or true/false), got {value!r}")
    return mode


@dataclass
class EngineConfig:
    """max_rows: KV slots = rows decoded together. max_tokens: positions per slot (prompt +
    frames); size it to the work, not the model's context. prefill_chunk: prompt columns per
    prefill call. static_shapes: decode a batch padded to a size bucket, attending over a fixed
    key count (CPU: the slot's capacity, reading the chunks the rows reach; CUDA: the key bucket
    that holds the longest row), so each bucket has one shape (implied by compile and CUDA graphs).
    compile: off | on | auto (true/false read as on/off): on wraps the whole decode frame (slow
    step, fast stack, sampling) in torch.compile(fullgraph=True), a graph break being an error;
    auto: on CUDA, and on CPU where the linears are packed (actors/engine/compiling.py:
    auto_compiles says why).
    compile_cache_dir: inductor's cache (None: TORCHINDUCTOR_CACHE_DIR when set, else
    ~/.cache/chorus/compile), kept across starts. cuda_graphs: on CUDA, run
    each decode step as a CUDA graph, captured by the engine per batch-size bucket, key-count
    bucket and sampling shape (actors/engine/graphs.py). codebook_limits: optional per-codebook upper
    bounds for sampled codes (e.g. the codec's sizes); None samples all codebook_size ids, as
    current upstream. prefix_cache_entries: how many shared prompt prefixes keep their K/V."""

    max_rows: int = 16
    max_tokens: int = 1024
    prefill_chunk: int = 512
    static_shapes: bool = False
    compile: str = "off"
    compile_cache_dir: Optional[str] = None
    cuda_graphs: bool = False
    # CUDA graphs: key counts a captured step attends over (a batch reads the smallest that holds
    # its longest row); None = 512, 1024, 2048, ... below max_tokens, and max_tokens
    kv_buckets: Optional[list[int]] = None
    # CUDA graphs: seconds warm_up may spend capturing (and compiling) before the first row; the
    # shapes it did not reach are captured when first met. None = no limit
    warm_up_budget_s: Optional[float] = None
    # CUDA: the share of the device's memory the engine may fill, the weights and whatever else
    # the device already holds counted; max_rows becomes the slots of max_tokens that fit (at
    # most max_rows). None = exactly max_rows slots
    memory_fraction: Optional[float] = None
    # batch sizes a static/compiled decode frame is built for (live rows are padded up to the
    # next one); None = powers of two up to max_rows, but max_rows and its quarters for a frame
    # compiled on CPU: each bucket is one compiled graph, and a CPU compile takes a minute or more
    decode_buckets: Optional[list[int]] = None
    codebook_limits: Optional[tuple[int, ...]] = None
    prefix_cache_entries: int = 8
    # frames of sampling history kept per row on the device (repetition-aware sampling and the
    # repetition penalty look back at most this far; a request asking for more is an error)
    sampling_history: int = 32
    record_steps: bool = False
    # CPU only: pre-pack linear weights for oneDNN (~2x faster matmuls; costs a second copy
    # of the linear weights in memory). Ignored on GPU and for float64.
    cpu_packed_linears: bool = True

    def validate(self) -> None:
        """Range checks a config schema cannot express; raises ValueError naming the key."""
        compile_mode(self.compile)
        if self.max_rows < 1:
            raise ValueError(f"engine.max_rows must be >= 1, got {self.max_rows}")
        if self.max_tokens < 2:
            raise ValueError(f"engine.max_tokens must be >= 2, got {self.max_tokens}")
        if self.prefill_chunk < 1:
            raise ValueError(f"engine.prefill_chunk must be >= 1, got {self.prefill_chunk}")
        if self.decode_buckets is not None and (
            not self.decode_buckets or any(not (1 <= b <= self.max_rows) for b in self.decode_buckets)
        ):
            raise ValueError(
                f"engine.decode_buckets must be sizes in 1..max_rows ({self.max_rows}), got {self.decode_buckets}"
            )
        if self.kv_buckets is not None and any(int(b) < 1 for b in self.kv_buckets):
            raise ValueError(f"engine.kv_buckets must be positive key counts, got {self.kv_buckets}")
        if self.memory_fraction is not None and not (0 < self.memory_fraction <= 1):
            raise ValueError(f"engine.memory_fraction must lie in (0, 1], got {self.memory_fraction}")
        if self.warm_up_budget_s is not None and self.warm_up_budget_s < 0:
            raise ValueError(f"engine.warm_up_budget_s must be >= 0, got {self.warm_up_budget_s}")
        if self.sampling_history < 1:
            raise ValueError(f"engine.sampling_history must be >= 1, got {self.sampling_history}")
        if self.prefix_cache_entries < 0:
            raise ValueError(f"engine.prefix_cache_entries must be >= 0, got {self.prefix_cache_entries}")
