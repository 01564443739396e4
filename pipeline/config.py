"""The run's configuration: one structured schema (dataclasses in Hydra's ConfigStore) that the
YAML groups under conf/ fill in. Because the schema is the base of the primary config, a typo
in a key or a value of the wrong type is rejected when Hydra composes, before anything runs.

Groups: model/ (checkpoint + codec), data/ (input table), engine/ (batching and frame
budget), long_form (keys only), sampling/, quality/ (checks, regeneration, ASR), output/,
cluster/ (Ray resources), bench/; and `python -m pipeline.export`'s own schema (ExportConfig). The groups the actor receives (model, data, engine,
long_form, sampling, quality) are defined in
actors/settings.py, torch- and Hydra-free, and reach it as those dataclasses
(`OmegaConf.to_object`); the driver's own groups are here. Each group's range checks are its
dataclass's `validate()`. The entry points hold the Hydra object and convert it once,
`typed(cfg)` (which runs every group's checks); the rest of the driver reads that ChorusConfig.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

from actors import schema as S
from actors.demo import cache_root
from actors.quality.flags import FLAGS
from actors.settings import (
    ConfigError,
    DataConfig,
    EngineSettings,
    LongFormSettings,
    ModelConfig,
    QualitySettings,
    SamplingSettings,
)

from .location import is_local, local_path
from .names import RUNS_DIR

REPO_ROOT = Path(__file__).resolve().parents[1]
CONF_DIR = REPO_ROOT / "conf"
RAY_JOB_ENV = "RAY_JOB_CONFIG_JSON_ENV_VAR"  # set by Ray in a job's driver process


@dataclass
class OutputSettings:
    # local path or URI; relative paths are under the working directory
    dir: str = "outputs/${data.name}"
    # keep the generated codes next to the audio (re-decodable, small)
    keep_codes: bool = True
    # mono: every row's audio is one channel; per_speaker: a dialogue row's audio has one
    # channel per voice, each voice's turns on its channel and exact silence elsewhere (plain
    # rows stay mono; FLAC holds at most 8 channels)
    channels: str = S.CHANNELS_MONO
    # true: delete what the output holds and start over; false: resume it
    overwrite: bool = False
    # periodic progress line (when there is no terminal for a bar), seconds
    progress_interval_s: float = 15.0
    # auto: a bar on a terminal, log lines otherwise
    progress_bar: str = "auto"
    # the driver's lease on output.dir (one driver at a time): heartbeat period, and after how
    # long without one a lease held from another host counts as dead (same host: pid checked);
    # a driver whose renewals fail for half of lease_stale_s stops (pipeline/output/lease.py)
    lease_heartbeat_s: float = 5.0
    lease_stale_s: float = 60.0
    # a rerun over rows whose content (text, reference, settings, model) changed since they
    # were written: redo them (and say so), or refuse to run
    on_change: str = "redo"
    # a rerun redoes error rows whose cause may be gone (I/O, timeout, internal); true: all
    retry_errors: bool = False
    # a rerun keeps rows whose every attempt failed quality.reject (status rejected); true: redo
    # them (worth it after raising quality.max_attempts or changing the model)
    retry_rejected: bool = False
    # finished blocks are packed into shards of about this many bytes, while the job runs and
    # at its end (pipeline/output/shards.py), and of at most this many rows
    shard_bytes: int = 512 * 1024 * 1024
    shard_rows: int = 100_000

    def validate(self) -> None:
        if self.shard_bytes < 1 or self.shard_rows < 1:
            raise ConfigError(
                f"output.shard_bytes and output.shard_rows must be >= 1, got {self.shard_bytes} and {self.shard_rows}"
            )
        if self.channels not in S.CHANNEL_CHOICES:
            raise ConfigError(f"output.channels must be one of {', '.join(S.CHANNEL_CHOICES)}, got {self.channels!r}")
        if self.on_change not in ("redo", "refuse"):
            raise ConfigError(f"output.on_change must be redo or refuse, got {self.on_change!r}")
        if not 0 < self.lease_heartbeat_s <= self.lease_stale_s / 4:
            raise ConfigError(
                f"output.lease_heartbeat_s must be > 0 and at most a quarter of output.lease_stale_s (a failed "
                f"renewal is tried at every beat until half of it has passed), got {self.lease_heartbeat_s:g} "
                f"and {self.lease_stale_s:g}"
            )
        if self.progress_bar not in ("auto", "on", "off"):
            raise ConfigError(f"output.progress_bar must be auto, on or off, got {self.progress_bar!r}")


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
    # rows the job's read may run ahead of the rows written (pipeline/run/readahead.py); null =
    # three times what the actors hold at once (num_actors x blocks per actor x rows_per_block)
    read_ahead_rows: Optional[int] = None
    # inputs of at least this many rows are planned as distributed Ray Data work (hash
    # shuffles by id and ref_id); smaller ones in-process, where a shuffle's start-up would
    # cost more than the planning (same decisions either way; 0 = always distributed)
    distributed_plan_rows: int = 100_000
    # a dead actor (crash, OOM) is restarted and its block retried, a bounded number of times
    # (Ray Data's default is forever); a block that killed its actor this many times has its
    # rows run alone, and the row that kills it alone becomes an error row (quarantined).
    # max_actor_restarts null = 10 + (crash_quarantine_after + 1) per 100 blocks an actor takes
    # (pipeline/run/synthesis.py actor_restarts): room for a few such rows in a long job.
    # max_task_retries null = as long as the block's actor restarts (bounded above): Ray counts
    # every try at an actor on a lost node until it notices the loss (15-30 s with its default
    # health checks), and 4 tries were spent within that and failed the job (measured, Ray 2.60)
    max_actor_restarts: Optional[int] = None
    max_task_retries: Optional[int] = None
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

    def validate(self) -> None:
        if self.num_actors < 1:
            raise ConfigError("cluster.num_actors must be >= 1")
        if self.cpus_per_actor < 0 or self.gpus_per_actor < 0:
            raise ConfigError("cluster.cpus_per_actor and cluster.gpus_per_actor must be >= 0")
        if self.rows_per_block < 1:
            raise ConfigError("cluster.rows_per_block must be >= 1")
        if self.read_ahead_rows is not None and self.read_ahead_rows < 1:
            raise ConfigError("cluster.read_ahead_rows must be >= 1 (or null: from the actors' blocks)")
        if self.distributed_plan_rows < 0:
            raise ConfigError("cluster.distributed_plan_rows must be >= 0")
        retries = self.max_task_retries
        if self.crash_quarantine_after < 1 or (retries is not None and retries <= self.crash_quarantine_after):
            raise ConfigError(
                "cluster.max_task_retries must exceed cluster.crash_quarantine_after (>= 1): a block is retried "
                "crash_quarantine_after times, then once more row by row to find the row that kills its actor"
            )
        if self.max_actor_restarts is not None and self.max_actor_restarts < 0:
            raise ConfigError("cluster.max_actor_restarts must be >= 0")
        if self.crash_on_batch and not self.crash_marker:
            raise ConfigError("cluster.crash_on_batch needs cluster.crash_marker (it makes the crash happen once)")


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
    # share of rows that are dialogues (2-3 of the demo's voices, 2-4 turns; model=demo_s2 or an
    # S2 checkpoint); above 0 every configuration runs twice: the dialogues, then the same
    # texts as single-voice rows (the first voice), so the cost of per-turn segments shows
    dialogue_fraction: float = 0.0
    seed: int = 0
    # the sweep: every (actors, slots) pair runs end to end on the same rows
    actors: list[int] = field(default_factory=lambda: [1])
    slots: list[int] = field(default_factory=lambda: [16])
    # also run the one-row-at-a-time engine loop (1 actor, 1 slot): the ratio's denominator
    baseline: bool = True
    # also run each configuration's rows with quality.max_attempts=1: the rows regeneration
    # saved (rejected there, ok here) and what it cost in rows/s (bench=quality)
    single_attempt_pass: bool = False


@dataclass
class PreviewSettings:
    """`python -m pipeline.preview` (a synthesis run ignores this group)."""

    # a bench.json (python -m pipeline.bench) whose measured frames/s turn the plan's
    # estimated frames into estimated hours; null: no estimate
    bench: Optional[str] = None


@dataclass
class ChorusConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    engine: EngineSettings = field(default_factory=EngineSettings)
    long_form: LongFormSettings = field(default_factory=LongFormSettings)
    sampling: SamplingSettings = field(default_factory=SamplingSettings)
    quality: QualitySettings = field(default_factory=QualitySettings)
    output: OutputSettings = field(default_factory=OutputSettings)
    cluster: ClusterSettings = field(default_factory=ClusterSettings)
    bench: BenchSettings = field(default_factory=BenchSettings)
    preview: PreviewSettings = field(default_factory=PreviewSettings)


EXPORT_FORMATS = ("files", "webdataset", "lhotse", "hf")
EXPORT_STATUSES = (S.STATUS_OK, S.STATUS_REJECTED)  # error rows have no audio to export


@dataclass
class ExportSettings:
    """`python -m pipeline.export`'s own group (pipeline/export/)."""

    # files: one audio file per row + files.csv; webdataset: <prefix>-NNNNNN.tar; lhotse: Lhotse
    # Shar (cuts.NNNNNN.jsonl.gz + recording.NNNNNN.tar); hf: data/train-NNNNN-of-NNNNN.parquet + README.md
    format: str = "files"
    # where it goes (local or URI); null = <output.dir>/<format> (files: <output.dir>/audio)
    dir: Optional[str] = None
    # start over: delete what an earlier export wrote there (only its own files)
    overwrite: bool = False
    # the rows exported: by status, then by the quality columns (null: no threshold); a row
    # without the metric's value fails its threshold
    status: list = field(default_factory=lambda: [S.STATUS_OK])
    min_mos: Optional[float] = None
    min_speaker_similarity: Optional[float] = None
    max_wer: Optional[float] = None
    exclude_flags: list = field(default_factory=list)
    # a shard's rows and bytes (its samples' audio and metadata) at most; null: the format's
    # own recommendation (pipeline/export/formats.py)
    shard_rows: Optional[int] = None
    shard_bytes: Optional[int] = None
    # webdataset's shard names: <prefix>-000000.tar, ...
    prefix: str = "train"
    progress_interval_s: float = 10.0

    def validate(self) -> None:
        if self.format not in EXPORT_FORMATS:
            raise ConfigError(f"export.format must be one of {', '.join(EXPORT_FORMATS)}, got {self.format!r}")
        wrong = [s for s in self.status if s not in EXPORT_STATUSES]
        if wrong or not self.status:
            raise ConfigError(
                f"export.status must list some of {', '.join(EXPORT_STATUSES)} (error rows have no audio), got "
                f"{list(self.status)}"
            )
        unknown = [f for f in self.exclude_flags if f not in FLAGS]
        if unknown:
            raise ConfigError(f"export.exclude_flags: unknown flag(s) {unknown}; the flags are {', '.join(FLAGS)}")
        for key in ("shard_rows", "shard_bytes"):
            if getattr(self, key) is not None and getattr(self, key) < 1:
                raise ConfigError(
                    f"export.{key} must be >= 1 (or null: the format's default), got {getattr(self, key)}"
                )
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}", self.prefix):
            raise ConfigError(
                f"export.prefix must be letters, digits, '_' or '-' (a file name's start), got {self.prefix!r}"
            )


