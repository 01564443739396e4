"""The settings of a run's job that the driver and the actors both read: the input table and
the per-row limits (data), the output (output) and the cluster (cluster). The actor receives
them inside ActorSettings (actors/synth/settings.py) as they are, not copied into fields of its
own; the driver's Hydra schema (pipeline/config.py) nests them.

Free of torch, Hydra and OmegaConf (the driver imports it): a required field is the string
"???", which OmegaConf reads as a missing value; `${...}` defaults are OmegaConf interpolations,
resolved before an actor sees them. Range checks are each dataclass's `validate()`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Optional

from actors import schema
from actors.bounds import above, at_least, check_bounds, described, one_of
from actors.errors import ConfigError

MISSING = "???"  # OmegaConf's mark of a required value (omegaconf.MISSING), without importing it

# the one spelling of a URI's scheme (`s3://...`), for clip paths and for data.uri_schemes
_URI = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://")


def uri_scheme(path: str) -> Optional[str]:
    """The lowercased scheme of a URI (`S3://b/k` -> "s3"); None for a plain path."""
    match = _URI.match(path)
    return match.group(1).lower() if match else None


@dataclass
class InputColumns:
    """The table's name for each input column (actors/schema.py); defaults are the canonical ones."""

    # each key: the input table's name for that column (data.columns.id=utt_id); the row's id,
    # unique, required
    id: str = schema.ID
    # the text to speak, required
    text: str = schema.TEXT
    # a reference clip's bytes (WAV/FLAC/OGG)
    ref_audio: str = schema.REF_AUDIO
    # a reference clip by path (within data.audio_root) or URI
    ref_audio_path: str = schema.REF_AUDIO_PATH
    # the transcript of the reference clip
    ref_text: str = schema.REF_TEXT
    # rows sharing one reference: encoded once per actor, its prompt prefix's KV reused
    ref_id: str = schema.REF_ID
    # the reference already encoded, [num_codebooks][frames]
    ref_codes: str = schema.REF_CODES
    # a dialogue row's voices (README "Dialogue rows")
    voices: str = schema.VOICES
    # a label copied to the output
    speaker: str = schema.SPEAKER
    # per-row overrides of the run's settings: the seed, the frame budget (model.budget) and the sampling
    # values
    seed: str = schema.SEED
    max_frames: str = schema.MAX_FRAMES
    temperature: str = schema.TEMPERATURE
    top_p: str = schema.TOP_P
    top_k: str = schema.TOP_K


@dataclass
class DataSettings:
    """The input table (path, name and columns: the driver's) and the per-row limits the actor
    applies: text is refused before it is tokenized, a clip before it is read, and a clip
    fetch/decode that takes longer than reference_timeout_s fails its rows."""

    # a Parquet file, a directory of them or a glob; local or any URI pyarrow reads (s3://, gs://, ...)
    path: str = MISSING
    # short name of the input, used in the default output directory
    name: str = "${chorus_stem:${.path}}"
    columns: InputColumns = field(default_factory=InputColumns)
    # the directory (or URI prefix) every ref_audio_path must lie in, relative paths start
    # there; null = the input's directory
    audio_root: Optional[str] = None
    # longest reference clip accepted, seconds
    max_reference_seconds: float = field(default=30.0, metadata=above(0))
    # longest row text synthesised (characters); a longer row is an error row, the run goes on
    max_text_chars: int = field(default=50_000, metadata=at_least(1))
    # per-row limits: a clip's size (checked before it is read), the time to fetch and decode
    # it, a text's size (checked before it is tokenized)
    max_reference_bytes: int = field(default=50 * 1024 * 1024, metadata=at_least(1))
    reference_timeout_s: float = field(default=60.0, metadata=above(0))
    # null = 4 x max_text_chars (UTF-8's widest character): every text within max_text_chars
    # passes, Chinese or Cyrillic as much as English
    max_text_bytes: Optional[int] = field(default=None, metadata=at_least(1, or_null=True))
    # false: spellings of the tokenizer's special tokens in text (`<|im_end|>`, ...) are
    # escaped and read as plain characters; true: they act as control tokens (power users)
    allow_special_tokens: bool = False
    # most voices a dialogue row may have (its `voices` list); each voice's clip and codes are
    # in every turn's prompt
    max_voices: int = field(default=8, metadata=at_least(1))
    # URI schemes a ref_audio_path may use (local paths and file:// always work)
    uri_schemes: list[str] = field(
        default_factory=lambda: ["s3", "gs", "gcs", "hdfs", "abfs", "abfss"],
        metadata=described("lowercase URI schemes, without '://'"),
    )

    @property
    def text_byte_limit(self) -> int:
        """The most UTF-8 bytes of text a row may have (checked before it is tokenized)."""
        return self.max_text_bytes if self.max_text_bytes is not None else 4 * self.max_text_chars

    def validate(self) -> None:
        check_bounds(self, "data")
        for scheme in self.uri_schemes:
            if uri_scheme(f"{scheme}://") != scheme:
                raise ConfigError(
                    f"data.uri_schemes must be lowercase URI schemes (s3, gs, ...) without '://', got {scheme!r}"
                )


