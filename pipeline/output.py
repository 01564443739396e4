"""Output layout, crash-safe part files, resume and the summary.

    <output.dir>/
      data/part-<hash>.parquet    synthesized rows (pipeline/schema.py OUTPUT_SCHEMA)
      data/part-rejected.parquet  rows the driver refused (null / malformed / duplicate ids)
      config.yaml                 the resolved config of the latest run
      summary.json                counts, audio hours, speed, per-actor figures
      _chorus.json                which input and model this output belongs to
      _runs/<time>/               Hydra's logs (local outputs only)

Resume needs no manifest: a part file only ever appears complete (written under a temporary
name, then renamed; object stores publish an object only when its upload completes), so the
ids in the part files are exactly the rows done. A part is named by a hash of its ids, so a
write retried after a crash replaces its own file instead of adding a second copy.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
import uuid
from collections import Counter
from typing import Optional

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from . import schema as S

DATA_DIR = "data"
PART_PREFIX = "part-"
PART_SUFFIX = ".parquet"
REJECTED_PART = "part-rejected.parquet"
TEMP_PREFIX = ".tmp-"  # readers (pyarrow, Ray, HF datasets) skip names starting with '.'
CONFIG_FILE = "config.yaml"
SUMMARY_FILE = "summary.json"
IDENTITY_FILE = "_chorus.json"
RUNS_DIR = "_runs"

STATS_SCHEMA = pa.schema(
    [
        ("rows", pa.int64()),
        ("ok", pa.int64()),
        ("errors", pa.int64()),
        ("audio_seconds", pa.float64()),
        ("frames", pa.int64()),
        ("part", pa.string()),
        ("write_ms", pa.float64()),
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
    """The output directory holds rows of a different input or model."""


class OutputLayout:
    def __init__(self, location: str):
        self.location = local_path(location) if is_local(location) else location
        self.fs, self.base = open_location(location)
        self.local = isinstance(self.fs, pafs.LocalFileSystem)
        self.data_dir = f"{self.base}/{DATA_DIR}"

    def path(self, name: str) -> str:
        return f"{self.base}/{name}"

    def ensure(self) -> None:
        self.fs.create_dir(self.data_dir, recursive=True)

    def wipe(self) -> None:
        """Remove everything chorus wrote here (output.overwrite=true)."""
        if self.fs.get_file_info(self.data_dir).type == pafs.FileType.Directory:
            self.fs.delete_dir(self.data_dir)
        for name in (CONFIG_FILE, SUMMARY_FILE, IDENTITY_FILE):
            if self.fs.get_file_info(self.path(name)).type == pafs.FileType.File:
                self.fs.delete_file(self.path(name))

    def _data_files(self) -> list[pafs.FileInfo]:
        selector = pafs.FileSelector(self.data_dir, allow_not_found=True, recursive=False)
        return [f for f in self.fs.get_file_info(selector) if f.type == pafs.FileType.File]

    def parts(self) -> list[str]:
        return sorted(
            f.path
            for f in self._data_files()
            if f.base_name.startswith(PART_PREFIX) and f.base_name.endswith(PART_SUFFIX)
        )

    def clean_temp(self) -> int:
        """Delete what killed writers left behind (never read as data, but it takes space)."""
        stale = [f.path for f in self._data_files() if f.base_name.startswith(TEMP_PREFIX)]
        for path in stale:
            self.fs.delete_file(path)
        return len(stale)

    def read(self, columns: Optional[list[str]] = None) -> pa.Table:
        parts = self.parts()
        columns = columns or S.OUTPUT_SCHEMA.names
        if not parts:
            return S.OUTPUT_SCHEMA.empty_table().select(columns)
        tables = [pq.read_table(p, filesystem=self.fs, columns=columns, schema=S.OUTPUT_SCHEMA) for p in parts]
        return pa.concat_tables(tables)

    def done_ids(self) -> pa.Array:
        """Ids of every row already written (the resume set)."""
        ids = self.read([S.ID]).column(S.ID).combine_chunks()
        return pc.drop_null(ids)

    def write_part(self, table: pa.Table, name: str) -> str:
        """Write a part so that it is either absent or complete under its final name."""
        final = f"{self.data_dir}/{name}"
        if not self.local:
            # an object store publishes an object only once its upload has completed
            pq.write_table(table, final, filesystem=self.fs)
            return final
        temp = f"{self.data_dir}/{TEMP_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:8]}-{name}"
        with open(temp, "wb") as f:
            pq.write_table(table, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, final)
        return final

    def write_text(self, name: str, text: str) -> None:
        """Small metadata files, replaced whole (temporary name + rename when local)."""
        final = self.path(name)
        if not self.local:
            with self.fs.open_output_stream(final) as f:
                f.write(text.encode("utf-8"))
            return
        temp = f"{self.base}/{TEMP_PREFIX}{uuid.uuid4().hex[:8]}-{name}"
        with open(temp, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(temp, final)

    def read_text(self, name: str) -> Optional[str]:
        if self.fs.get_file_info(self.path(name)).type != pafs.FileType.File:
            return None
        with self.fs.open_input_stream(self.path(name)) as f:
            return f.read().decode("utf-8")

    def claim(self, identity: dict, overwrite: bool) -> None:
        """Bind the output to one input + model, so a rerun resumes the same work and a
        different run cannot mix its rows in."""
        if overwrite:
            self.wipe()
        recorded = self.read_text(IDENTITY_FILE)
        if recorded is not None and json.loads(recorded) != identity:
            raise OutputMismatch(
                f"{self.location} holds the output of another run ({recorded.strip()}), not of "
                f"{json.dumps(identity)}; choose another output.dir or pass output.overwrite=true"
            )
        self.ensure()
        self.clean_temp()
        if recorded is None:
            self.write_text(IDENTITY_FILE, json.dumps(identity, indent=2) + "\n")


def part_name(ids: pa.Array) -> str:
    """A part's name from the ids it holds: the same rows always land in the same file."""
    digest = hashlib.blake2b(digest_size=12)
    for value in ids.to_pylist():
        digest.update(value.encode("utf-8") + b"\x00")
    return f"{PART_PREFIX}{digest.hexdigest()}{PART_SUFFIX}"