def export_settings(**keys) -> ExportSettings:
    """The export group with `keys` set, checked (a caller without a command line)."""
    chosen = ExportSettings(**keys)
    chosen.validate()
    return chosen


@dataclass
class ExportSource:
    # the chorus output directory (local or URI), as given to the run's output.dir
    dir: str = MISSING


@dataclass
class ExportCluster:
    # null: RAY_ADDRESS / a running `ray start` cluster / a new local one; "local": always new
    address: Optional[str] = None
    # CPUs of a local Ray this command starts (null: all of the machine's)
    num_cpus: Optional[int] = None
    # an output of at least this many rows is exported as Ray Data work (one Ray task per unit,
    # across the cluster); a smaller one in this process, where starting Ray would cost more
    distributed_rows: int = 20_000


@dataclass
class ExportConfig:
    output: ExportSource = field(default_factory=ExportSource)
    export: ExportSettings = field(default_factory=ExportSettings)
    cluster: ExportCluster = field(default_factory=ExportCluster)


# the groups with range checks, in the order they are checked
CHECKED_GROUPS = ("model", "data", "engine", "long_form", "sampling", "quality", "output", "cluster")


def typed(cfg: DictConfig) -> ChorusConfig:
    """The run config as the one object the driver reads (the entry points convert Hydra's
    once): resolved, every group checked (`validate`; ConfigError, MissingMandatoryValue). A
    config built without the schema (OmegaConf.create) is typed by it first, as Hydra would."""
    if OmegaConf.get_type(cfg) is not ChorusConfig:
        cfg = OmegaConf.merge(OmegaConf.structured(ChorusConfig), cfg)
    config = OmegaConf.to_object(cfg)
    validate(config)
    return config


