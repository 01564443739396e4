"""The settings a SynthActor receives, as one ActorSettings: the run config's groups as typed
dataclasses, each default defined once, here (model, engine, long_form, sampling), in
job_settings.py (data, output, cluster) or in the engine's and the quality checks' own
settings. The driver's Hydra schema (pipeline/config.py) nests these same classes, and
`OmegaConf.to_object` hands the actor these objects, not dicts (docs/architecture.md §3).

Free of torch, Hydra and OmegaConf: the driver and the actor both import it, and a caller
without Hydra builds them as plain dataclasses (scripts/gpu_job.py), so no default here is an
OmegaConf interpolation. A required field is the string "???", which OmegaConf reads as a
missing value.

Range checks a schema cannot express are each dataclass's `validate()`, raising ConfigError
with a message that names the key; the driver runs them all before Ray starts, and the actor
runs them again for callers that build it directly.
"""

from __future__ import annotations

import re
import typing
from dataclasses import dataclass, field, fields
from typing import Optional

from actors.bounds import at_least, check_bounds, described, one_of, within
from actors.dtype_names import DTYPE_NAMES
from actors.engine.segment import DEFAULT_MAX_TURNS, DEFAULT_SEGMENT_BYTES, MIN_SEGMENT_BYTES
from actors.engine.settings import EngineConfig
from actors.engine.types import SamplingParams
from actors.errors import ConfigError
from actors.quality.settings import QualitySettings
from actors.synth.budget import FrameBudget
from actors.synth.job_settings import MISSING, ClusterSettings, DataSettings, OutputSettings

DEMO_FAMILIES = ("s1", "s2")  # the built-in demo checkpoints (actors/synth/demo_models.py)

INT32_MAX = (1 << 31) - 1  # top_k, max_frames: int32 output columns
# The engine samples in float32 (bfloat16 on GPU: the same exponent range): a temperature of
# 1e39 is finite as a Python float but inf in float32, and logits / 1e-40 overflow. Values
# outside these bounds are refused (per row in the actor, for the run by the driver); 0 means
# greedy.
TEMPERATURE_MIN = 1e-6
TEMPERATURE_MAX = 1e6
TOP_P_MIN = 1e-6

# torch device types a model may be put on, with an optional index ("cuda:1")
_DEVICE = re.compile(r"^(cpu|mps|(cuda|xpu)(:\d+)?)$")
_DTYPE_WORDS = f"auto or one of {', '.join(DTYPE_NAMES)}"


def sampling_problem(temperature: float, top_p: float, top_k: int) -> Optional[str]:
    """Why these sampling values cannot run on the engine or be stored in the output (None if
    they can). The engine's own SamplingParams.validate() checks signs; this checks magnitudes."""
    if temperature != 0.0 and not TEMPERATURE_MIN <= temperature <= TEMPERATURE_MAX:
        return (
            f"temperature {temperature:g} is outside [{TEMPERATURE_MIN:g}, {TEMPERATURE_MAX:g}] "
            f"(0 = greedy); the engine samples in float32"
        )
    if not TOP_P_MIN <= top_p <= 1.0:
        return f"top_p {top_p:g} is outside [{TOP_P_MIN:g}, 1]"
    if not 0 <= top_k <= INT32_MAX:
        return f"top_k {top_k} is outside [0, {INT32_MAX}] (0 = off)"
    return None


@dataclass
class ModelSettings:
    """The checkpoint and its codec, and the device and precision they run in."""

    # recorded in every output row's `model` column
    name: str = "demo-s1-tiny"
    # checkpoint directory (config.json + weights + tokenizer), required; null = the built-in
    # demo, a tiny random checkpoint built on first use into the cache dir (model=demo)
    checkpoint: Optional[str] = MISSING
    # codec.pth or a directory holding it; null = codec.pth inside `checkpoint` (or the demo's)
    codec: Optional[str] = None
    # auto = cuda when the actor was granted a GPU, else cpu
    device: str = field(default="auto", metadata=described("auto, cpu, cuda, cuda:N, mps, xpu or xpu:N"))
    # auto = bfloat16 on GPU and on CPUs with bf16 units (AVX512-BF16, AMX), else float32
    # (actors/precision.py); the codec's likewise
    dtype: str = field(default="auto", metadata=described(_DTYPE_WORDS))
    codec_dtype: str = field(default="auto", metadata=described(_DTYPE_WORDS))
    # a float32 codec on CPU runs its narrow layers (Snake + conv, <= 32 channels) through
    # chorus's C++ kernel, built once per node (actors/codec/kernels.py): the demo codec decodes
    # ~2x faster. Samples differ from torch's layers by float rounding (~1e-6), as they do
    # between CPU kinds, so this is not part of a row's identity
    codec_kernels: bool = True
    # the family of the built-in demo checkpoint (model.checkpoint null): s1 (model=demo) or s2
    # (model=demo_s2), each a tiny random model of that family's on-disk format
    demo_family: str = field(default="s1", metadata=one_of(*DEMO_FAMILIES))
    # where the demo checkpoint is built on each actor's node (null = that node's $CHORUS_CACHE,
    # else ~/.cache/chorus: actors/demo.py); a run passes the driver's $CHORUS_CACHE on when set
    cache_dir: Optional[str] = None
    # each segment's frame budget and what a segment it cuts becomes (actors/synth/budget.py):
    # real speech's by default, the demo models' short one in conf/model/demo*.yaml
    budget: FrameBudget = field(default_factory=FrameBudget)

    def validate(self) -> None:
        check_bounds(self, "model")
        if self.device != "auto" and not _DEVICE.match(self.device):
            raise ConfigError(f"model.device must be auto, cpu, cuda, cuda:N, mps, xpu or xpu:N, got {self.device!r}")
        names = ", ".join(DTYPE_NAMES)
        if self.dtype != "auto" and self.dtype not in DTYPE_NAMES:
            raise ConfigError(f"model.dtype must be auto or one of {names}, got {self.dtype!r}")
        if self.codec_dtype != "auto" and self.codec_dtype not in DTYPE_NAMES:
            raise ConfigError(f"model.codec_dtype must be auto or one of {names}, got {self.codec_dtype!r}")
        self.budget.validate()