def block_stats(table: pa.Table, part: str) -> dict:
    ok = table.column(S.STATUS).to_pylist().count(S.STATUS_OK)
    return {
        "rows": table.num_rows,
        "ok": ok,
        "errors": table.num_rows - ok,
        "audio_seconds": float(pc.sum(table.column(S.AUDIO_SECONDS)).as_py() or 0.0),
        "frames": int(pc.sum(table.column(S.N_FRAMES)).as_py() or 0),
        "part": part,
    }


def write_block(batch: pa.Table, location: str) -> pa.Table:
    """The plan's write stage (one Ray task per block): the block becomes one part file, and
    the driver gets back a one-row stats table for progress."""
    if batch.num_rows == 0:
        return pa.Table.from_pylist([], schema=STATS_SCHEMA)
    began = time.perf_counter()
    batch = batch.select(S.OUTPUT_SCHEMA.names).cast(S.OUTPUT_SCHEMA)
    name = part_name(batch.column(S.ID).combine_chunks())
    OutputLayout(location).write_part(batch, name)
    stats = dict(block_stats(batch, name), write_ms=(time.perf_counter() - began) * 1000.0)
    return pa.Table.from_pylist([stats], schema=STATS_SCHEMA)


def _rate(amount: float, seconds: float) -> Optional[float]:
    return amount / seconds if seconds > 0 else None


def summarize(meta: pa.Table, run_id: str, wall_seconds: float, extra: dict) -> dict:
    """summary.json: totals over the whole output (every run that wrote to it), speed of this
    run (rows_per_s, frames_per_s, rtf = wall seconds per second of audio), per-actor figures."""
    rows = meta.to_pylist()
    ok_rows = [r for r in rows if r[S.STATUS] == S.STATUS_OK]
    audio_seconds = sum(r[S.AUDIO_SECONDS] or 0.0 for r in ok_rows)
    this_run = [r for r in rows if r[S.RUN] == run_id]
    run_ok = [r for r in this_run if r[S.STATUS] == S.STATUS_OK]
    run_audio = sum(r[S.AUDIO_SECONDS] or 0.0 for r in run_ok)
    run_frames = sum(r[S.N_FRAMES] or 0 for r in run_ok)
    errors = Counter((r[S.ERROR] or "")[:160] for r in rows if r[S.STATUS] != S.STATUS_OK)
    per_actor: dict[str, dict] = {}
    row_rtfs: dict[str, list] = {}
    for r in this_run:
        if r[S.ACTOR] is None:  # rows the driver rejected never reached an actor
            continue
        a = per_actor.setdefault(
            r[S.ACTOR],
            {
                "node": r[S.NODE],
                "device": r[S.DEVICE],
                "rows": 0,
                "rows_ok": 0,
                "rows_error": 0,
                "audio_s": 0.0,
                "frames": 0,
            },
        )
        a["rows"] += 1
        if r[S.STATUS] == S.STATUS_OK:
            a["rows_ok"] += 1
            a["audio_s"] += r[S.AUDIO_SECONDS] or 0.0
            a["frames"] += r[S.N_FRAMES] or 0
            if r[S.RTF] is not None:
                row_rtfs.setdefault(r[S.ACTOR], []).append(r[S.RTF])
        else:
            a["rows_error"] += 1
    for actor, a in per_actor.items():
        rtfs = sorted(row_rtfs.get(actor, []))
        a["row_rtf_p50"] = rtfs[len(rtfs) // 2] if rtfs else None
        a["rows_per_s"] = _rate(a["rows"], wall_seconds)
        a["frames_per_s"] = _rate(a["frames"], wall_seconds)
    return {
        **extra,
        "run_id": run_id,
        "rows_total": len(rows),
        "rows_ok": len(ok_rows),
        "rows_error": len(rows) - len(ok_rows),
        "audio_seconds": audio_seconds,
        "audio_hours": audio_seconds / 3600.0,
        "wall_s": wall_seconds,
        "run_rows": len(this_run),
        "run_rows_ok": len(run_ok),
        "run_rows_error": len(this_run) - len(run_ok),
        "run_audio_seconds": run_audio,
        "rows_per_s": _rate(len(this_run), wall_seconds),
        "frames_per_s": _rate(run_frames, wall_seconds),
        "rtf": _rate(wall_seconds, run_audio),
        "top_errors": [{"error": e, "rows": n} for e, n in errors.most_common(10)],
        "per_actor": dict(sorted(per_actor.items())),
    }
