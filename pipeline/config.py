"""The run's configuration: one structured schema (dataclasses in Hydra's ConfigStore) that the
YAML groups under conf/ fill in. Because the schema is the base of the primary config, a typo
in a key or a value of the wrong type is rejected when Hydra composes, before anything runs.

Groups: model/ (checkpoint + codec), data/ (input table), engine/ (batching and frame
budget), sampling/, output/, cluster/ (Ray resources), bench/.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

from actors import schema
from actors.engine.settings import EngineConfig

from .output import is_local, local_path

REPO_ROOT = Path(__file__).resolve().parents[1]
CONF_DIR = REPO_ROOT / "conf"
RAY_JOB_ENV = "RAY_JOB_CONFIG_JSON_ENV_VAR"  # set by Ray in a job's driver process


class ConfigError(ValueError):
    """Settings that cannot work (alone or together); found before any work starts."""


@dataclass
class ModelConfig:
    # recorded in every output row's `model` column
    name: str = "demo-s1-tiny"
    # checkpoint directory (config.json + weights + tokenizer), required; null = the built-in
    # demo, a tiny random checkpoint built on first use into the cache dir (model=demo)
    checkpoint: Optional[str] = MISSING
    # codec.pth or a directory holding it; null = codec.pth inside `checkpoint` (or the demo's)
    codec: Optional[str] = None
    # auto = cuda when the actor was granted a GPU, else cpu
    device: str = "auto"
    # auto = bfloat16 on GPU, float32 on CPU
    dtype: str = "auto"
    codec_dtype: str = "float32"
    # where the demo checkpoint is built on each actor's node (null = ~/.cache/chorus there);
    # the driver's $CHORUS_CACHE, when set, is passed on
    cache_dir: Optional[str] = "${oc.env:CHORUS_CACHE,null}"


@dataclass
class InputColumns:
    """The table's name for each input column (actors/schema.py); defaults are the canonical ones."""

    id: str = schema.ID
    text: str = schema.TEXT
    ref_audio: str = schema.REF_AUDIO
    ref_audio_path: str = schema.REF_AUDIO_PATH
    ref_text: str = schema.REF_TEXT
    ref_id: str = schema.REF_ID
    ref_codes: str = schema.REF_CODES
    speaker: str = schema.SPEAKER
    seed: str = schema.SEED
    max_frames: str = schema.MAX_FRAMES
    temperature: str = schema.TEMPERATURE
    top_p: str = schema.TOP_P
    top_k: str = schema.TOP_K


@dataclass
class DataConfig:
    # a Parquet file, a directory of them or a glob; local or any URI pyarrow reads (s3://, gs://, ...)
    path: str = MISSING
    # short name of the input, used in the default output directory
    name: str = "${chorus_stem:${.path}}"
    columns: InputColumns = field(default_factory=InputColumns)
    # the directory (or URI prefix) every ref_audio_path must lie in, relative paths start
    # there; null = the input's directory
    audio_root: Optional[str] = None
    # longest reference clip accepted, seconds
    max_reference_seconds: float = 30.0
    # longest row text synthesised (characters); a longer row is an error row, the run goes on
    max_text_chars: int = 50_000
    # per-row limits: a clip's size (checked before it is read), the time to fetch and decode
    # it, a text's size (checked before it is tokenized)
    max_reference_bytes: int = 50 * 1024 * 1024
    reference_timeout_s: float = 60.0
    max_text_bytes: int = 64 * 1024
    # false: spellings of the tokenizer's special tokens in text (`<|im_end|>`, ...) are
    # escaped and read as plain characters; true: they act as control tokens (power users)
    allow_special_tokens: bool = False
    # URI schemes a ref_audio_path may use (local paths and file:// always work)
    uri_schemes: list[str] = field(default_factory=lambda: ["s3", "gs", "gcs", "hdfs", "abfs", "abfss"])