@dataclass
class OutputSettings:
    """Where the output goes and what it holds, and how a rerun treats what is already there."""

    # local path or URI; relative paths are under the working directory. The default: the
    # input's name and a short hash of its location, so two inputs of one name never share it
    dir: str = "outputs/${data.name}-${chorus_where:${data.path}}"
    # keep the generated codes next to the audio (re-decodable, small)
    keep_codes: bool = True
    # mono: every row's audio is one channel; per_speaker: a dialogue row's audio has one
    # channel per voice, each voice's turns on its channel and exact silence elsewhere (plain
    # rows stay mono; FLAC holds at most 8 channels)
    channels: str = field(default=schema.CHANNELS_MONO, metadata=one_of(*schema.CHANNEL_CHOICES))
    # true: delete what the output holds and start over; false: resume it
    overwrite: bool = False
    # periodic progress line (when there is no terminal for a bar), seconds
    progress_interval_s: float = 15.0
    # auto: a bar on a terminal, log lines otherwise
    progress_bar: str = field(default="auto", metadata=one_of("auto", "on", "off"))
    # the driver's lease on output.dir (one driver at a time): heartbeat period, and after how
    # long without one a lease held from another host counts as dead (same host: pid checked);
    # a driver whose renewals fail for half of lease_stale_s stops (pipeline/output/lease.py)
    lease_heartbeat_s: float = field(default=5.0, metadata=described("> 0, at most lease_stale_s / 4"))
    lease_stale_s: float = field(default=60.0, metadata=described(">= 4 x lease_heartbeat_s"))
    # a rerun over rows whose content (text, reference, settings, model) changed since they
    # were written: redo them (and say so), or refuse to run
    on_change: str = field(default="redo", metadata=one_of("redo", "refuse"))
    # a rerun whose input no longer has rows the output holds (rows or files dropped from it):
    # keep them in the output, or prune them from its files; either way they are counted in
    # the log and summary.json and listed in removed-ids-<run>.txt
    on_removed: str = field(default="keep", metadata=one_of("keep", "prune"))
    # a rerun redoes error rows whose cause may be gone (I/O, timeout, internal); true: all
    retry_errors: bool = False
    # a rerun keeps rows whose every attempt failed quality.reject (status rejected); true: redo
    # them (worth it after raising quality.max_attempts or changing the model)
    retry_rejected: bool = False
    # a finished row is written within this many seconds, as a part with whatever else of its
    # block has finished by then: a block whose rows finish within it of each other is one part,
    # and a long row never holds back the rows beside it (actors/synth/blocks.py)
    write_within_s: float = field(default=5.0, metadata=at_least(0))
    # finished blocks are packed into shards of about this many bytes, while the job runs and
    # at its end (pipeline/output/shards.py), and of at most this many rows
    shard_bytes: int = field(default=512 * 1024 * 1024, metadata=at_least(1))
    shard_rows: int = field(default=100_000, metadata=at_least(1))
    # `chorus run` exits 3 when rows of the output end with one of these statuses (summary.json
    # counts them; docs/operations.md "Exit statuses"); [error]: rejected rows are accepted,
    # []: the run exits 0 whatever its rows' statuses
    fail_on: list[str] = field(
        default_factory=lambda: [schema.STATUS_ERROR, schema.STATUS_REJECTED],
        metadata=described(f"some of {schema.STATUS_ERROR}, {schema.STATUS_REJECTED}"),
    )

    def validate(self) -> None:
        check_bounds(self, "output")
        wrong = [s for s in self.fail_on if s not in (schema.STATUS_ERROR, schema.STATUS_REJECTED)]
        if wrong:
            raise ConfigError(
                f"output.fail_on lists the statuses that make the run exit 3: some of {schema.STATUS_ERROR}, "
                f"{schema.STATUS_REJECTED} (or []), got {wrong}"
            )
        if not 0 < self.lease_heartbeat_s <= self.lease_stale_s / 4:
            raise ConfigError(
                f"output.lease_heartbeat_s must be > 0 and at most a quarter of output.lease_stale_s (a failed "
                f"renewal is tried at every beat until half of it has passed), got {self.lease_heartbeat_s:g} "
                f"and {self.lease_stale_s:g}"
            )


