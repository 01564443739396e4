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
stays the readers' rule (pipeline/output.py `newest_copy_mask`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from actors import schema as S
from actors.files import TEMP_PREFIX, atomic_open

from . import hf_features

if TYPE_CHECKING:
    from .output import OutputLayout

SHARD_PREFIX = "shard-"
SHARD_SUFFIX = ".parquet"
ABSORBED_KEY = b"chorus.absorbed"  # footer metadata: JSON list of the part names a shard absorbs
# a shard's row groups: big enough for dataset tools, small enough to read one at a time
ROW_GROUP_BYTES = 16 << 20
ROW_GROUP_ROWS = 4096

Hook = Optional[Callable[[str], None]]  # tests: called after each step ("written", "committed", ...)


def is_shard(name: str) -> bool:
    return name.startswith(SHARD_PREFIX) and name.endswith(SHARD_SUFFIX)


def shard_name(parts: Iterable[str]) -> str:
    digest = hashlib.blake2b(digest_size=12)
    for name in sorted(parts):
        digest.update(name.encode("utf-8") + b"\x00")
    return f"{SHARD_PREFIX}{digest.hexdigest()}{SHARD_SUFFIX}"


def _base_name(path: str) -> str:
    return path.rsplit("/", 1)[-1]


# ---- what holds rows ------------------------------------------------------------------------


def absorbed_by(layout: OutputLayout, info: pafs.FileInfo) -> Optional[frozenset[str]]:
    """The part names a committed shard absorbed (its footer), cached per file version; None
    for a file with no valid footer (an object store's upload closed by a failing writer:
    never committed, its parts are all still there)."""
    key = (info.path, info.size, info.mtime_ns)
    if key not in layout.footers:
        try:
            meta = pq.read_metadata(info.path, filesystem=layout.fs).metadata or {}
            layout.footers[key] = frozenset(json.loads(meta.get(ABSORBED_KEY, b"[]")))
        except (OSError, ValueError, pa.ArrowInvalid):
            layout.footers[key] = None
    return layout.footers[key]


@dataclass
class Listing:
    """data/ as it stands: committed shards, the parts they have not absorbed, and the dead
    parts (absorbed, not yet deleted)."""

    shards: list[pafs.FileInfo] = field(default_factory=list)
    parts: list[pafs.FileInfo] = field(default_factory=list)
    dead: list[pafs.FileInfo] = field(default_factory=list)
    torn: list[pafs.FileInfo] = field(default_factory=list)  # shard names without a valid footer

    def live_files(self) -> list[str]:
        return [f.path for f in self.shards] + [f.path for f in self.parts]


def list_data(layout: OutputLayout) -> Listing:
    """One listing of data/ plus one footer read per shard: O(files) on the driver."""
    from .output import is_part

    infos = sorted(layout._data_files(), key=lambda f: f.path)
    listing, committed, footers = Listing(), [], []
    for f in infos:
        if is_shard(f.base_name):
            absorbed = absorbed_by(layout, f)
            (listing.torn if absorbed is None else committed).append(f)
            footers.append(absorbed or frozenset())
    gone = frozenset().union(*footers)  # a rewritten shard is absorbed by its successor too
    for f in committed:
        (listing.dead if f.base_name in gone else listing.shards).append(f)
    for f in infos:
        if is_part(f.base_name):
            (listing.dead if f.base_name in gone else listing.parts).append(f)
    return listing


def purge_absorbed(layout: OutputLayout) -> int:
    """Delete the parts committed shards have absorbed (what a killed compaction left), and
    torn shards. Only the lease holder calls this."""
    listing = list_data(layout)
    dead = listing.dead + listing.torn
    for f in dead:
        _delete(layout, f.path)
    return len(dead)


def _delete(layout: OutputLayout, path: str) -> None:
    try:
        layout.fs.delete_file(path)
    except FileNotFoundError:
        pass


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
    from .output import REJECTED_PART

    packer, groups = Packer(shard_bytes, shard_rows), []
    for f in list_data(layout).parts:
        if f.base_name == REJECTED_PART:
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


