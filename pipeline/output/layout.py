"""An output directory: where its files are (pipeline/names.py names them), who owns it,
and the crash-safe writes every file of it goes through.

Resume needs no manifest: a part file only ever appears complete (written under a temporary
name, then renamed; object stores publish an object only when its upload completes), so the
ids in the live files (`OutputLayout.live_files`: the shards and the parts no shard has
absorbed, pipeline/output/listing.py) are exactly the rows done.

One driver at a time: a run holds a lease on the directory (pipeline/output/lease.py). A row
redone by a later run (changed content, a retryable error) has an older copy in an earlier
part: reads keep the newest copy of each id (pipeline/output/reading.py), and the run ends by
removing the older copies from their files (pipeline/output/supersede.py), so the files on
disk hold each id once.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
from collections.abc import Iterable
from typing import Optional

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from actors import schema as S
from actors.files import TEMP_PREFIX, atomic_open, write_atomically

from ..errors import OutputMismatch, listed
from ..location import absolute, open_location
from ..names import (
    CONFIG_FILE,
    DATA_DIR,
    IDENTITY_FILE,
    LEASE_FILE,
    REPORT_FILE,
    RUNS_DIR,
    SUMMARY_FILE,
    is_part,
    is_rejected_part,
    is_shard,
)
from . import hf_features
from .listing import ShardFooters, data_files, list_data, purge_absorbed
from .reading import newest_copies, read_file

log = logging.getLogger("chorus")

# what may sit in a directory chorus has not claimed yet: Hydra creates _runs/ before the run
# starts, and a lease is taken before the marker is written
_PRE_CLAIM_ENTRIES = {RUNS_DIR, LEASE_FILE}
# what an output is bound to (pipeline/plan/identity.py identity): its model. The rest of the
# record (the input it was last made from) is for messages only
BOUND_KEYS = ("model", "checkpoint")


def _is_pre_claim_entry(name: str) -> bool:
    """An entry a starting run makes before its marker exists: the lease, the runs folder, or
    the temporary file of a lease heartbeat caught mid-rename (`.tmp-<pid>-<hex>-_chorus.lock`)."""
    if name in _PRE_CLAIM_ENTRIES:
        return True
    return name.startswith(TEMP_PREFIX) and any(name.endswith(f"-{entry}") for entry in _PRE_CLAIM_ENTRIES)


class OutputLayout:
    """One output directory (a local path or a URI): its paths, its listing, its ownership
    (`check_ours`, `claim`, `wipe`) and its writes (parts, streamed parts, small text files)."""

    def __init__(self, location: str):
        self.location = absolute(location)
        self.fs, self.base = open_location(location)
        self.local = isinstance(self.fs, pafs.LocalFileSystem)
        self.data_dir = f"{self.base}/{DATA_DIR}"
        self.footers = ShardFooters(self.fs)  # shard footers read so far

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
            raise OutputMismatch(
                f"{self.location} is not a chorus output (no {IDENTITY_FILE}) and is not empty ({listed(foreign)}); "
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
            for f in self.data_files()
            if f.base_name.startswith(TEMP_PREFIX) or is_shard(f.base_name) or is_part(f.base_name)
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

    def data_files(self) -> list[pafs.FileInfo]:
        return data_files(self.fs, self.data_dir)

    def live_files(self) -> list[str]:
        """The Parquet files that hold rows now: the committed shards, the parts no shard has
        absorbed, and the rejected part. From one listing and the shards' footers."""
        return list_data(self.footers, self.data_dir).live_files()

    def parts(self) -> list[str]:
        """Every part file on disk, absorbed or not (what the writers left)."""
        return sorted(f.path for f in self.data_files() if is_part(f.base_name))

    def clean_temp(self, keep_run: Optional[str] = None) -> int:
        """Delete what killed writers left behind (never read as data, but it takes space).
        Only the lease holder calls this, and a temp file names the run that writes it: the
        ones of `keep_run` (the holder's own) stay, every other run's writer is gone."""
        mine = f"{TEMP_PREFIX}{keep_run}-" if keep_run else None
        stale = [
            f.path
            for f in self.data_files()
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
        return pa.concat_tables([read_file(self.fs, p, columns) for p in parts])

    def read(self, columns: Optional[list[str]] = None, latest_only: bool = True) -> pa.Table:
        """Every output row; with latest_only, only the newest copy of each id outside the
        rejected part (a row redone by a later run has an older copy until the run's end
        removes it). The rejected part is kept whole: it answers every refused input row."""
        columns = list(columns or S.OUTPUT_SCHEMA.names)
        parts = self.live_files()
        if not latest_only:
            return self._read_parts(parts, columns)
        rejected = [p for p in parts if is_rejected_part(p)]
        regular = [p for p in parts if p not in rejected]
        wanted = list(dict.fromkeys(columns + [S.ID, S.RUN, S.FINISHED_AT]))
        table = self._read_parts(regular, wanted)
        table = table.filter(newest_copies(table))
        return pa.concat_tables([table.select(columns), self._read_parts(rejected, columns)])

    def done_ids(self) -> pa.Array:
        """Ids of every row already written (the resume set)."""
        ids = self.read([S.ID]).column(S.ID).combine_chunks()
        return pc.drop_null(ids)

    def write_part(self, table: pa.Table, name: str, owner: str = "") -> str:
        """Write a part so that it is either absent or complete under its final name. The
        temporary file's name starts with the writing run (`owner`), so a cleaner knows
        whose it is."""
        final = f"{self.data_dir}/{name}"
        if not self.local:  # encoded whole first: a failed encode never reaches the store
            encoded = pa.BufferOutputStream()
            pq.write_table(hf_features.with_features(table), encoded)
            table_bytes = encoded.getvalue()
            with self.fs.open_output_stream(final) as f:
                f.write(table_bytes)
            return final
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

    def claim(self, identity: dict, overwrite: bool, run_id: Optional[str] = None) -> Optional[dict]:
        """Bind the output to one model (`BOUND_KEYS`), so a different model's rows cannot mix
        in; the input may grow, shrink or move between runs. Returns the identity an earlier
        run recorded (None for a new output). Call with the lease held."""
        self.check_ours()
        if overwrite:
            self.wipe()
        text = self.read_text(IDENTITY_FILE)
        recorded = json.loads(text) if text is not None else None
        if recorded is not None and any(recorded.get(k) != identity.get(k) for k in BOUND_KEYS):
            raise OutputMismatch(
                f"{self.location} holds rows of {_described(recorded)}; this run is {_described(identity)}: one "
                f"output holds one model's rows. Choose another output.dir, or pass output.overwrite=true to "
                f"delete its rows and start over"
            )
        if recorded is None:
            # the marker before any other entry: a second driver checking the directory before
            # it asks for the lease must see a chorus output in use, never a foreign `data`
            self.fs.create_dir(self.base, recursive=True)
        if recorded != identity:  # new, or the input moved (the marker names the latest)
            self.write_text(IDENTITY_FILE, json.dumps(identity, indent=2) + "\n")
        self.ensure()
        self.clean_temp(keep_run=run_id)
        purge_absorbed(self.footers, self.data_dir)  # what a killed compaction left: already in its shard
        return recorded


def _described(identity: dict) -> str:
    """An identity record for a message: its model, checkpoint and input."""
    checkpoint = identity.get("checkpoint")
    model = f"model {identity.get('model')!r}" + (f" (checkpoint {checkpoint!r})" if checkpoint else "")
    where = identity.get("input")
    return model + (f" from input {where}" if where else "")