@dataclass
class RayConnection:
    """Which Ray cluster a command joins or starts: the run's cluster group and the export's."""

    # null: RAY_ADDRESS / a running `ray start` cluster / a new local one; "local": always new
    address: Optional[str] = None
    # CPUs of a Ray started here (null = all of the machine's)
    num_cpus: Optional[int] = None


@dataclass
class ClusterSettings(RayConnection):
    """The Ray cluster the run joins or starts, the actors it runs there and the resources
    each is given, how the input is cut into blocks, and what happens when an actor dies."""

    # synthesis actors (each holds one engine, i.e. one model copy)
    num_actors: int = field(default=1, metadata=at_least(1))
    # Ray resources per actor; CPUs fractional on CPU machines: reads and writes need CPU too,
    # never give actors all of it
    cpus_per_actor: float = field(default=0.5, metadata=at_least(0))
    gpus_per_actor: float = field(default=0.0, metadata=at_least(0))
    # torch threads per actor; null = max(1, floor(cpus_per_actor))
    threads_per_actor: Optional[int] = None
    # rows per block = rows per actor call; small blocks spread work over every actor
    rows_per_block: int = field(default=16, metadata=at_least(1))
    # rows the job's read may run ahead of the rows written (pipeline/run/readahead.py); null =
    # three times what the actors hold at once (num_actors x blocks per actor x rows_per_block)
    read_ahead_rows: Optional[int] = field(default=None, metadata=at_least(1, or_null=True))
    # the stream runs as Ray Data datasets of at most this many blocks, one after another: Ray Data
    # keeps a record of every block a running dataset's operators output (pipeline/run/
    # executor_stats.py), so this bounds the driver's memory; each dataset starts its actors anew
    blocks_per_dataset: int = field(default=50_000, metadata=at_least(1))
    # inputs of at least this many rows are planned as distributed Ray Data work (hash
    # shuffles by id and ref_id); smaller ones in-process, where a shuffle's start-up would
    # cost more than the planning (same decisions either way; 0 = always distributed)
    distributed_plan_rows: int = field(default=100_000, metadata=at_least(0))
    # a dead actor (crash, OOM) is restarted and its block retried, a bounded number of times
    # (Ray Data's default is forever); a block that killed its actor this many times has its
    # rows run alone, and the row that kills it alone becomes an error row (quarantined).
    # max_actor_restarts null = 10 + (crash_quarantine_after + 1) per 100 blocks an actor takes
    # (pipeline/run/synthesis.py actor_restarts): room for a few such rows in a long job.
    # max_task_retries null = as long as the block's actor restarts (bounded above): Ray counts
    # every try at an actor on a lost node until it notices the loss (15-30 s with its default
    # health checks), and 4 tries were spent within that and failed the job (measured, Ray 2.60)
    max_actor_restarts: Optional[int] = field(default=None, metadata=at_least(0, or_null=True))
    max_task_retries: Optional[int] = field(default=None, metadata=described("> crash_quarantine_after, or null"))
    crash_quarantine_after: int = field(default=2, metadata=described(">= 1, < max_task_retries"))
    # watchdog: an actor whose block runs longer than this is stuck and exits (then counts as
    # a crash above); null = no watchdog. Size it for the slowest block (rows_per_block rows
    # of model.budget.max_frames frames) on the slowest device
    block_timeout_s: Optional[float] = 3600.0
    # test hooks: the actor process exits hard on its N-th batch, once per marker file; or
    # whenever it processes the row with this id
    crash_on_batch: int = 0
    crash_marker: Optional[str] = None
    crash_on_id: Optional[str] = None

    def validate(self) -> None:
        check_bounds(self, "cluster")
        retries = self.max_task_retries
        if self.crash_quarantine_after < 1 or (retries is not None and retries <= self.crash_quarantine_after):
            raise ConfigError(
                "cluster.max_task_retries must exceed cluster.crash_quarantine_after (>= 1): a block is retried "
                "crash_quarantine_after times, then once more row by row to find the row that kills its actor"
            )
        if self.crash_on_batch and not self.crash_marker:
            raise ConfigError("cluster.crash_on_batch needs cluster.crash_marker (it makes the crash happen once)")
