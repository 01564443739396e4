"""Find the input files, check the table before any work starts, and screen the ids.

The id column is read once on the driver (one column: cheap next to hours of synthesis):
ids that are null, malformed or shared by several rows cannot name an output row, so those
rows are answered right here as error rows and never reach an actor.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Optional

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from actors import schema as S

from .output import is_local, local_path, open_location

_GLOB_CHARS = "*?["


class InputError(ValueError):
    """The input cannot be read as a table (no files, unreadable, wrong schema)."""


@dataclass
class InputScan:
    source: str
    filesystem: pafs.FileSystem
    files: list[str]
    rename: dict[str, str]  # table column -> canonical name, for the columns present
    total_rows: int
    rejected: list[dict] = field(default_factory=list)  # error rows (actors/schema.py)
    rejected_ids: list[str] = field(default_factory=list)  # non-null ids of rejected rows
    accepted_ids: list[str] = field(default_factory=list)  # ids of the rows to synthesize
    ids_digest: str = ""  # the ids in input order: the same table wherever it was copied to

    base_dir: str = ""  # the directory the input names (relative clip paths start there)
    searched: bool = False  # a directory or a glob: every file below base_dir may be read

    @property
    def local_dir(self) -> str | None:
        return self.base_dir if isinstance(self.filesystem, pafs.LocalFileSystem) else None

    @property
    def root(self) -> str:
        """The input's directory as a path or URI: where reference clips are by default."""
        if self.local_dir is not None:
            return self.local_dir
        return f"{self.source.split('://', 1)[0]}://{self.base_dir}"


def _hidden(name: str) -> bool:
    """Names Spark, Hive and pyarrow datasets skip: `_temporary/`, `_SUCCESS`, `.ipynb_checkpoints/`,
    `.part-0.parquet.crc`, and the temporary files of writers still at work."""
    return name.startswith(("_", "."))


def _glob_matches(path: str, pattern: str) -> bool:
    """Shell-glob semantics, one path component at a time: `*` and `?` never match '/', and
    a hidden component (see _hidden) matches only a pattern component that names it so."""
    names, wanted = path.split("/"), pattern.split("/")
    if len(names) != len(wanted):
        return False
    for name, want in zip(names, wanted):
        if not fnmatch.fnmatchcase(name, want):
            return False
        if _hidden(name) and not want.startswith(name[0]):
            return False
    return True


def find_files(location: str) -> tuple[pafs.FileSystem, list[str], str]:
    """A Parquet file, a directory (searched recursively for *.parquet) or a glob ->
    (filesystem, files, the directory the input names). Hidden paths (see _hidden) below the
    named directory are skipped."""
    fs, path = open_location(location)
    if any(ch in path for ch in _GLOB_CHARS):
        cut = min(path.find(ch) for ch in _GLOB_CHARS if ch in path)
        base = path[:cut].rsplit("/", 1)[0] or "/"
        selector = pafs.FileSelector(base, recursive=True, allow_not_found=True)
        files = [
            f.path for f in fs.get_file_info(selector) if f.type == pafs.FileType.File and _glob_matches(f.path, path)
        ]
    else:
        info = fs.get_file_info(path)
        if info.type == pafs.FileType.NotFound:
            raise InputError(f"input {location} does not exist")
        if info.type == pafs.FileType.File:
            files, base = [path], path.rsplit("/", 1)[0]
        else:
            base = path
            selector = pafs.FileSelector(path, recursive=True)
            files = [
                f.path
                for f in fs.get_file_info(selector)
                if f.type == pafs.FileType.File
                and f.base_name.endswith(".parquet")
                and not any(_hidden(part) for part in f.path[len(base) :].split("/") if part)
            ]
    if not files:
        raise InputError(f"input {location} matches no Parquet files")
    return fs, sorted(files), base


def output_inside_input(scan: InputScan, output_location: str) -> bool:
    """An output directory below a searched input directory is read back as input on rerun."""
    if not scan.searched:
        return False
    out_fs, out_path = open_location(output_location)
    if type(out_fs) is not type(scan.filesystem):
        return False
    base = scan.base_dir.rstrip("/")
    return out_path == base or out_path.startswith(base + "/")


