"""The export directory (local or URI, through the retrying filesystem every URI opens with):
its record, the staging area its work units write to, publishing pieces under their final
names, and starting over.

    <dest>/<record>                 the export's settings, source files, state, counts
    <dest>/.chorus-staging/unit-000012.json          a work unit's record, after its pieces
    <dest>/.chorus-staging/piece-000012-0000/<file>  a piece, until published

Every stream is opened with compression=None: pyarrow otherwise gzips a name ending in .gz a
second time (lhotse's cuts.jsonl.gz). Nothing is ever written in place under a final name: a piece is written in a local folder
(beside the staging area on a local disk, else in $TMPDIR) and moved into staging whole; a
published name is a rename (an object store's copy, which appears whole).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import uuid
from contextlib import contextmanager
from typing import Optional

import pyarrow.fs as pafs

from actors.files import TEMP_PREFIX, write_atomically

from ..errors import OutputMismatch, listed
from ..location import absolute, open_location
from ..names import EXPORT_STAGING

UNIT_RECORD = "unit-{unit:06d}.json"
PIECE_DIR = "piece-{unit:06d}-{piece:04d}"


class Destination:
    def __init__(self, location: str, record_name: str):
        self.location = absolute(location).rstrip("/")
        self.fs, self.base = open_location(location)
        self.base = self.base.rstrip("/")
        self.local = isinstance(self.fs, pafs.LocalFileSystem)
        self.record_name = record_name
        self.staging = f"{self.base}/{EXPORT_STAGING}"

    def path(self, name: str) -> str:
        return f"{self.base}/{name}"

    # ---- small files -------------------------------------------------------------------------

    def read_json(self, path: str) -> Optional[dict]:
        try:
            with self.fs.open_input_stream(path, compression=None) as f:
                return json.loads(f.read().decode("utf-8"))
        except FileNotFoundError:
            return None

    def write_bytes(self, path: str, data: bytes) -> None:
        if self.local:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            write_atomically(path, data)
            return
        with self.fs.open_output_stream(path, compression=None) as f:
            f.write(data)

    def write_text(self, name: str, text: str) -> None:
        self.write_bytes(self.path(name), text.encode("utf-8"))

    @contextmanager
    def open_output(self, name: str):
        """A stream to `name`, appearing whole when closed (temporary name + rename locally)."""
        path = self.path(name)
        if self.local:
            temp = self.path(f"{TEMP_PREFIX}{uuid.uuid4().hex[:8]}-{os.path.basename(name)}")
            with self.fs.open_output_stream(temp, compression=None) as f:
                yield f
            self.fs.move(temp, path)
            return
        with self.fs.open_output_stream(path, compression=None) as f:
            yield f

    def record(self) -> Optional[dict]:
        return self.read_json(self.path(self.record_name))

    def write_record(self, record: dict) -> None:
        self.write_text(self.record_name, json.dumps(record, indent=2, sort_keys=True) + "\n")

    # ---- what is there -----------------------------------------------------------------------

    def entries(self) -> list[str]:
        """Every file under the destination, relative to it (the staging area's included)."""
        selector = pafs.FileSelector(self.base, allow_not_found=True, recursive=True)
        infos = self.fs.get_file_info(selector)
        return sorted(f.path[len(self.base) + 1 :] for f in infos if f.type == pafs.FileType.File)

    def check_empty(self) -> None:
        found = self.entries()
        if found:
            raise OutputMismatch(
                f"export.dir {self.location} is not a chorus export (no {self.record_name}) and is not "
                f"empty ({listed(found)}); an export writes only into a new or empty directory or its own "
                f"earlier export, and export.overwrite never deletes files it did not write: choose another "
                f"export.dir"
            )

    def wipe(self, owns) -> int:
        """Delete this export's own files (the record, staging, what `owns(relative path)` names)."""
        doomed = [p for p in self.entries() if p == self.record_name or p.startswith(EXPORT_STAGING) or owns(p)]
        for name in doomed:
            self.fs.delete_file(self.path(name))
        return len(doomed)

    # ---- staging -----------------------------------------------------------------------------

    def unit_record(self, unit: int) -> Optional[dict]:
        return self.read_json(f"{self.staging}/{UNIT_RECORD.format(unit=unit)}")

    def commit_unit(self, unit: int, record: dict) -> None:
        self.write_bytes(f"{self.staging}/{UNIT_RECORD.format(unit=unit)}", json.dumps(record).encode("utf-8"))

    def staged(self, piece: dict, name: str) -> str:
        return f"{self.staging}/{PIECE_DIR.format(unit=piece['unit'], piece=piece['piece'])}/{name}"

    @contextmanager
    def piece_folder(self, unit: int, piece: int):
        """A local folder for one piece's files, moved into staging whole when the block ends."""
        final = f"{self.staging}/{PIECE_DIR.format(unit=unit, piece=piece)}"
        if self.local:
            os.makedirs(self.staging, exist_ok=True)
            folder = tempfile.mkdtemp(prefix=TEMP_PREFIX, dir=self.staging)
        else:
            folder = tempfile.mkdtemp(prefix="chorus-export-")
        try:
            yield folder
            if self.local:
                shutil.rmtree(final, ignore_errors=True)  # a retried unit's earlier try
                os.replace(folder, final)
            else:
                for name in sorted(os.listdir(folder)):
                    with (
                        open(os.path.join(folder, name), "rb") as src,
                        self.fs.open_output_stream(f"{final}/{name}", compression=None) as f,
                    ):
                        shutil.copyfileobj(src, f, 8 << 20)
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    def publish(self, piece: dict, names: dict) -> None:
        """Move a piece's staged files to their final names; a file already moved (a killed
        publish, rerun) is left as it is."""
        for staged_name, final_name in names.items():
            source, target = self.staged(piece, staged_name), self.path(final_name)
            if self.fs.get_file_info(source).type != pafs.FileType.File:
                if self.fs.get_file_info(target).type == pafs.FileType.File:
                    continue
                raise OutputMismatch(
                    f"{source} is missing and {target} was never published: the staging area was changed "
                    f"by hand; rerun with export.overwrite=true to start over"
                )
            if self.local:
                os.makedirs(os.path.dirname(target), exist_ok=True)
            try:
                self.fs.move(source, target)
            except FileNotFoundError:  # a try answered with an error after it took effect
                if self.fs.get_file_info(target).type != pafs.FileType.File:
                    raise

    def remove_staging(self) -> None:
        if self.local:
            shutil.rmtree(self.staging, ignore_errors=True)
            return
        selector = pafs.FileSelector(self.staging, allow_not_found=True, recursive=True)
        for info in self.fs.get_file_info(selector):
            if info.type == pafs.FileType.File:
                self.fs.delete_file(info.path)
