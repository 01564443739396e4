"""Find the input files, check the table before any work starts, and read its fragments.

The driver reads only what the files' footers say (schemas, row counts, row groups): O(files).
A fragment is one row group of one file: the unit every planning and read task works on.
Every per-row fact comes from pipeline/plan/keys.py, one fragment at a time.
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from actors.input_types import check_input_schema

from ..errors import InputError, StoreError
from ..location import is_local, local_path, open_location

_GLOB_CHARS = "*?["


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
        except StoreError:  # the store's own message names the URI and the fix
            raise
        except Exception as e:
            raise InputError(f"input file {path} is not readable Parquet: {e}") from None
        found = check_input_schema(file_schema, columns, path)
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


def _decode_dictionaries(batch: pa.Table) -> pa.Table:
    """Dictionary-encoded columns (what many Parquet writers make of a repetitive `speaker`)
    as plain arrays of their value type: everything downstream reads plain values."""
    for i, column in enumerate(batch.schema):
        if pa.types.is_dictionary(column.type):
            batch = batch.set_column(i, column.name, batch.column(i).cast(column.type.value_type))
    return batch


def read_fragment(scan: InputScan, fragment: Fragment) -> pa.Table:
    """A fragment's known columns, by their canonical names, dictionaries decoded."""
    reader = pq.ParquetFile(scan.files[fragment.file], filesystem=scan.filesystem)
    table = reader.read_row_group(fragment.row_group, columns=list(scan.rename))
    table = table.rename_columns([scan.rename.get(name, name) for name in table.column_names])
    return _decode_dictionaries(table)