@dataclass
class EngineSettings(EngineConfig):
    """The engine group: the engine's own settings, each default once in `EngineConfig`
    (actors/engine/settings.py: slots, KV positions, prefill chunk, prefix cache, compile,
    ...), plus what the actor decides around the engine for each row."""

    # a row ends at the model's end-of-speech token; false: it always runs to its frame budget
    stop_on_eos: bool = True
    # rows per codec decode call, and how long the finisher waits for that many while the
    # engine still has rows live. 1 (each row alone) makes a row's audio a function of the row:
    # batched, oneDNN picks its convolution algorithm by the call's batch size and width, and
    # attention reduces over the padded length, so a row's samples moved by up to 1.4e-6 with
    # its batch-mates and a rerun or another block size did not reproduce its audio bit for bit.
    # The price, 400 demo rows on a 2-vCPU Sapphire Rapids, two interleaved rounds: rows/s 0.9x
    # of 8-row batches at the median (runs spread 0.7-1.2x), slot occupancy 0.80 against 0.95;
    # the real-size codec decoded a second of audio faster alone than in 8-row batches. engine=gpu
    # batches 16: there a call for many rows costs about what one row's does
    codec_batch_rows: int = field(default=1, metadata=at_least(1))
    codec_wait_ms: float = field(default=200.0, metadata=at_least(0))
    # a row's codes are decoded padded (code 0) to a multiple of this many frames and the wave
    # cut back to its own length: every layer is causal, so the padding never reaches the row's
    # samples, and the decode's shapes repeat, so oneDNN (CPU) reuses its kernels instead of
    # building ~70 new ones for every new length (demo codec, 1 thread, Sapphire Rapids, rows
    # of 10-110 frames: 0.88-0.92 ms per frame at 1, 0.68 at 16, padding included). The bucket
    # is a function of the row's own length, so its audio still depends on nothing else
    codec_frame_bucket: int = field(default=16, metadata=at_least(1))
    # CPU: decode in a child process holding its own copy of the codec, so the codec does not
    # share the engine loop's GIL (CUDA: the codec has a stream of its own; this is ignored)
    codec_process: bool = False
    # processes measuring decoded rows and encoding their FLAC beside the actor
    # (actors/synth/listen_pool.py) when the codec decodes in the actor's process, so that work
    # (~0.006 CPU-s per second of audio) never runs in the engine's process. null = on a GPU
    # enough for 2,500 s of audio per second within the node's CPUs per GPU less two (the
    # engine's and the finisher's threads), at most 32; on a CPU 0 (engine.codec_process's
    # child listens). 0 = in the finisher's own thread
    listen_processes: Optional[int] = field(default=None, metadata=at_least(0, or_null=True))
    # encoded references each actor keeps (LRU, keyed by ref_id or the clip's bytes)
    reference_cache: int = field(default=256, metadata=at_least(0))
    # Ray Data blocks one actor holds at once: its engine loop takes rows from all of them, so
    # a slot freed at the end of one block is refilled from the next at once. null = enough
    # blocks of cluster.rows_per_block rows to cover max_rows + feed_queue_rows, plus two, at
    # most each actor's share of the input's blocks (pipeline/run/actor_settings.py::concurrent_blocks)
    max_concurrent_blocks: Optional[int] = field(default=None, metadata=at_least(1, or_null=True))
    # rows an actor holds beyond its slots, prepared and waiting for one (back-pressure: a
    # block's rows enter the engine's queue only while fewer than max_rows + this are in flight)
    feed_queue_rows: int = field(default=8, metadata=at_least(0))

    def engine_config(self) -> EngineConfig:
        """The engine's own settings alone, for `Engine`."""
        return EngineConfig(**{f.name: getattr(self, f.name) for f in fields(EngineConfig)})

    def validate(self) -> None:
        """EngineConfig's range checks, which include the per-row settings' bounds (its
        check_bounds sees every field of this subclass)."""
        try:
            super().validate()
        except ValueError as e:
            raise ConfigError(str(e)) from None