def compose_typed(overrides: Optional[list[str]] = None) -> ChorusConfig:
    """`typed(compose(overrides))`, in one call (tests, scripts, notebooks)."""
    return typed(compose(overrides))


def validate(config: ChorusConfig) -> None:
    """Every group's range checks (its dataclass's `validate()`); ConfigError names the key."""
    for group in CHECKED_GROUPS:
        getattr(config, group).validate()


def as_yaml(config: ChorusConfig) -> str:
    """The snapshot a run records: the text `OmegaConf.to_yaml(cfg, resolve=True)` gives."""
    return OmegaConf.to_yaml(OmegaConf.structured(config))


def in_ray_job() -> bool:
    return RAY_JOB_ENV in os.environ


def check_for_run(config: ChorusConfig) -> None:
    """What can be checked before Ray starts: the groups' range checks (again: a caller may
    have replaced a group since `typed`), then what depends on where the run is (a relative
    output inside a Ray Job, a checkpoint directory without its config or codec)."""
    validate(config)
    output_dir = config.output.dir
    if in_ray_job() and is_local(output_dir) and not os.path.isabs(os.path.expanduser(output_dir)):
        raise ConfigError(
            f"output.dir={output_dir!r} is relative: inside a Ray Job that is the job's "
            f"temporary working directory, deleted afterwards; pass an absolute path or a URI"
        )
    checkpoint = config.model.checkpoint
    if checkpoint is not None and is_local(checkpoint):
        if not os.path.isfile(os.path.join(local_path(checkpoint), "config.json")):
            raise ConfigError(f"model.checkpoint={checkpoint!r} is not a checkpoint directory (no config.json there)")
        codec = config.model.codec or os.path.join(checkpoint, "codec.pth")
        if is_local(codec) and not os.path.exists(local_path(codec)):
            raise ConfigError(f"codec {codec!r} does not exist (set model.codec)")


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
        return str(Path(local_path(output_dir)) / RUNS_DIR / stamp)
    root = cache_root() / "runs" if in_ray_job() else Path("outputs") / RUNS_DIR
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
