"""data/ as it stands: the committed shards, the parts no shard has absorbed, and the dead
files (parts a committed shard absorbed, shards without a valid footer). One listing plus one
footer read per shard: O(files) on the driver. pipeline/output/shards.py says why a shard's
footer decides what is live."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Optional

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from ..names import is_part, is_shard

ABSORBED_KEY = b"chorus.absorbed"  # footer metadata: JSON list of the part names a shard absorbs


class ShardFooters:
    """The part names each committed shard absorbed (its footer), cached per file version."""

    def __init__(self, fs: pafs.FileSystem):
        self.fs = fs
        self._cache: dict = {}

    def absorbed(self, info: pafs.FileInfo) -> Optional[frozenset[str]]:
        """None for a file with no valid footer (an object store's upload closed by a failing
        writer: never committed, its parts are all still there)."""
        key = (info.path, info.size, info.mtime_ns)
        if key not in self._cache:
            try:
                meta = pq.read_metadata(info.path, filesystem=self.fs).metadata or {}
                self._cache[key] = frozenset(json.loads(meta.get(ABSORBED_KEY, b"[]")))
            except (OSError, ValueError, pa.ArrowInvalid):
                self._cache[key] = None
        return self._cache[key]


def data_files(fs: pafs.FileSystem, data_dir: str) -> list[pafs.FileInfo]:
    selector = pafs.FileSelector(data_dir, allow_not_found=True, recursive=False)
    return [f for f in fs.get_file_info(selector) if f.type == pafs.FileType.File]


@dataclass
class Listing:
    shards: list[pafs.FileInfo] = field(default_factory=list)
    parts: list[pafs.FileInfo] = field(default_factory=list)
    dead: list[pafs.FileInfo] = field(default_factory=list)  # absorbed, not yet deleted
    torn: list[pafs.FileInfo] = field(default_factory=list)  # shard names without a valid footer

    def live_files(self) -> list[str]:
        return [f.path for f in self.shards] + [f.path for f in self.parts]


def list_data(footers: ShardFooters, data_dir: str) -> Listing:
    infos = sorted(data_files(footers.fs, data_dir), key=lambda f: f.path)
    listing, committed, absorbed_sets = Listing(), [], []
    for f in infos:
        if is_shard(f.base_name):
            absorbed = footers.absorbed(f)
            (listing.torn if absorbed is None else committed).append(f)
            absorbed_sets.append(absorbed or frozenset())
    gone = frozenset().union(*absorbed_sets)  # a rewritten shard is absorbed by its successor too
    for f in committed:
        (listing.dead if f.base_name in gone else listing.shards).append(f)
    for f in infos:
        if is_part(f.base_name):
            (listing.dead if f.base_name in gone else listing.parts).append(f)
    return listing


def delete_quietly(fs: pafs.FileSystem, path: str) -> None:
    """Delete a file that another writer (a retried task, a concurrent cleaner) may have
    deleted already."""
    try:
        fs.delete_file(path)
    except FileNotFoundError:
        pass


def purge_absorbed(footers: ShardFooters, data_dir: str) -> int:
    """Delete the parts committed shards have absorbed (what a killed compaction left), and
    torn shards. Only the lease holder calls this."""
    listing = list_data(footers, data_dir)
    dead = listing.dead + listing.torn
    for f in dead:
        delete_quietly(footers.fs, f.path)
    return len(dead)