def scan_input(location: str, columns: Mapping[str, str]) -> InputScan:
    """Check every file's schema and screen the ids; raise InputError/InputSchemaError for a
    table no row of which could be processed."""
    if is_local(location):
        location = local_path(location)
    fs, files, base_dir = find_files(location)
    rename: dict[str, str] = {}
    for path in files:
        try:
            file_schema = pq.read_schema(path, filesystem=fs)
        except Exception as e:
            raise InputError(f"input file {path} is not readable Parquet: {e}") from None
        found = S.check_input_schema(file_schema, columns, path)
        if rename and found != rename:
            raise InputError(
                f"input files disagree on their columns: {files[0]} has {sorted(rename)}, {path} has {sorted(found)}"
            )
        rename = found
    id_column = columns.get(S.ID, S.ID)
    ids_per_file = [
        pq.read_table(path, filesystem=fs, columns=[id_column]).column(id_column).to_pylist() for path in files
    ]
    counts = Counter(value for ids in ids_per_file for value in ids if value is not None)
    digest = hashlib.blake2b(digest_size=16)
    scan = InputScan(
        source=location,
        filesystem=fs,
        files=files,
        rename=rename,
        total_rows=sum(map(len, ids_per_file)),
        base_dir=base_dir,
        searched=not (len(files) == 1 and files[0] == open_location(location)[1]),
    )
    for path, ids in zip(files, ids_per_file):
        for row, value in enumerate(ids):
            digest.update(b"\x01" if value is None else value.encode("utf-8", "surrogatepass") + b"\x00")
            problem = S.id_problem(value)
            if problem is None and counts[value] > 1:
                problem = (
                    f"duplicate id {value!r}: {counts[value]} input rows share it; ids must be "
                    f"unique, so every one of them is rejected"
                )
            if problem is None:
                scan.accepted_ids.append(value)
                continue
            scan.rejected.append(S.error_row(value, f"{problem} ({os.path.basename(path)} row {row})"))
            if value is not None:
                scan.rejected_ids.append(value)
    scan.ids_digest = digest.hexdigest()
    return scan


# ---- row identity -----------------------------------------------------------------------
_HASH_BATCH_ROWS = 4096


def _value_bytes(value) -> bytes:
    """A typed, unambiguous encoding of one cell for hashing."""
    if value is None:
        return b"n"
    if isinstance(value, (bytes, bytearray, memoryview)):
        return b"b" + hashlib.blake2b(bytes(value), digest_size=16).digest()
    if isinstance(value, str):
        return b"s" + value.encode("utf-8", "surrogatepass")
    return b"v" + repr(value).encode("utf-8")


class _ClipStat:
    """path + mtime + size of a local reference file (cached: many rows share one clip), so a
    clip replaced under the same name changes the rows that use it; a URI counts by name."""

    def __init__(self, audio_root: str | None, input_dir: str | None):
        self.audio_root, self.input_dir = audio_root, input_dir
        self.cache: dict[str, bytes] = {}

    def __call__(self, path: str) -> bytes:
        if path in self.cache:
            return self.cache[path]
        stamp = b""
        if not re.match(r"^[A-Za-z][A-Za-z0-9+.-]*://", path) or path.startswith("file://"):
            local = path[len("file://") :] if path.startswith("file://") else path
            local = os.path.expanduser(local)
            root = self.audio_root if self.audio_root is not None else self.input_dir
            if not os.path.isabs(local) and root is not None:
                local = os.path.join(root, local)
            try:
                st = os.stat(local)
                stamp = f"|{st.st_mtime_ns}|{st.st_size}".encode()
            except OSError:
                stamp = b"|missing"
        self.cache[path] = stamp
        return stamp


@dataclass
class RowScan:
    hashes: dict[str, str]  # id -> content hash
    conflicts: dict[str, str]  # id -> why the row cannot run (its ref_id names two clips)


