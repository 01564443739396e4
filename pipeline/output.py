"""Output layout, crash-safe part files, resume and the summary.

    <output.dir>/
      data/shard-<hash>.parquet   synthesized rows (actors/schema.py OUTPUT_SCHEMA), packed
                                  from the parts (pipeline/shards.py)
      data/part-<run>-<hash>.parquet  one block's rows, until a shard absorbs it
      data/part-rejected.parquet  rows the driver refused (null / malformed / duplicate ids)
      config.yaml                 the resolved config of the latest run
      summary.json                counts, audio hours, speed, per-actor figures
      _chorus.json                which input and model this output belongs to (chorus's marker)
      _chorus.lock                the lease of the driver writing here now
      _runs/<time>/               Hydra's logs (local outputs only)
      _attempts/<run>/            blocks that killed an actor during the run (removed at its end)

Resume needs no manifest: a part file only ever appears complete (written under a temporary
name, then renamed; object stores publish an object only when its upload completes), so the
ids in the live files (`OutputLayout.live_files`: the shards and the parts no shard has
absorbed) are exactly the rows done. A part is named by its run and a hash of its ids, so a
write retried after a crash replaces its own file instead of adding a second copy, and a
later run's part never takes the name of one a shard has absorbed.

One driver at a time: a run holds a lease on the directory (pipeline/lease.py). A row redone by a
later run (changed content, a retryable error) has an older copy in an earlier part: reads
keep the newest copy of each id, and the run ends by removing the older copies from their
files (pipeline/supersede.py), so the files on disk hold each id once.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import os
import re
import time
from collections.abc import Iterable
from typing import Optional

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from actors import schema as S
from actors.files import TEMP_PREFIX, atomic_open, write_atomically

from . import hf_features, shards
from .lease import LEASE_FILE

DATA_DIR = "data"
PART_PREFIX = "part-"
PART_SUFFIX = ".parquet"
REJECTED_PART = "part-rejected.parquet"
CONFIG_FILE = "config.yaml"
SUMMARY_FILE = "summary.json"
IDENTITY_FILE = "_chorus.json"  # also chorus's marker: overwrite only ever deletes where it is
RUNS_DIR = "_runs"
ATTEMPTS_DIR = "_attempts"  # per run: the blocks that killed an actor (actors/synth/guard.py), removed at the end
REPORT_FILE = "report.html"
# what may sit in a directory chorus has not claimed yet: Hydra creates _runs/ before the run
# starts, and a lease is taken before the marker is written
_PRE_CLAIM_ENTRIES = {RUNS_DIR, LEASE_FILE}


def is_part(name: str) -> bool:
    """A block part's (or the rejected part's) file name."""
    return name.startswith(PART_PREFIX) and name.endswith(PART_SUFFIX)


def _is_pre_claim_entry(name: str) -> bool:
    """An entry a starting run makes before its marker exists: the lease, the runs folder, or
    the temporary file of a lease heartbeat caught mid-rename (`.tmp-<pid>-<hex>-_chorus.lock`)."""
    if name in _PRE_CLAIM_ENTRIES:
        return True
    return name.startswith(TEMP_PREFIX) and any(name.endswith(f"-{entry}") for entry in _PRE_CLAIM_ENTRIES)


log = logging.getLogger("chorus")

STATS_SCHEMA = pa.schema(
    [
        ("rows", pa.int64()),
        ("ok", pa.int64()),
        ("errors", pa.int64()),
        ("audio_seconds", pa.float64()),
        ("frames", pa.int64()),
        ("part", pa.string()),
        ("bytes", pa.int64()),  # the part file's size (what compaction packs by)
        ("write_ms", pa.float64()),
        ("slot_rows", pa.float64()),
        ("slot_steps", pa.float64()),
    ]
)

_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def is_local(location: str) -> bool:
    return not _SCHEME.match(location) or location.startswith("file://")


def local_path(location: str) -> str:
    if location.startswith("file://"):
        location = location[len("file://") :]
    return os.path.abspath(os.path.expanduser(location))


def open_location(location: str) -> tuple[pafs.FileSystem, str]:
    """(filesystem, path inside it) for a local path or any URI pyarrow understands."""
    if is_local(location):
        return pafs.LocalFileSystem(), local_path(location)
    return pafs.FileSystem.from_uri(location)


class OutputMismatch(RuntimeError):
    """The output directory holds rows of a different input or model, or is not chorus's."""


