"""Find the input files, check the table before any work starts, and read it as keys.

The driver reads only what the files' footers say (schemas, row counts, row groups): O(files).
Every per-row fact -- an id's problems, a row's content hash, its reference clip -- comes from
`annotate`, which runs on one fragment (a row group) at a time wherever the planner puts it
(pipeline/planner.py: in a Ray Data task, or in-process for a small job).
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Optional

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from actors import schema as S

from .output import is_local, local_path, open_location

_GLOB_CHARS = "*?["


class InputError(ValueError):
    """The input cannot be read as a table (no files, unreadable, wrong schema)."""


@dataclass(frozen=True)
class Fragment:
    """One row group of one input file: the unit every planning and read task works on."""

    index: int
    file: int  # index into InputScan.files
    row_group: int
    first_row: int  # of the row group within its file
    rows: int


@dataclass
class InputScan:
    source: str
    filesystem: pafs.FileSystem
    files: list[str]
    rename: dict[str, str]  # table column -> canonical name, for the columns present
    total_rows: int
    fragments: list[Fragment] = field(default_factory=list)

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

    @property
    def file_names(self) -> list[str]:
        return [os.path.basename(path) for path in self.files]


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
    """Check every file's schema and list its row groups (footers only); raise
    InputError/InputSchemaError for a table no row of which could be processed."""
    if is_local(location):
        location = local_path(location)
    fs, files, base_dir = find_files(location)
    rename: dict[str, str] = {}
    fragments: list[Fragment] = []
    for file_index, path in enumerate(files):
        try:
            metadata = pq.ParquetFile(path, filesystem=fs).metadata
            file_schema = metadata.schema.to_arrow_schema()
        except Exception as e:
            raise InputError(f"input file {path} is not readable Parquet: {e}") from None
        found = S.check_input_schema(file_schema, columns, path)
        if rename and found != rename:
            raise InputError(
                f"input files disagree on their columns: {files[0]} has {sorted(rename)}, {path} has {sorted(found)}"
            )
        rename = found
        first = 0
        for group in range(metadata.num_row_groups):
            rows = metadata.row_group(group).num_rows
            fragments.append(Fragment(len(fragments), file_index, group, first, rows))
            first += rows
    return InputScan(
        source=location,
        filesystem=fs,
        files=files,
        rename=rename,
        total_rows=sum(f.rows for f in fragments),
        fragments=fragments,
        base_dir=base_dir,
        searched=not (len(files) == 1 and files[0] == open_location(location)[1]),
    )


def file_ids_digest(path: str, filesystem: pafs.FileSystem, id_column: str) -> str:
    """A digest of one file's ids in order (the id column only, a batch at a time): for a
    one-file input the same value the output's identity has always recorded."""
    digest = hashlib.blake2b(digest_size=16)
    reader = pq.ParquetFile(path, filesystem=filesystem)
    for batch in reader.iter_batches(batch_size=65536, columns=[id_column]):
        ids = batch.column(0).cast(pa.string())
        # each id as its UTF-8 bytes + NUL, a null as 0x01: one buffer per batch, hashed whole
        framed = pc.if_else(ids.is_null(), pa.scalar("\x01"), pc.binary_join_element_wise(ids, "", "\x00"))
        framed = framed.combine_chunks() if isinstance(framed, pa.ChunkedArray) else framed
        if len(framed):
            offsets = memoryview(framed.buffers()[1]).cast("i")
            start, stop = offsets[framed.offset], offsets[framed.offset + len(framed)]
            digest.update(memoryview(framed.buffers()[2])[start:stop])
    return digest.hexdigest()


def ids_digest(file_digests: list[str]) -> str:
    """The input's ids as one digest: one file's digest as it is, several files' combined."""
    if len(file_digests) == 1:
        return file_digests[0]
    return hashlib.blake2b("|".join(file_digests).encode(), digest_size=16).hexdigest()


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


def _decode_dictionaries(batch: pa.Table) -> pa.Table:
    """Dictionary-encoded columns (what many Parquet writers make of a repetitive `speaker`)
    as plain arrays of their value type: everything downstream reads plain values."""
    for i, column in enumerate(batch.schema):
        if pa.types.is_dictionary(column.type):
            batch = batch.set_column(i, column.name, batch.column(i).cast(column.type.value_type))
    return batch


# ---- keys: what planning needs of each row ---------------------------------------------------
FRAGMENT = "_fragment"  # int32: Fragment.index
ROW = "_row"  # int64: the row within its file (for messages: "bad.parquet row 7")
PROBLEM = "_problem"  # why the id cannot name an output row (null when it can)
REASON = "_reason"  # the problem's kind, for the counts: null_id, malformed_id, long_id, ...
CLIP = "_clip"  # binary: which reference clip the row names (see _clip_identity)
TEXT_CHARS = "_text_chars"  # int64
KEY_SCHEMA = pa.schema(
    [
        (S.ID, pa.string()),
        (S.CONTENT_HASH, pa.string()),
        (S.REF_ID, pa.string()),
        (CLIP, pa.binary()),
        (PROBLEM, pa.string()),
        (REASON, pa.string()),
        (FRAGMENT, pa.int32()),
        (ROW, pa.int64()),
        (TEXT_CHARS, pa.int64()),
    ]
)