def scan_rows(scan: InputScan, settings_digest: str, audio_root: str | None) -> RowScan:
    """One pass over the accepted rows on the driver (in batches):

    - id -> a digest of everything the row's audio depends on: every input column (clip
      bytes by hash, clip paths with the file's mtime and size) and the run's settings +
      model fingerprint (`settings_digest`);
    - rows whose `ref_id` is shared with a row naming another clip: rows sharing a ref_id
      share one encoded clip, so a conflict would silently give some rows another voice;
      every row of such a ref_id is refused, naming both clips."""
    accepted = set(scan.accepted_ids)
    canonical = {table_name: name for table_name, name in scan.rename.items()}
    clip_stat = _ClipStat(audio_root, scan.root)
    hashes: dict[str, str] = {}
    clips: dict[str, dict[bytes, str]] = {}  # ref_id -> clip identity -> first row id naming it
    ref_rows: dict[str, list[str]] = {}
    for path in scan.files:
        reader = pq.ParquetFile(path, filesystem=scan.filesystem)
        for batch in reader.iter_batches(batch_size=_HASH_BATCH_ROWS, columns=list(canonical)):
            names = [canonical[n] for n in batch.schema.names]
            columns = dict(zip(names, (batch.column(i).to_pylist() for i in range(batch.num_columns))))
            order = sorted(names)
            for r in range(batch.num_rows):
                row_id = columns[S.ID][r]
                if row_id not in accepted:
                    continue
                digest = hashlib.blake2b(settings_digest.encode(), digest_size=16)
                for name in order:
                    value = columns[name][r]
                    digest.update(name.encode() + b"=" + _value_bytes(value) + b"\x00")
                    if name == S.REF_AUDIO_PATH and isinstance(value, str):
                        digest.update(clip_stat(value))
                hashes[row_id] = digest.hexdigest()
                ref_id = columns.get(S.REF_ID, [None] * batch.num_rows)[r]
                clip = _clip_identity(columns, r)
                if ref_id and clip is not None:
                    clips.setdefault(ref_id, {}).setdefault(clip, row_id)
                    ref_rows.setdefault(ref_id, []).append(row_id)
    conflicts = {}
    for ref_id, seen in clips.items():
        if len(seen) > 1:
            (first_clip, first_row), (other_clip, other_row) = list(seen.items())[:2]
            message = (
                f"ref_id {ref_id!r} names different clips: {_describe_clip(first_clip)} (row {first_row!r}) "
                f"and {_describe_clip(other_clip)} (row {other_row!r}); rows sharing a ref_id must share "
                f"one clip, so none of its {len(ref_rows[ref_id])} rows is synthesized"
            )
            conflicts.update({row_id: message for row_id in ref_rows[ref_id]})
    return RowScan(hashes, conflicts)


def _clip_identity(columns: dict, r: int) -> Optional[bytes]:
    audio = columns.get(S.REF_AUDIO, ())
    if audio and audio[r] is not None:
        return b"bytes:" + hashlib.blake2b(bytes(audio[r]), digest_size=16).digest()
    paths = columns.get(S.REF_AUDIO_PATH, ())
    if paths and paths[r] is not None:
        return b"path:" + paths[r].encode("utf-8", "surrogatepass")
    return None


def _describe_clip(identity: bytes) -> str:
    kind, _, value = identity.partition(b":")
    if kind == b"path":
        return f"ref_audio_path {value.decode('utf-8', 'replace')!r}"
    return f"ref_audio bytes (blake2b {value.hex()[:12]})"


_shared: dict[str, dict] = {}  # per worker process: fetch the driver's shared state once


def prepare_block(batch: pa.Table, rename: Mapping[str, str], state: list) -> pa.Table:
    """Plan stage after the read: canonical column names, only the rows still to do (not
    rejected by the driver, not already done with the same content), and each row's content
    hash for its output row. `state` holds one object ref of {"skip": ids, "hash_ids": ids,
    "hashes": digests}, wrapped in a list so Ray passes the ref instead of resolving it per
    call."""
    import pyarrow.compute as pc
    import ray

    key = state[0].hex()
    if key not in _shared:
        _shared.clear()
        _shared[key] = ray.get(state[0])
    shared = _shared[key]
    batch = batch.rename_columns([rename.get(name, name) for name in batch.column_names])
    batch = _decode_dictionaries(batch)
    ids = pc.cast(batch.column(S.ID), pa.string())
    keep = pc.and_(pc.is_valid(ids), pc.invert(pc.is_in(ids, value_set=shared["skip"])))
    batch = batch.filter(pc.fill_null(keep, False))
    ids = pc.cast(batch.column(S.ID), pa.string())
    hashes = pc.take(shared["hashes"], pc.index_in(ids, value_set=shared["hash_ids"]))
    return batch.append_column(S.CONTENT_HASH, hashes)


def _decode_dictionaries(batch: pa.Table) -> pa.Table:
    """Dictionary-encoded columns (what many Parquet writers make of a repetitive `speaker`)
    as plain arrays of their value type: everything downstream reads plain values."""
    for i, column in enumerate(batch.schema):
        if pa.types.is_dictionary(column.type):
            batch = batch.set_column(i, column.name, batch.column(i).cast(column.type.value_type))
    return batch


def read_dataset(scan: InputScan, rows_per_block: int):
    """Ray Data dataset of the input's known columns, in blocks of about `rows_per_block`
    rows, so that a small table of text is spread over every actor instead of arriving as
    one block for one actor.

    The blocks are cut by the read itself (override_num_blocks), not by
    repartition(target_num_rows_per_block=...): in Ray 2.60 that operator's tasks ask for a
    whole CPU, which a node whose actors hold part of its CPU never has free, and the run
    hangs. For the same reason the read holds a quarter CPU, not Ray Data's default one."""
    import ray

    blocks = max(1, -(-scan.total_rows // rows_per_block))
    ds = ray.data.read_parquet(scan.files, filesystem=scan.filesystem, num_cpus=0.25, override_num_blocks=blocks)
    return ds.select_columns(list(scan.rename))