class OutputLayout:
    def __init__(self, location: str):
        self.location = local_path(location) if is_local(location) else location
        self.fs, self.base = open_location(location)
        self.local = isinstance(self.fs, pafs.LocalFileSystem)
        self.data_dir = f"{self.base}/{DATA_DIR}"
        self.footers: dict = {}  # shard footers read so far (pipeline/shards.py absorbed_by)

    def path(self, name: str) -> str:
        return f"{self.base}/{name}"

    def ensure(self) -> None:
        self.fs.create_dir(self.data_dir, recursive=True)

    def is_chorus_output(self) -> bool:
        return self.fs.get_file_info(self.path(IDENTITY_FILE)).type == pafs.FileType.File

    def foreign_entries(self) -> list[str]:
        """What sits in a directory without chorus's marker, besides what a starting run puts
        there itself: a non-empty list means the directory is someone else's."""
        if self.is_chorus_output():
            return []
        selector = pafs.FileSelector(self.base, allow_not_found=True, recursive=False)
        return sorted(f.base_name for f in self.fs.get_file_info(selector) if not _is_pre_claim_entry(f.base_name))

    def check_ours(self) -> None:
        foreign = self.foreign_entries()
        if foreign:
            shown = ", ".join(foreign[:5]) + (", ..." if len(foreign) > 5 else "")
            raise OutputMismatch(
                f"{self.location} is not a chorus output (no {IDENTITY_FILE}) and is not empty ({shown}); "
                f"chorus writes only into a new or empty directory or its own earlier output, and "
                f"output.overwrite never deletes files it did not write. Choose another output.dir"
            )

    def wipe(self) -> int:
        """Remove what chorus wrote here (output.overwrite=true), and nothing else: only in a
        directory holding chorus's marker, only chorus's own file names. Returns how many."""
        if not self.is_chorus_output():
            return 0
        doomed = [
            f.path
            for f in self._data_files()
            if f.base_name.startswith(TEMP_PREFIX) or shards.is_shard(f.base_name) or is_part(f.base_name)
        ]
        doomed += [
            self.path(name)
            for name in (CONFIG_FILE, SUMMARY_FILE, REPORT_FILE, IDENTITY_FILE)
            if self.fs.get_file_info(self.path(name)).type == pafs.FileType.File
        ]
        for path in doomed:
            self.fs.delete_file(path)
        selector = pafs.FileSelector(self.data_dir, allow_not_found=True)
        if self.local and os.path.isdir(self.data_dir) and not self.fs.get_file_info(selector):
            os.rmdir(self.data_dir)
        return len(doomed)

    def _data_files(self) -> list[pafs.FileInfo]:
        selector = pafs.FileSelector(self.data_dir, allow_not_found=True, recursive=False)
        return [f for f in self.fs.get_file_info(selector) if f.type == pafs.FileType.File]

    def live_files(self) -> list[str]:
        """The Parquet files that hold rows now: the committed shards, the parts no shard has
        absorbed, and the rejected part. From one listing and the shards' footers."""
        return shards.list_data(self).live_files()

    def parts(self) -> list[str]:
        """Every part file on disk, absorbed or not (what the writers left)."""
        return sorted(f.path for f in self._data_files() if is_part(f.base_name))

    def clean_temp(self, keep_run: Optional[str] = None) -> int:
        """Delete what killed writers left behind (never read as data, but it takes space).
        Only the lease holder calls this, and a temp file names the run that writes it: the
        ones of `keep_run` (the holder's own) stay, every other run's writer is gone."""
        mine = f"{TEMP_PREFIX}{keep_run}-" if keep_run else None
        stale = [
            f.path
            for f in self._data_files()
            if f.base_name.startswith(TEMP_PREFIX) and not (mine and f.base_name.startswith(mine))
        ]
        for path in stale:
            try:
                self.fs.delete_file(path)
            except FileNotFoundError:  # its writer finished (renamed it) meanwhile
                pass
        return len(stale)

    def _read_parts(self, parts: list[str], columns: list[str]) -> pa.Table:
        """The projected columns of these files (never the others: audio stays on disk)."""
        if not parts:
            return S.OUTPUT_SCHEMA.empty_table().select(columns)
        return pa.concat_tables([shards.read_file(self, p, columns) for p in parts])

    def read(self, columns: Optional[list[str]] = None, latest_only: bool = True) -> pa.Table:
        """Every output row; with latest_only, only the newest copy of each id outside the
        rejected part (a row redone by a later run has an older copy until the run's end
        removes it). The rejected part is kept whole: it answers every refused input row."""
        columns = list(columns or S.OUTPUT_SCHEMA.names)
        parts = self.live_files()
        if not latest_only:
            return self._read_parts(parts, columns)
        rejected = [p for p in parts if p.endswith("/" + REJECTED_PART)]
        regular = [p for p in parts if p not in rejected]
        wanted = list(dict.fromkeys(columns + [S.ID, S.RUN, S.FINISHED_AT]))
        table = self._read_parts(regular, wanted)
        table = table.filter(_newest_copies(table))
        return pa.concat_tables([table.select(columns), self._read_parts(rejected, columns)])

    def done_ids(self) -> pa.Array:
        """Ids of every row already written (the resume set)."""
        ids = self.read([S.ID]).column(S.ID).combine_chunks()
        return pc.drop_null(ids)

    def drop_superseded(self, also_drop: Optional[pa.Array] = None) -> int:
        """Remove from their files the older copies of rows a later run redid, and rows of
        `also_drop` ids (those the driver now refuses), so each id is on disk once; in this
        process (pipeline/supersede.py: the run's end chooses between this and Ray tasks).
        Returns the rows removed."""
        from .supersede import drop_in_process

        return drop_in_process(self, also_drop)

    def write_part(self, table: pa.Table, name: str, owner: str = "") -> str:
        """Write a part so that it is either absent or complete under its final name. The
        temporary file's name starts with the writing run (`owner`), so a cleaner knows
        whose it is."""
        final = f"{self.data_dir}/{name}"
        with self._part_sink(final, owner) as f:
            pq.write_table(hf_features.with_features(table), f)
        return final

    def _part_sink(self, final: str, owner: str):
        """Where a part's bytes go: locally a temporary file named for its run, renamed into
        place once whole; an object store publishes an object only once its upload completes."""
        if self.local:
            return atomic_open(final, "wb", prefix=f"{TEMP_PREFIX}{owner}-")
        return self.fs.open_output_stream(final)

    def write_part_stream(self, tables: Iterable[pa.Table], name: str, owner: str = "") -> int:
        """`write_part` for a part too large to hold: the tables (one schema) are written as
        they come, under the same all-or-nothing rule. When they hold no row nothing is
        written, and an earlier part of that name is removed. Returns the rows written."""
        final = f"{self.data_dir}/{name}"
        tables = (t for t in tables if t.num_rows)
        first = next(tables, None)
        if first is None:
            if self.fs.get_file_info(final).type == pafs.FileType.File:
                self.fs.delete_file(final)
            return 0
        schema = hf_features.with_features(first).schema
        rows = 0
        with self._part_sink(final, owner) as f, pq.ParquetWriter(f, schema) as writer:
            for table in itertools.chain([first], tables):
                writer.write_table(table.replace_schema_metadata(schema.metadata))
                rows += table.num_rows
        return rows

    def write_text(self, name: str, text: str) -> None:
        """Small metadata files, replaced whole (temporary name + rename when local)."""
        final = self.path(name)
        if not self.local:
            with self.fs.open_output_stream(final) as f:
                f.write(text.encode("utf-8"))
            return
        write_atomically(final, text)

    def read_text(self, name: str) -> Optional[str]:
        if self.fs.get_file_info(self.path(name)).type != pafs.FileType.File:
            return None
        with self.fs.open_input_stream(self.path(name)) as f:
            return f.read().decode("utf-8")

    def claim(self, identity: dict, overwrite: bool, run_id: Optional[str] = None) -> None:
        """Bind the output to one input + model, so a rerun resumes the same work and a
        different run cannot mix its rows in. Call with the lease held."""
        self.check_ours()
        if overwrite:
            self.wipe()
        recorded = self.read_text(IDENTITY_FILE)
        if recorded is not None and json.loads(recorded) != identity:
            raise OutputMismatch(
                f"{self.location} holds the output of another run ({recorded.strip()}), not of "
                f"{json.dumps(identity)}; choose another output.dir or pass output.overwrite=true"
            )
        self.ensure()
        self.clean_temp(keep_run=run_id)
        shards.purge_absorbed(self)  # what a killed compaction left: already in its shard
        if recorded is None:
            self.write_text(IDENTITY_FILE, json.dumps(identity, indent=2) + "\n")


