"""The engine's settings: one typed dataclass, free of torch, so that the driver's Hydra schema
can nest it and the actor hands it to `Engine` unchanged. Each default lives here once."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from actors.bounds import at_least, check_bounds, described

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


# what engine.kernels may say (actors/engine/kernels/ acts on it): eager, the model's plain modules;
# fused, the kernels package's ops on any device (Triton on CUDA, their eager references on the
# CPU); compiled, the same regions as the references compiled by inductor (one compiled region
# serves every layer); auto, fused on CUDA where Triton is installed, eager elsewhere
KERNEL_MODES = ("eager", "fused", "compiled", "auto")


def kernel_mode(value) -> str:
    """engine.kernels as one of KERNEL_MODES; ValueError otherwise."""
    mode = str(value).strip().lower()
    if mode not in KERNEL_MODES:
        raise ValueError(f"engine.kernels must be one of {', '.join(KERNEL_MODES)}, got {value!r}")
    return mode


@dataclass
class EngineConfig:
    """The engine's own settings (actors/engine/): its KV slots and positions, how prompts are
    prefilled, the compiled or graph-captured decode frame, and the prefix cache."""

    # KV slots: rows decoded together
    max_rows: int = field(default=16, metadata=at_least(1))
    # positions per slot (prompt + frames); size it to the work, not the model's context
    max_tokens: int = field(default=1024, metadata=at_least(2))
    # prompt columns per prefill call
    prefill_chunk: int = field(default=512, metadata=at_least(1))
    # decode a batch padded to a size bucket, attending over a fixed key count (CPU: the slot's
    # capacity, reading the chunks the rows reach; CUDA: the key bucket that holds the longest
    # row), so each bucket has one shape (implied by compile and CUDA graphs)
    static_shapes: bool = False
    # on wraps the whole decode frame (slow step, fast stack, sampling) in
    # torch.compile(fullgraph=True), a graph break being an error; auto: on CUDA, and on CPU
    # where the linears are packed (actors/engine/compiling.py: auto_compiles says why)
    compile: str = field(default="off", metadata=described("one of off, on, auto (true/false: on/off)"))
    # the decode step's kernels (actors/engine/kernels/): eager, the model's plain modules; fused,
    # the kernels package's ops (Triton on CUDA, their eager references on the CPU: for tests and
    # counting); compiled, those regions' references compiled by inductor; auto, fused on CUDA
    # where Triton is installed, else eager
    kernels: str = field(default="eager", metadata=described("one of eager, fused, compiled, auto"))
    # launch each decode step before reading the previous step's tokens, so the host's
    # bookkeeping of one step overlaps the device's next (a row that stopped costs one frame
    # decoded past its end, dropped); null = on for CUDA, off elsewhere
    overlap_host: Optional[bool] = None
    # the slow stack's K/V cache: auto, the model's dtype; fp8, float8 e4m3 (half of bf16's bytes;
    # the fused or compiled kernels only; logits within the bound docs/engine.md states)
    kv_dtype: str = field(default="auto", metadata=described("auto or fp8"))
    # W8A8 FP8 products for the slow stack's linears (per-row scales; torch._scaled_mm on CUDA),
    # for compute-bound shapes such as S2-Pro at 256 rows; quantizes the loaded model in place
    fp8_weights: bool = False
    # inductor's cache, kept across starts; null = TORCHINDUCTOR_CACHE_DIR when set, else
    # ~/.cache/chorus/compile
    compile_cache_dir: Optional[str] = None
    # on CUDA, run each decode step as a CUDA graph, captured by the engine per batch-size
    # bucket, key-count bucket and sampling shape (actors/engine/graphs.py)
    cuda_graphs: bool = False
    # CUDA graphs: key counts a captured step attends over (a batch reads the smallest that holds
    # its longest row); None = 512, 1024, 2048, ... below max_tokens, and max_tokens
    kv_buckets: Optional[list[int]] = field(default=None, metadata=described("each >= 1, or null"))
    # CUDA graphs: seconds warm_up may spend capturing (and compiling) before the first row; the
    # shapes it did not reach are captured when first met. None = no limit
    warm_up_budget_s: Optional[float] = field(default=None, metadata=at_least(0, or_null=True))
    # CUDA: the share of the device's memory the engine may fill, the weights and whatever else
    # the device already holds counted; max_rows becomes the slots of max_tokens that fit (at
    # most max_rows). None = exactly max_rows slots
    memory_fraction: Optional[float] = field(default=None, metadata=described("in (0, 1] or null"))
    # batch sizes a static/compiled decode frame is built for (live rows are padded up to the
    # next one); None = powers of two up to max_rows, but max_rows and its quarters for a frame
    # compiled on CPU: each bucket is one compiled graph, and a CPU compile takes a minute or more
    decode_buckets: Optional[list[int]] = field(
        default=None, metadata=described("a non-empty list of sizes in 1..max_rows, or null")
    )
    # per-codebook upper bounds for sampled codes (e.g. the codec's sizes); None samples all
    # codebook_size ids, as current upstream
    codebook_limits: Optional[tuple[int, ...]] = None
    # how many shared prompt prefixes keep their K/V
    prefix_cache_entries: int = field(default=8, metadata=at_least(0))
    # frames of sampling history kept per row on the device (repetition-aware sampling and the
    # repetition penalty look back at most this far; a request asking for more is an error)
    sampling_history: int = field(default=32, metadata=at_least(1))
    # record every prefill and decode step's rows and positions in Engine.steps (tests read them)
    record_steps: bool = False
    # CPU only: pre-pack linear weights for oneDNN (~2x faster matmuls; costs a second copy
    # of the linear weights in memory). Ignored on GPU and for float64.
    cpu_packed_linears: bool = True

    def validate(self) -> None:
        """Range checks a config schema cannot express; raises ValueError (ConfigError) naming the key."""
        compile_mode(self.compile)
        kernel_mode(self.kernels)
        if self.kv_dtype not in ("auto", "fp8"):
            raise ValueError(f"engine.kv_dtype must be auto or fp8, got {self.kv_dtype!r}")
        if self.kv_dtype == "fp8" and kernel_mode(self.kernels) == "eager":
            raise ValueError(
                "engine.kv_dtype=fp8 needs engine.kernels=fused, compiled or auto (the eager path reads K/V as the model's dtype)"
            )
        check_bounds(self, "engine")
        if self.decode_buckets is not None and (
            not self.decode_buckets or any(not (1 <= b <= self.max_rows) for b in self.decode_buckets)
        ):
            raise ValueError(
                f"engine.decode_buckets must be sizes in 1..max_rows ({self.max_rows}), got {self.decode_buckets}"
            )
        if self.kv_buckets is not None and any(int(b) < 1 for b in self.kv_buckets):
            raise ValueError(f"engine.kv_buckets must be positive key counts, got {self.kv_buckets}")
        # "lie in": the wording the engine's callers match (tests/engine/test_graphs.py)
        if self.memory_fraction is not None and not (0 < self.memory_fraction <= 1):
            raise ValueError(f"engine.memory_fraction must lie in (0, 1], got {self.memory_fraction}")