def conform(table: pa.Table, names: Optional[list[str]] = None) -> pa.Table:
    """`names` (all of OUTPUT_SCHEMA's by default) in OUTPUT_SCHEMA's types, a column the
    table lacks null: files of older writers read and pack like today's."""
    fields = [S.OUTPUT_SCHEMA.field(n) for n in (names or S.OUTPUT_SCHEMA.names)]
    columns = [
        table.column(f.name).cast(f.type) if f.name in table.column_names else pa.nulls(table.num_rows, f.type)
        for f in fields
    ]
    return pa.Table.from_arrays(columns, schema=pa.schema(fields))


def read_file(layout: OutputLayout, path: str, names: Optional[list[str]] = None) -> pa.Table:
    """Only `names` of one file, conformed. A plain ParquetFile read: a third of the cost of
    pq.read_table's dataset machinery on a block part (1.3 vs 3.1 ms, 2 vCPU Zen 4)."""
    wanted = names or S.OUTPUT_SCHEMA.names
    with layout.fs.open_input_file(path) as handle:
        source = pq.ParquetFile(handle)
        present = set(source.schema_arrow.names)
        table = source.read(columns=[n for n in wanted if n in present])
    return conform(table, wanted)


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
            groups.add(read_file(layout, path), hook)
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
            _delete(layout, final)
            raise
        _step(hook, "committed")
        return
    with atomic_open(final, "wb", prefix=f"{TEMP_PREFIX}{owner}-", before_replace=lambda: _step(hook, "written")) as f:
        write(f)
    _step(hook, "committed")


def compact(location: str, parts: list[str], owner: str, hook: Hook = None) -> dict:
    """Pack the named parts (base names, in data/) into one shard and delete them. Returns
    {"shard", "rows", "parts", "bytes"}. Runs in a Ray task during the job, in the driver at
    its end; memory: one part plus one row group."""
    from .output import OutputLayout

    layout = OutputLayout(location)
    name = shard_name(parts)
    final = f"{layout.data_dir}/{name}"
    paths = [f"{layout.data_dir}/{p}" for p in parts]
    info = layout.fs.get_file_info(final)
    if not (info.type == pafs.FileType.File and absorbed_by(layout, info) == frozenset(parts)):
        metadata = {ABSORBED_KEY: json.dumps(sorted(parts)).encode("utf-8")}
        _write_committed(layout, final, owner, lambda sink: _stream_parts(layout, paths, sink, metadata, hook), hook)
        info = layout.fs.get_file_info(final)
    for path in paths:
        _delete(layout, path)
        _step(hook, "deleted")
    return {
        "shard": name,
        "rows": pq.read_metadata(final, filesystem=layout.fs).num_rows,
        "parts": len(parts),
        "bytes": info.size,
    }


def rewrite(layout: OutputLayout, path: str, keep: pa.Array, owner: str) -> str:
    """The rows of one file (a part or a shard) where `keep` is true, as a new shard that
    absorbs the file (and whatever it absorbed), row group by row group; then the file goes.
    Never in place: on an object store there is no rename, and a failed overwrite would lose
    the file. Returns the new shard's path."""
    old = _base_name(path)
    source = pq.ParquetFile(path, filesystem=layout.fs)
    info = layout.fs.get_file_info(path)
    absorbed = (absorbed_by(layout, info) or frozenset()) if is_shard(old) else frozenset()
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
    _delete(layout, path)
    return final


def compact_all(layout: OutputLayout, owner: str, shard_bytes: int, shard_rows: int, hook: Hook = None) -> list[dict]:
    """The end of a job: every live block part into shards, one shard at a time."""
    purge_absorbed(layout)
    groups = pending_groups(layout, shard_bytes, shard_rows)
    return [compact(layout.location, group, owner, hook) for group in groups]
