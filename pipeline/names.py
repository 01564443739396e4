"""Every name chorus gives a file or folder of an output directory, once. A leaf.

<output.dir>/
  data/shard-<hash>.parquet       synthesized rows (actors/schema.py OUTPUT_SCHEMA), packed
                                  from the parts (pipeline/output/shards.py)
  data/part-<run>-<hash>.parquet  one block's rows, until a shard absorbs it
  data/part-rejected.parquet      rows the driver refused (null / malformed / duplicate ids)
  config.yaml                     the resolved config of the latest run
  summary.json                    counts, audio hours, speed, per-actor figures
  report.html                     the run's page (pipeline/report/page.py)
  changed-ids-<run>.txt           every id a run redid because its content changed
  removed-ids-<run>.txt           every id the output held that the run's input no longer
                                  named (kept, or pruned with output.on_removed=prune)
  _chorus.json                    which input and model this output belongs to (chorus's marker)
  _chorus.lock                    the lease of the driver writing here now
  _runs/<time>/                   Hydra's logs (local outputs only)
  _attempts/<run>/                blocks that killed an actor during the run (removed at its end)
  _plan/<run>/                    a distributed plan's per-fragment row lists (removed at its end)
  audio/                          `python -m pipeline.export`'s files and its files.csv (its
                                  default destination; webdataset/, lhotse/, hf/ for the others)

An export's destination (pipeline/export/) holds the format's own files, its record
(_chorus_export.json: the export's settings, the source files it read, its state and counts;
Lhotse Shar: cuts.chorus-export.json, which lhotse's directory reader passes over) and, while
it runs, .chorus-staging/ (each work unit's pieces and its record, until published).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

DATA_DIR = "data"
PART_PREFIX = "part-"
PART_SUFFIX = ".parquet"
REJECTED_PART = "part-rejected.parquet"
SHARD_PREFIX = "shard-"
SHARD_SUFFIX = ".parquet"
CONFIG_FILE = "config.yaml"
SUMMARY_FILE = "summary.json"
REPORT_FILE = "report.html"
CHANGED_FILE = "changed-ids-{run}.txt"
REMOVED_FILE = "removed-ids-{run}.txt"
IDENTITY_FILE = "_chorus.json"  # also chorus's marker: overwrite only ever deletes where it is
LEASE_FILE = "_chorus.lock"
RUNS_DIR = "_runs"
ATTEMPTS_DIR = "_attempts"  # per run: the blocks that killed an actor (actors/synth/guard.py)
PLAN_DIR = "_plan"
EXPORT_DIR = "audio"
EXPORT_INDEX_FILE = "files.csv"
EXPORT_RECORD = "_chorus_export.json"
# lhotse's CutSet.from_shar(in_dir=) takes every file's name up to its first dot as a field and
# reads only the cuts field's .jsonl files: a record named cuts.*.json is passed over
LHOTSE_EXPORT_RECORD = "cuts.chorus-export.json"
EXPORT_STAGING = ".chorus-staging"
# `python -m pipeline.bench`'s own output folder: the tables beside each configuration's output
BENCH_FILE = "bench.json"
BENCH_TABLE_FILE = "bench.md"


def is_part(name: str) -> bool:
    """A block part's (or the rejected part's) file name."""
    return name.startswith(PART_PREFIX) and name.endswith(PART_SUFFIX)


def is_shard(name: str) -> bool:
    return name.startswith(SHARD_PREFIX) and name.endswith(SHARD_SUFFIX)


def base_name(path: str) -> str:
    return path.rsplit("/", 1)[-1]


def is_rejected_part(path: str) -> bool:
    """Whether a path (or a bare name) is the rejected part's."""
    return base_name(path) == REJECTED_PART


def part_name(ids: Iterable[str], run_id: str = "") -> str:
    """A part's name from its run and the ids it holds: the same rows of a run always land in
    the same file (a retried write replaces its own file), and a later run's part never takes
    the name of one a shard has absorbed."""
    digest = hashlib.blake2b(digest_size=12)
    for value in ids:
        digest.update(value.encode("utf-8") + b"\x00")
    run = f"{run_id}-" if run_id else ""
    return f"{PART_PREFIX}{run}{digest.hexdigest()}{PART_SUFFIX}"


def shard_name(parts: Iterable[str]) -> str:
    """A shard's name from the parts it absorbs: a compaction retried after its commit finds
    its own shard."""
    digest = hashlib.blake2b(digest_size=12)
    for name in sorted(parts):
        digest.update(name.encode("utf-8") + b"\x00")
    return f"{SHARD_PREFIX}{digest.hexdigest()}{SHARD_SUFFIX}"