def newest_copy_mask(ids, runs, finished) -> pa.Array:
    """A mask over the rows (three columns of one length) keeping, of the rows sharing an id,
    the current copy: the latest run, then the latest finished_at (nulls oldest), then the last
    read; rows without an id are all kept. The one rule for readers and for planning
    (pipeline/planner.py), as Arrow sorts and group-bys, not a loop over rows."""
    n = len(ids)
    index = pa.array(range(n), pa.int64())
    rows = pa.table({"id": ids, "run": runs, "finished": finished, "i": index})
    keyed = rows.filter(pc.is_valid(rows.column("id")))
    if pc.count_distinct(keyed.column("id")).as_py() == keyed.num_rows:
        return pa.array([True] * n, pa.bool_())
    keys = [("id", "ascending", "at_start"), ("run", "ascending", "at_start"), ("finished", "ascending", "at_start")]
    ranked = keyed.take(pc.sort_indices(keyed, sort_keys=[*keys, ("i", "ascending", "at_start")]))
    ranked = ranked.append_column("rank", pa.array(range(ranked.num_rows), pa.int64()))
    current = ranked.take(ranked.group_by("id").aggregate([("rank", "max")]).column("rank_max")).column("i")
    return pc.or_(pc.is_null(rows.column("id")), pc.is_in(index, value_set=current.combine_chunks()))