@dataclass
class EngineSettings(EngineConfig):
    """The engine group: the engine's own settings, each default once in `EngineConfig`
    (actors/engine/settings.py: slots, KV positions, prefill chunk, prefix cache, compile,
    ...), plus what the actor decides around the engine for each row."""

    # frame budget per row (21.5 frames = 1 s of audio); a `max_frames` column overrides it
    max_frames: int = 1024
    # when set, a row's budget is min(max_frames, min_frames + frames_per_char * len(text))
    frames_per_char: Optional[float] = None
    min_frames: int = 8
    stop_on_eos: bool = True
    # rows per codec decode call, and how long the finisher waits for that many while the
    # engine still has rows live (one call for several rows costs about what one row's does)
    codec_batch_rows: int = 8
    codec_wait_ms: float = 200.0
    # encoded references each actor keeps (LRU, keyed by ref_id or the clip's bytes)
    reference_cache: int = 256
    # Ray Data blocks one actor holds at once: its engine loop takes rows from all of them, so
    # a slot freed at the end of one block is refilled from the next at once. null = enough
    # blocks of cluster.rows_per_block rows to cover max_rows + feed_queue_rows, plus two
    max_concurrent_blocks: Optional[int] = None
    # rows an actor holds beyond its slots, prepared and waiting for one (back-pressure: a
    # block's rows enter the engine's queue only while fewer than max_rows + this are in flight)
    feed_queue_rows: int = 8

    def validate(self) -> None:
        """EngineConfig's range checks and the per-row settings'; raises ConfigError."""
        try:
            super().validate()
        except ValueError as e:
            raise ConfigError(str(e)) from None
        for key in ("max_frames", "min_frames", "reference_cache", "codec_wait_ms"):
            if getattr(self, key) < 0:
                raise ConfigError(f"engine.{key} must be >= 0, got {getattr(self, key)}")
        if self.codec_batch_rows < 1:
            raise ConfigError(f"engine.codec_batch_rows must be >= 1, got {self.codec_batch_rows}")
        if self.frames_per_char is not None and self.frames_per_char < 0:
            raise ConfigError(f"engine.frames_per_char must be >= 0 or null, got {self.frames_per_char}")


@dataclass
class LongFormSettings:
    """Rows longer than one engine request are generated as a chain of segments (README,
    "Long text"): cut at speaker turns, sentence ends, clause marks, whitespace."""

    # most UTF-8 bytes of text per segment (upstream's chunk_length default); the engine's
    # max_tokens, the reference's length and the frame budget may make segments smaller
    segment_bytes: int = 300
    # most speaker turns grouped into one segment (upstream: 5)
    max_turns: int = 5


@dataclass
class SamplingSettings:
    # null = upstream's default for the model family (S1: 0.8/0.8/30 + repetition penalty 1.1;
    # S2: 0.8/0.8/30 + repetition-aware sampling over 10 frames). temperature 0 = greedy.
    temperature: Optional[float] = None
    top_p: Optional[float] = None
    top_k: Optional[int] = None
    repetition_penalty: Optional[float] = None
    ras_window: Optional[int] = None
    # a row's seed is its `seed` column, else a stable hash of (this seed, row id)
    seed: int = 0


@dataclass
class OutputSettings:
    # local path or URI; relative paths are under the working directory
    dir: str = "outputs/${data.name}"
    # keep the generated codes next to the audio (re-decodable, small)
    keep_codes: bool = True
    # true: delete what the output holds and start over; false: resume it
    overwrite: bool = False
    # periodic progress line (when there is no terminal for a bar), seconds
    progress_interval_s: float = 15.0
    # auto: a bar on a terminal, log lines otherwise
    progress_bar: str = "auto"
    # the driver's lease on output.dir (one driver at a time): heartbeat period, and after how
    # long without one a lease held from another host counts as dead (same host: pid checked)
    lease_heartbeat_s: float = 5.0
    lease_stale_s: float = 60.0
    # a rerun over rows whose content (text, reference, settings, model) changed since they
    # were written: redo them (and say so), or refuse to run
    on_change: str = "redo"
    # a rerun redoes error rows whose cause may be gone (I/O, timeout, internal); true: all
    retry_errors: bool = False