@dataclass
class LongFormSettings:
    """Rows longer than one engine request are generated as a chain of segments (README,
    "Long text"): cut at speaker turns, sentence ends, clause marks, whitespace. The defaults
    are upstream's, kept with the segmenting rules (actors/engine/segment.py)."""

    # most UTF-8 bytes of text per segment (upstream's chunk_length default); the engine's
    # max_tokens, the reference's length and the frame budget may make segments smaller
    segment_bytes: int = field(default=DEFAULT_SEGMENT_BYTES, metadata=at_least(MIN_SEGMENT_BYTES))
    # most speaker turns grouped into one segment (upstream: 5)
    max_turns: int = field(default=DEFAULT_MAX_TURNS, metadata=at_least(1))
    # share of a row's positions (after the system part and reference) that segment sizing
    # leaves for previous segments, so that at least the last one stays in the prompt and the
    # voice carries over; 0 sizes segments to fill the budget. Only binds when engine.max_tokens
    # is small against segment_bytes (real checkpoints' context is far larger than 300 bytes)
    history_fraction: float = field(default=0.5, metadata=within(0, 1, closed="[)"))

    def validate(self) -> None:
        check_bounds(self, "long_form")


@dataclass
class SamplingSettings:
    """The run's sampling values; a row's own `temperature`, `top_p`, `top_k` columns override them."""

    # null = upstream's default for the model family (S1: 0.8/0.8/30 + repetition penalty 1.1;
    # S2: 0.8/0.8/30 + repetition-aware sampling over 10 frames). temperature 0 = greedy.
    temperature: Optional[float] = field(
        default=None, metadata=described(f"0 or in [{TEMPERATURE_MIN:g}, {TEMPERATURE_MAX:g}], or null")
    )
    top_p: Optional[float] = field(default=None, metadata=described(f"in [{TOP_P_MIN:g}, 1] or null"))
    top_k: Optional[int] = field(default=None, metadata=described(f"in [0, {INT32_MAX}] (0 = off) or null"))
    repetition_penalty: Optional[float] = field(default=None, metadata=described("> 0 or null"))
    ras_window: Optional[int] = field(default=None, metadata=described(">= 0 or null"))
    # a row's seed is its `seed` column, else a stable hash of (this seed, row id)
    seed: int = 0

    def overrides(self) -> dict:
        """The values set here, over the family's upstream defaults (`upstream_sampling`)."""
        values = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "seed"}
        return {key: value for key, value in values.items() if value is not None}

    def validate(self) -> None:
        """The same bounds every row's own values meet in the actor, and the engine's sign
        checks: a bad run-wide value would fail every row. Upstream's defaults (the same for
        every family) stand in for null."""
        params = SamplingParams(**self.overrides())
        problem = sampling_problem(float(params.temperature), float(params.top_p), int(params.top_k))
        if problem:
            raise ConfigError(f"sampling.{problem}")
        try:
            params.validate()
        except ValueError as e:
            raise ConfigError(f"sampling.{e}") from None


@dataclass
class RunContext:
    """What the driver decides for this run that is no setting of the run config: the run's id
    (every output row's `run`), the input's directory (where clips are confined when
    data.audio_root is not set), the torch threads an actor may use, and where the crash
    guard's attempts ledger lives (null: no ledger)."""

    run_id: str = ""
    input_dir: Optional[str] = None
    threads: Optional[int] = None
    attempts_dir: Optional[str] = None


@dataclass
class RunGroups:
    """The run config's groups an actor reads, each its dataclass: the driver's schema
    (pipeline/config.py ChorusConfig) and ActorSettings both extend this, so the list of them
    is written once."""

    model: ModelSettings = field(default_factory=ModelSettings)
    data: DataSettings = field(default_factory=DataSettings)
    engine: EngineSettings = field(default_factory=EngineSettings)
    long_form: LongFormSettings = field(default_factory=LongFormSettings)
    sampling: SamplingSettings = field(default_factory=SamplingSettings)
    quality: QualitySettings = field(default_factory=QualitySettings)
    output: OutputSettings = field(default_factory=OutputSettings)
    cluster: ClusterSettings = field(default_factory=ClusterSettings)


@dataclass
class ActorSettings(RunGroups):
    """Everything a SynthActor is told, as one object: the run config's groups the actor reads
    (the same objects the driver validated, not copies of their keys) and the run context.
    Small, picklable, the same on every actor; parts read what they need from it
    (`settings.engine.codec_batch_rows`, `settings.cluster.block_timeout_s`) and copy nothing."""

    run: RunContext = field(default_factory=RunContext)

    def validate(self) -> None:
        """Each group is its dataclass (not a dict: each default lives once) and within its
        ranges; TypeError or ConfigError naming the group."""
        for name, kind in typing.get_type_hints(RunGroups).items():
            value = getattr(self, name)
            if not isinstance(value, kind):
                raise TypeError(
                    f"SynthActor's {name} must be a {kind.__name__} (actors/synth/settings.py; "
                    f"pipeline/run/actor_settings.py::actor_arguments builds them from the run config), got {type(value).__name__}"
                )
            value.validate()