def _newest_copies(table: pa.Table) -> pa.Array:
    return newest_copy_mask(table.column(S.ID), table.column(S.RUN), table.column(S.FINISHED_AT))


def part_name(ids: pa.Array, run_id: str = "") -> str:
    """A part's name from its run and the ids it holds: the same rows of a run always land in
    the same file."""
    digest = hashlib.blake2b(digest_size=12)
    for value in ids.to_pylist():
        digest.update(value.encode("utf-8") + b"\x00")
    run = f"{run_id}-" if run_id else ""
    return f"{PART_PREFIX}{run}{digest.hexdigest()}{PART_SUFFIX}"


def engine_figures(batches: Iterable[Optional[dict]]) -> dict:
    """What the engines did for these batches (the `batch` structs of output rows, each batch
    counted once): `slot_rows` (live rows summed over engine steps), `slot_steps` (steps x
    slots), `slot_occupancy` (their ratio: the mean share of slots holding a row while the
    engine stepped) and `engine_busy_s` (engine step time). Each batch holds its share of its
    actor's steps, so sums over batches are the actors' totals."""
    unique = {b[S.BATCH_ID]: b for b in batches if b}
    slot_rows = sum(b.get(S.BATCH_SLOT_ROWS) or 0.0 for b in unique.values())
    slot_steps = sum((b.get(S.BATCH_ENGINE_STEPS) or 0.0) * (b.get(S.BATCH_SLOTS) or 0) for b in unique.values())
    return {
        "slot_rows": slot_rows,
        "slot_steps": slot_steps,
        "slot_occupancy": slot_rows / slot_steps if slot_steps else None,
        "engine_busy_s": sum(b.get(S.BATCH_ENGINE_MS) or 0.0 for b in unique.values()) / 1000.0,
    }


def block_stats(table: pa.Table, part: str) -> dict:
    statuses = table.column(S.STATUS).to_pylist()
    ok, rejected = statuses.count(S.STATUS_OK), statuses.count(S.STATUS_REJECTED)
    figures = engine_figures(table.column(S.BATCH).to_pylist())
    return {
        "rows": table.num_rows,
        "ok": ok,
        "errors": table.num_rows - ok - rejected,  # rejected rows are done, with audio
        "audio_seconds": float(pc.sum(table.column(S.AUDIO_SECONDS)).as_py() or 0.0),
        "frames": int(pc.sum(table.column(S.N_FRAMES)).as_py() or 0),
        "part": part,
        "slot_rows": figures["slot_rows"],
        "slot_steps": figures["slot_steps"],
    }


def write_block(batch: pa.Table, location: str, run_id: str = "") -> pa.Table:
    """The plan's write stage (one Ray task per block): the block becomes one part file, and
    the driver gets back a one-row stats table for progress."""
    if batch.num_rows == 0:
        return pa.Table.from_pylist([], schema=STATS_SCHEMA)
    began = time.perf_counter()
    batch = batch.select(S.OUTPUT_SCHEMA.names).cast(S.OUTPUT_SCHEMA)
    name = part_name(batch.column(S.ID).combine_chunks(), run_id)
    layout = OutputLayout(location)
    path = layout.write_part(batch, name, owner=run_id)
    size = layout.fs.get_file_info(path).size
    stats = dict(block_stats(batch, name), bytes=size, write_ms=(time.perf_counter() - began) * 1000.0)
    return pa.Table.from_pylist([stats], schema=STATS_SCHEMA)
