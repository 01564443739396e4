"""The run's configuration: one structured schema (dataclasses in Hydra's ConfigStore) that the
YAML groups under conf/ fill in. Because the schema is the base of the primary config, a typo
in a key or a value of the wrong type is rejected when Hydra composes, before anything runs.

Groups: model/ (checkpoint + codec), data/ (input table), engine/ (batching and frame
budget), long_form (keys only), sampling/, quality/ (checks, regeneration, ASR), output/,
cluster/ (Ray resources), bench/; and the export's and the report's own schemas (ExportConfig, ReportConfig).
The groups the actor receives (model, data, engine, long_form, sampling, quality, output,
cluster) are defined in actors/synth/settings.py, actors/synth/job_settings.py and
actors/quality/settings.py, torch- and Hydra-free, and reach it as those dataclasses; the
driver's own groups (bench, preview, export) are here. Each group's range checks are its
dataclass's `validate()`. The entry points hold the Hydra object and convert it once,
`typed(cfg)` (which runs every group's checks); the rest of the driver reads that ChorusConfig.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass, field, fields
from typing import Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf, open_dict

from actors import schema as S
from actors.bounds import at_least, check_bounds, described, one_of
from actors.errors import ConfigError
from actors.quality.settings import FLAGS
from actors.synth.job_settings import RayConnection
from actors.synth.presets import PRESET_GROUPS
from actors.synth.settings import RunGroups

from .location import absolute, check_writable, is_local, local_path
from .shipped import CONF_DIR, DEMO_DIR, PACKAGE_DIR, REPO_ROOT  # noqa: F401 (names the entry points read here)

RAY_JOB_ENV = "RAY_JOB_CONFIG_JSON_ENV_VAR"  # set by Ray in a job's driver process


@dataclass
class BenchSettings:
    """`chorus bench` (a synthesis run ignores this group)."""

    # true in every bench=... option (conf/bench/); pipeline.bench refuses to run without one
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
    # seed of the generated workload (the texts, references and which rows are long or dialogues)
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
    """`chorus preview` (a synthesis run ignores this group)."""

    # a bench.json (chorus bench) whose measured frames/s turn the plan's
    # estimated frames into estimated hours; null: no estimate
    bench: Optional[str] = None


@dataclass
class EncodeRefsSettings:
    """`chorus encode-refs` (a synthesis run ignores this group)."""

    # the table written, required: the input with its ref_codes column (a local path or a URI;
    # `chorus encode-refs OUT.parquet` sets it)
    output: Optional[str] = None


@dataclass
class ChorusConfig(RunGroups):
    """`chorus run`'s configuration (and preview's, bench's, encode-refs'): the groups an actor
    reads (RunGroups, actors/synth/settings.py) and the driver's own commands' groups."""

    bench: BenchSettings = field(default_factory=BenchSettings)
    preview: PreviewSettings = field(default_factory=PreviewSettings)
    encode_refs: EncodeRefsSettings = field(default_factory=EncodeRefsSettings)


EXPORT_FORMATS = ("files", "webdataset", "lhotse", "hf", "nemo")
EXPORT_STATUSES = (S.STATUS_OK, S.STATUS_REJECTED)  # error rows have no audio to export
# what a training set holds: the row's key, what is said, the audio and its length, who says it,
# in which language (as ASR decoded it); the other output columns (timings, provenance, codes,
# the quality metrics) go out only when export.columns names them
TRAINING_COLUMNS = (S.ID, S.TEXT, S.AUDIO, S.AUDIO_SECONDS, S.SPEAKER, S.ASR_LANGUAGE)
_NAME = r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}"  # a prefix: a file name's start
_SPLIT_NAME = r"[A-Za-z0-9][A-Za-z0-9_]{0,63}"  # a split: also a Hub split name (no '-', no '.')


@dataclass
class ExportSettings:
    """`chorus export`'s own group (pipeline/export/)."""

    # files: one audio file per row + files.csv; webdataset: <prefix>-NNNNNN.tar; lhotse: Lhotse
    # Shar (cuts.NNNNNN.jsonl.gz + recording.NNNNNN.tar); hf: data/train-NNNNN-of-NNNNN.parquet +
    # README.md; nemo: audio/<id>.flac + train_manifest.json (NeMo's JSON-lines manifest)
    format: str = field(default="files", metadata=one_of(*EXPORT_FORMATS))
    # where it goes (local or URI); null = <output.dir>/<format> (files: <output.dir>/audio)
    dir: Optional[str] = None
    # start over: delete what an earlier export wrote there (only its own files)
    overwrite: bool = False
    # the rows exported: by status, then by the quality columns (null: no threshold); a row
    # without the metric's value fails its threshold
    status: list = field(
        default_factory=lambda: [S.STATUS_OK], metadata=described(f"some of {', '.join(EXPORT_STATUSES)}")
    )
    min_mos: Optional[float] = None
    min_speaker_similarity: Optional[float] = None
    max_wer: Optional[float] = None
    exclude_flags: list = field(default_factory=list, metadata=described("quality flags (quality.reject's)"))
    # the output columns each exported row carries (id and audio always): a training set's by
    # default; name others (wer, speaker_similarity, turns, ...) to add them
    columns: list = field(
        default_factory=lambda: list(TRAINING_COLUMNS), metadata=described("output columns (actors/schema.py)")
    )
    # named splits and their shares of the rows, e.g. {train: 0.98, validation: 0.01, test: 0.01};
    # a row's split is fixed by a hash of its id, so it stays put as the dataset grows. null: one
    # split, train (webdataset: export.prefix)
    splits: Optional[dict[str, float]] = field(default=None, metadata=described("shares summing to 1"))
    # the dataset card's (hf) `license` (a Hub licence id, e.g. cc-by-4.0) and `language` (codes, e.g. [en])
    license: Optional[str] = None
    language: list = field(default_factory=list, metadata=described("language codes"))
    # a shard's rows and bytes (its samples' audio and metadata) at most; null: the format's
    # own recommendation (pipeline/export/formats.py)
    shard_rows: Optional[int] = field(default=None, metadata=at_least(1, or_null=True))
    shard_bytes: Optional[int] = field(default=None, metadata=at_least(1, or_null=True))
    # webdataset's shard names without export.splits: <prefix>-000000.tar, ...
    prefix: str = field(default="train", metadata=described("letters, digits, '_' or '-'; 1-64 characters"))
    # periodic progress line, seconds
    progress_interval_s: float = 10.0

    def validate(self) -> None:
        check_bounds(self, "export")
        wrong = [s for s in self.status if s not in EXPORT_STATUSES]
        if wrong or not self.status:
            raise ConfigError(
                f"export.status must list some of {', '.join(EXPORT_STATUSES)} (error rows have no audio), got "
                f"{list(self.status)}"
            )
        unknown = [f for f in self.exclude_flags if f not in FLAGS]
        if unknown:
            raise ConfigError(f"export.exclude_flags: unknown flag(s) {unknown}; the flags are {', '.join(FLAGS)}")
        if not re.fullmatch(_NAME, self.prefix):
            raise ConfigError(
                f"export.prefix must be letters, digits, '_' or '-' (a file name's start), got {self.prefix!r}"
            )
        unknown = [c for c in self.columns if c not in S.OUTPUT_SCHEMA.names]
        if unknown:
            raise ConfigError(
                f"export.columns: {unknown} are not output columns; choose from {', '.join(S.OUTPUT_SCHEMA.names)}"
            )
        self._validate_splits()

    def _validate_splits(self) -> None:
        if self.splits is None:
            return
        shares = dict(self.splits)
        bad = [name for name, share in shares.items() if not re.fullmatch(_SPLIT_NAME, str(name)) or not 0 < share <= 1]
        if not shares or bad or abs(sum(shares.values()) - 1.0) > 1e-6:
            raise ConfigError(
                f"export.splits must name splits (letters, digits or '_') with shares in (0, 1] summing to 1, "
                f"e.g. {{train: 0.98, validation: 0.01, test: 0.01}}; got {shares}"
            )

    def export_columns(self) -> list:
        """The columns each exported row carries: export.columns in order, id first and audio
        last where it does not name them."""
        named = list(dict.fromkeys(self.columns))
        return [*([S.ID] if S.ID not in named else []), *named, *([S.AUDIO] if S.AUDIO not in named else [])]

    def split_shares(self) -> Optional[dict]:
        return None if self.splits is None else {str(k): float(v) for k, v in dict(self.splits).items()}