def _reason(problem: str) -> str:
    if problem == "id is null":
        return "null_id"
    if "characters long" in problem:
        return "long_id"
    return "malformed_id"


@dataclass(frozen=True)
class RowHasher:
    """Everything a row's content hash depends on besides the row: picklable, so each planning
    task builds its own (its clip cache lives as long as the task)."""

    settings_digest: str
    audio_root: Optional[str]
    input_dir: Optional[str]

    def hashes(self, table: pa.Table) -> list[Optional[str]]:
        """Each row's digest of everything its audio depends on: every input column (clip
        bytes by hash, clip paths with the file's mtime and size) and the run's settings +
        model fingerprint; None for a row whose id is unusable. `table` has canonical names."""
        clip_stat = _ClipStat(self.audio_root, self.input_dir)
        order = sorted(table.column_names)
        columns = [(name.encode() + b"=", table.column(name).to_pylist(), name == S.REF_AUDIO_PATH) for name in order]
        ids = table.column(S.ID).to_pylist()
        out: list[Optional[str]] = []
        for r, row_id in enumerate(ids):
            if S.id_problem(row_id) is not None:
                out.append(None)
                continue
            digest = hashlib.blake2b(self.settings_digest.encode(), digest_size=16)
            for prefix, values, is_path in columns:
                value = values[r]
                digest.update(prefix + _value_bytes(value) + b"\x00")
                if is_path and isinstance(value, str):
                    digest.update(clip_stat(value))
            out.append(digest.hexdigest())
        return out


def read_fragment(scan: InputScan, fragment: Fragment) -> pa.Table:
    """A fragment's known columns, by their canonical names, dictionaries decoded."""
    reader = pq.ParquetFile(scan.files[fragment.file], filesystem=scan.filesystem)
    table = reader.read_row_group(fragment.row_group, columns=list(scan.rename))
    table = table.rename_columns([scan.rename.get(name, name) for name in table.column_names])
    return _decode_dictionaries(table)


def _text_chars(texts) -> pa.Array:
    """Characters per text (bytes for a binary column, which may hold invalid UTF-8)."""
    if len(texts) == 0:
        return pa.array([], pa.int64())
    if pa.types.is_string(texts.type) or pa.types.is_large_string(texts.type):
        return pc.fill_null(pc.utf8_length(texts), 0)
    return pc.fill_null(pc.binary_length(texts), 0)


def annotate(table: pa.Table, fragment: Fragment, hasher: RowHasher) -> pa.Table:
    """One fragment's rows (canonical names) -> their keys (KEY_SCHEMA)."""
    raw_ids = table.column(S.ID).to_pylist()
    problems = [S.id_problem(value) for value in raw_ids]
    ids = [value if isinstance(value, str) else (None if value is None else str(value)) for value in raw_ids]
    n = table.num_rows
    names = table.column_names
    chars = _text_chars(table.column(S.TEXT))
    return pa.table(
        {
            S.ID: pa.array(ids, pa.string()),
            S.CONTENT_HASH: pa.array(hasher.hashes(table), pa.string()),
            S.REF_ID: table.column(S.REF_ID).cast(pa.string()) if S.REF_ID in names else pa.nulls(n, pa.string()),
            CLIP: pa.array(_clip_identities(table), pa.binary()),
            PROBLEM: pa.array(problems, pa.string()),
            REASON: pa.array([None if p is None else _reason(p) for p in problems], pa.string()),
            FRAGMENT: pa.array([fragment.index] * n, pa.int32()),
            ROW: pa.array(range(fragment.first_row, fragment.first_row + n), pa.int64()),
            TEXT_CHARS: pc.cast(chars, pa.int64()),
        },
        schema=KEY_SCHEMA,
    )


def _clip_identities(table: pa.Table) -> list[Optional[bytes]]:
    """Which clip each row names: its ref_audio bytes (by hash), else its ref_audio_path."""
    n, names = table.num_rows, table.column_names
    audio = table.column(S.REF_AUDIO).to_pylist() if S.REF_AUDIO in names else [None] * n
    paths = table.column(S.REF_AUDIO_PATH).to_pylist() if S.REF_AUDIO_PATH in names else [None] * n
    return [
        b"bytes:" + hashlib.blake2b(bytes(a), digest_size=16).digest()
        if a is not None
        else (None if p is None else b"path:" + p.encode("utf-8", "surrogatepass"))
        for a, p in zip(audio, paths)
    ]


def describe_clip(identity: bytes) -> str:
    kind, _, value = identity.partition(b":")
    if kind == b"path":
        return f"ref_audio_path {value.decode('utf-8', 'replace')!r}"
    return f"ref_audio bytes (blake2b {value.hex()[:12]})"
