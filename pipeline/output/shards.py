"""Shards: the output's block parts packed into files of about `output.shard_bytes` (at most
`output.shard_rows` rows), while the job runs and at its end, so that a finished job's data/
holds a few hundred files per million rows instead of one per block.

Crash safety, at every step: a shard is written under a temporary name, its footer naming
the parts it absorbs (key `chorus.absorbed`), then renamed into place -- the commit point
(on an object store: the upload's completion) -- and only then are the absorbed parts
deleted. So whenever a process dies, each row is in a live file exactly once: before the
commit in its part (the temporary shard is never read, and the lease holder's next start
deletes it), after it in the shard, where any part still on disk that a committed shard
names is treated as gone (and deleted by the lease holder). A shard's name is a hash of the
parts it absorbs: a compaction retried after its commit finds its own shard and only
finishes the deletes. Compaction copies every row it reads; which copy of an id is current
stays the readers' rule (pipeline/output/reading.py `newest_copy_mask`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Optional

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from actors import schema as S
from actors.files import TEMP_PREFIX, atomic_open
from actors.storage import retries_spent

from ..names import base_name, is_rejected_part, is_shard, shard_name
from . import hf_features
from .layout import OutputLayout
from .listing import ABSORBED_KEY, delete_quietly, list_data, purge_absorbed
from .reading import conform, read_file

# a shard's row groups: big enough for dataset tools, small enough to read one at a time
ROW_GROUP_BYTES = 16 << 20
ROW_GROUP_ROWS = 4096

Hook = Optional[Callable[[str], None]]  # tests: called after each step ("written", "committed", ...)


# ---- which parts make a shard ---------------------------------------------------------------


class Packer:
    """Groups parts, in the order they come, into shards of at most `shard_bytes` and
    `shard_rows` (a single part above either is a shard of its own). O(1) per part."""

    def __init__(self, shard_bytes: int, shard_rows: int):
        self.shard_bytes, self.shard_rows = int(shard_bytes), int(shard_rows)
        self.names: list[str] = []
        self.bytes = self.rows = 0

    def add(self, name: str, size: int, rows: int) -> Optional[list[str]]:
        """Take one part; returns a full group when this part completes one (or starts the next)."""
        full = None
        if self.names and (self.bytes + size > self.shard_bytes or self.rows + rows > self.shard_rows):
            full = self.take()
        self.names.append(name)
        self.bytes += size
        self.rows += rows
        if full is None and (self.bytes >= self.shard_bytes or self.rows >= self.shard_rows):
            full = self.take()
        return full

    def take(self) -> list[str]:
        group, self.names = self.names, []
        self.bytes = self.rows = 0
        return group


def pending_groups(layout: OutputLayout, shard_bytes: int, shard_rows: int) -> list[list[str]]:
    """Every live block part (not the rejected part: each run rewrites it) grouped into shards."""
    packer, groups = Packer(shard_bytes, shard_rows), []
    for f in list_data(layout.footers, layout.data_dir).parts:
        if is_rejected_part(f.base_name):
            continue
        rows = pq.read_metadata(f.path, filesystem=layout.fs).num_rows
        group = packer.add(f.base_name, f.size, rows)
        if group:
            groups.append(group)
    return groups + ([packer.take()] if packer.names else [])


# ---- writing a shard ------------------------------------------------------------------------


class _RowGroups:
    """Tables buffered into row groups of about ROW_GROUP_BYTES; the writer opens on the first
    row group, whose rows give the features metadata its sample rate."""

    def __init__(self, sink, metadata: dict):
        self.sink, self.metadata = sink, metadata
        self.buffer: list[pa.Table] = []
        self.buffered_bytes = self.buffered_rows = 0
        self.writer: Optional[pq.ParquetWriter] = None
        self.rows = 0

    def add(self, table: pa.Table, hook: Hook) -> None:
        self.buffer.append(table)
        self.buffered_bytes += table.nbytes
        self.buffered_rows += table.num_rows
        if self.buffered_bytes >= ROW_GROUP_BYTES or self.buffered_rows >= ROW_GROUP_ROWS:
            self.flush(hook)

    def flush(self, hook: Hook) -> None:
        if not self.buffer and self.writer is not None:
            return
        table = pa.concat_tables(self.buffer) if self.buffer else S.OUTPUT_SCHEMA.empty_table()
        self.buffer, self.buffered_bytes, self.buffered_rows = [], 0, 0
        if self.writer is None:
            rate = hf_features.sample_rate_of(table)
            schema = table.schema.with_metadata({**hf_features.metadata(table.schema, rate), **self.metadata})
            self.writer = pq.ParquetWriter(self.sink, schema)
        self.writer.write_table(table, row_group_size=max(1, table.num_rows))
        self.rows += table.num_rows
        _step(hook, "row_group")

    def close(self, hook: Hook) -> int:
        self.flush(hook)
        self.writer.close()
        return self.rows


def _step(hook: Hook, name: str) -> None:
    if hook is not None:
        hook(name)


def _abandon(writer: Optional[pq.ParquetWriter]) -> None:
    """Drop a failed writer without its footer: a footer would make the rows written so far
    look like a whole file (on an object store, a committed shard)."""
    if writer is not None:
        writer.is_open = False


def _stream_parts(layout: OutputLayout, paths: list[str], sink, metadata: dict, hook: Hook) -> int:
    groups = _RowGroups(sink, metadata)
    try:
        for path in paths:  # one part in memory at a time
            groups.add(read_file(layout.fs, path), hook)
        return groups.close(hook)
    except BaseException:
        _abandon(groups.writer)
        raise


def _write_committed(layout: OutputLayout, final: str, owner: str, write: Callable, hook: Hook) -> None:
    """Run `write(sink)` so that `final` appears complete or not at all; the rename (or the
    upload's completion) is the commit point."""
    if not layout.local:
        try:
            with layout.fs.open_output_stream(final) as sink:
                write(sink)
        except BaseException:
            # pyarrow's streams have no abort: closing one may have published a torn object
            delete_quietly(layout.fs, final)
            raise
        _step(hook, "committed")
        return
    with atomic_open(final, "wb", prefix=f"{TEMP_PREFIX}{owner}-", before_replace=lambda: _step(hook, "written")) as f:
        write(f)
    _step(hook, "committed")


def compact(location: str, parts: list[str], owner: str, hook: Hook = None) -> dict:
    """Pack the named parts (base names, in data/) into one shard and delete them. Returns
    {"shard", "rows", "parts", "bytes", "store_retries"}. Runs in a Ray task during the job, in
    the driver at its end; memory: one part plus one row group."""
    retried = retries_spent()
    layout = OutputLayout(location)
    name = shard_name(parts)
    final = f"{layout.data_dir}/{name}"
    paths = [f"{layout.data_dir}/{p}" for p in parts]
    info = layout.fs.get_file_info(final)
    if not (info.type == pafs.FileType.File and layout.footers.absorbed(info) == frozenset(parts)):
        metadata = {ABSORBED_KEY: json.dumps(sorted(parts)).encode("utf-8")}
        _write_committed(layout, final, owner, lambda sink: _stream_parts(layout, paths, sink, metadata, hook), hook)
        info = layout.fs.get_file_info(final)
    for path in paths:
        delete_quietly(layout.fs, path)
        _step(hook, "deleted")
    return {
        "shard": name,
        "rows": pq.read_metadata(final, filesystem=layout.fs).num_rows,
        "parts": len(parts),
        "bytes": info.size,
        "store_retries": retries_spent() - retried,
    }


def rewrite(layout: OutputLayout, path: str, keep: pa.Array, owner: str) -> str:
    """The rows of one file (a part or a shard) where `keep` is true, as a new shard that
    absorbs the file (and whatever it absorbed), row group by row group; then the file goes.
    Never in place: on an object store there is no rename, and a failed overwrite would lose
    the file. Returns the new shard's path."""
    old = base_name(path)
    source = pq.ParquetFile(path, filesystem=layout.fs)
    info = layout.fs.get_file_info(path)
    absorbed = (layout.footers.absorbed(info) or frozenset()) if is_shard(old) else frozenset()
    absorbed = sorted(absorbed | {old})
    metadata = {**(source.schema_arrow.metadata or {}), ABSORBED_KEY: json.dumps(absorbed).encode("utf-8")}
    final = f"{layout.data_dir}/{shard_name(absorbed)}"

    def write(sink) -> None:
        writer = pq.ParquetWriter(sink, S.OUTPUT_SCHEMA.with_metadata(metadata))
        try:
            offset = 0
            for g in range(source.num_row_groups):
                group = source.read_row_group(g)
                mask = keep.slice(offset, group.num_rows)
                offset += group.num_rows
                kept = conform(group.filter(mask)).replace_schema_metadata(metadata)
                writer.write_table(kept, row_group_size=max(1, kept.num_rows))
        except BaseException:
            _abandon(writer)
            raise
        writer.close()

    _write_committed(layout, final, owner, write, None)
    delete_quietly(layout.fs, path)
    return final


def compact_all(layout: OutputLayout, owner: str, shard_bytes: int, shard_rows: int, hook: Hook = None) -> list[dict]:
    """The end of a job: every live block part into shards, one shard at a time."""
    purge_absorbed(layout.footers, layout.data_dir)
    groups = pending_groups(layout, shard_bytes, shard_rows)
    return [compact(layout.location, group, owner, hook) for group in groups]