@dataclass
class ClusterSettings:
    # null: RAY_ADDRESS / a running `ray start` cluster / a new local one; "local": always new
    address: Optional[str] = None
    # CPUs of a Ray started here (null = all)
    num_cpus: Optional[int] = None
    num_actors: int = 1
    # fractional on CPU machines: reads and writes need CPU too, never give actors all of it
    cpus_per_actor: float = 0.5
    gpus_per_actor: float = 0.0
    # torch threads per actor; null = max(1, floor(cpus_per_actor))
    threads_per_actor: Optional[int] = None
    # rows per block = rows per actor call; small blocks spread work over every actor
    rows_per_block: int = 16
    # a dead actor (crash, OOM) is restarted and its block retried, a bounded number of times
    # (Ray Data's default is forever); a block that killed its actor this many times has its
    # rows run alone, and the row that kills it alone becomes an error row (quarantined)
    max_actor_restarts: int = 10
    max_task_retries: int = 4
    crash_quarantine_after: int = 2
    # watchdog: an actor whose block runs longer than this is stuck and exits (then counts as
    # a crash above); null = no watchdog. Size it for the slowest block (rows_per_block rows
    # of engine.max_frames frames) on the slowest device
    block_timeout_s: Optional[float] = 3600.0
    # test hooks: the actor process exits hard on its N-th batch, once per marker file; or
    # whenever it processes the row with this id
    crash_on_batch: int = 0
    crash_marker: Optional[str] = None
    crash_on_id: Optional[str] = None


@dataclass
class BenchSettings:
    """`python -m pipeline.bench` (a synthesis run ignores this group)."""

    enabled: bool = False
    # generated workload: rows, mean words per text (lognormal), share of rows with a reference
    rows: int = 200
    text_words: float = 8.0
    reference_fraction: float = 0.5
    # share of rows that are long text (long_chars characters, generated in segments)
    long_fraction: float = 0.0
    long_chars: int = 3000
    seed: int = 0
    # the sweep: every (actors, slots) pair runs end to end on the same rows
    actors: list[int] = field(default_factory=lambda: [1])
    slots: list[int] = field(default_factory=lambda: [16])
    # also run the one-row-at-a-time engine loop (1 actor, 1 slot): the ratio's denominator
    baseline: bool = True


@dataclass
class ChorusConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    engine: EngineSettings = field(default_factory=EngineSettings)
    long_form: LongFormSettings = field(default_factory=LongFormSettings)
    sampling: SamplingSettings = field(default_factory=SamplingSettings)
    output: OutputSettings = field(default_factory=OutputSettings)
    cluster: ClusterSettings = field(default_factory=ClusterSettings)
    bench: BenchSettings = field(default_factory=BenchSettings)


def in_ray_job() -> bool:
    return RAY_JOB_ENV in os.environ


def _input_stem(path: str) -> str:
    """'data/demo/demo.parquet' -> 'demo'; 's3://b/set/*.parquet' -> 'set'."""
    parts = [p for p in str(path).replace("\\", "/").rstrip("/").split("/") if p]
    while parts and any(ch in parts[-1] for ch in "*?["):
        parts.pop()
    if not parts:
        return "input"
    stem = parts[-1]
    return stem[: -len(".parquet")] if stem.endswith(".parquet") else stem


def _hydra_run_dir(output_dir: str, stamp: str) -> str:
    """Hydra's own logs: under the output when it is local, else in a local run folder; never
    inside a Ray Job's working directory, which Ray deletes."""
    if is_local(output_dir):
        return str(Path(local_path(output_dir)) / "_runs" / stamp)
    root = Path.home() / ".cache" / "chorus" / "runs" if in_ray_job() else Path("outputs") / "_runs"
    return str(root / stamp)


def register() -> None:
    """Resolvers and the schema; idempotent (tests compose many times in one process)."""
    resolvers = {
        "chorus_repo": lambda rel: str(REPO_ROOT / rel),
        "chorus_stem": _input_stem,
        "chorus_run_dir": _hydra_run_dir,
    }
    for name, fn in resolvers.items():
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, fn)
    ConfigStore.instance().store(name="chorus_schema", node=ChorusConfig)


register()


def compose(overrides: Optional[list[str]] = None) -> DictConfig:
    """The run config for command-line style overrides, without starting a Hydra app (tests,
    export, notebooks)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    if GlobalHydra.instance().is_initialized():
        GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        return hydra_compose(config_name="config", overrides=list(overrides or []))


def to_plain(cfg: DictConfig) -> dict:
    """Resolved plain containers: what actors get and what the snapshot records."""
    return OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