def export_settings(**keys) -> ExportSettings:
    """The export group with `keys` set, checked (a caller without a command line)."""
    chosen = ExportSettings(**keys)
    chosen.validate()
    return chosen


@dataclass
class ExportSource:
    """The run output that `chorus export` (and `chorus report`) reads."""

    # the chorus output directory (local or URI), as given to the run's output.dir; a bare
    # argument sets it (`chorus export OUT`)
    dir: str = MISSING


@dataclass
class ExportCluster(RayConnection):
    """The Ray cluster an export runs on, when it is large enough to need one."""

    # an output of at least this many rows is exported as Ray Data work (one Ray task per unit,
    # across the cluster); a smaller one in this process, where starting Ray would cost more
    distributed_rows: int = 20_000


@dataclass
class ExportConfig:
    """`chorus export`'s configuration: this schema and the command line (no YAML)."""

    output: ExportSource = field(default_factory=ExportSource)
    export: ExportSettings = field(default_factory=ExportSettings)
    cluster: ExportCluster = field(default_factory=ExportCluster)


@dataclass
class ReportSettings:
    """`chorus report`'s own group: the page written into the output (pipeline/report/page.py)."""

    # the page's title
    title: str = "chorus run"
    # ok rows whose audio the page embeds, playable
    max_audio_rows: int = field(default=12, metadata=at_least(0))
    # a benchmark's JSON (chorus bench writes bench.json) whose configurations the page shows
    # as a table; null: none
    bench: Optional[str] = None


@dataclass
class ReportConfig:
    """`chorus report`'s configuration: this schema and the command line (no YAML)."""

    output: ExportSource = field(default_factory=ExportSource)
    report: ReportSettings = field(default_factory=ReportSettings)


# the groups with range checks, in the order they are checked: those an actor reads (bench and
# preview have none)
CHECKED_GROUPS = tuple(f.name for f in fields(RunGroups))


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
    have replaced a group since `typed`), then what depends on where the run is (an output that
    cannot be written, a relative output inside a Ray Job, a checkpoint directory without its
    config or codec)."""
    validate(config)
    output_dir = config.output.dir
    check_writable(output_dir, "output.dir")
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


def _location_tag(path: str) -> str:
    """A short hash of where the input is (a local path made absolute, a URI as it is): the
    default output folder is `<stem>-<tag>`, so two inputs of one file name never share one."""
    where = absolute(str(path)) or ""
    return hashlib.blake2b(where.encode("utf-8", "surrogatepass"), digest_size=3).hexdigest()


def register() -> None:
    """Resolvers and the schema; idempotent (tests compose many times in one process)."""
    resolvers = {
        "chorus_demo": lambda name: str(DEMO_DIR / name),
        "chorus_stem": _input_stem,
        "chorus_where": _location_tag,
    }
    for name, fn in resolvers.items():
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, fn)
    store = ConfigStore.instance()
    store.store(name="chorus_schema", node=ChorusConfig)
    for group, presets in PRESET_GROUPS.items():  # what conf/<group>/*.yaml may select
        for name, values in presets.items():
            store.store(group=group, name=name, node=values)


register()


def compose(overrides: Optional[list[str]] = None) -> DictConfig:
    """The run config for command-line style overrides, composed from conf/'s groups (the
    `chorus` command, tests, notebooks)."""
    return compose_with_choices(overrides)[0]


def compose_with_choices(overrides: Optional[list[str]] = None) -> tuple[DictConfig, dict[str, str]]:
    """`compose(overrides)` and the option chosen in each of conf/'s groups (`engine` -> `cpu`)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    if GlobalHydra.instance().is_initialized():
        GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        cfg = hydra_compose(config_name="config", overrides=list(overrides or []), return_hydra_config=True)
    choices = {
        group: str(option)
        for group, option in cfg.hydra.runtime.choices.items()
        if option is not None and (CONF_DIR / group).is_dir()
    }
    with open_dict(cfg):
        del cfg["hydra"]
    return cfg, choices


def group_options(group: str) -> list[str]:
    """The options of one of conf/'s groups (its YAML files' names); [] for a key that is no group."""
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml")) if (CONF_DIR / group).is_dir() else []
