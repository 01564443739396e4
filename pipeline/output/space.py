"""A local output whose filesystem fills up: found in whatever failed (a part written by a Ray
task, the crash ledger an actor keeps beside the output, a shard packed at the run's end) and
told as one error naming the output, the space free and the space the rest of the run needs.

Nothing written is torn by it: every file of a local output is written under a temporary
name and renamed once whole (actors/files.py), so a write that fails leaves its temporary
file at most (never read as data; the next run's start deletes it), and the rerun resumes
from the parts already whole.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
from typing import Optional

import pyarrow.parquet as pq

from ..errors import OutputFull
from .layout import OutputLayout
from .listing import list_data

FULL = frozenset({errno.ENOSPC, errno.EDQUOT})
# a Ray task's error keeps its causes only as text (its traceback, its str()): Ray Data raises
# a user function's error `from` it, and an exception's cause does not travel with it
_FULL_TEXT = re.compile(r"OSError: \[Errno (" + "|".join(str(n) for n in sorted(FULL)) + r")\]")


def full_disk(error: BaseException) -> Optional[OSError]:
    """The "no space left" error in `error`'s chain (its causes, its context, a Ray task
    error's cause or traceback), or None."""
    seen, pending = set(), [error]
    while pending:
        current = pending.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in FULL:
            return current
        found = _FULL_TEXT.search(str(current))  # a Ray task error's text is its traceback
        if found:
            code = int(found.group(1))
            return OSError(code, os.strerror(code))
        pending += [current.__cause__, current.__context__, getattr(current, "cause", None)]
    return None


def _size(n: float) -> str:
    for unit in ("bytes", "KB", "MB", "GB", "TB"):
        if n < 1024 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def space_needed(layout: OutputLayout, rows_left: int) -> tuple[int, str]:
    """(bytes, how they were reckoned) the rest of the run needs: its rows at the size per row
    of the parts written so far, and a copy of every part not yet packed (a shard is written
    whole before the parts it absorbs are deleted)."""
    parts = [f for f in list_data(layout.footers, layout.data_dir).parts]
    unpacked = sum(f.size or 0 for f in parts)
    rows = sum(pq.read_metadata(f.path, filesystem=layout.fs).num_rows for f in parts)
    per_row = unpacked / rows if rows else 0.0
    needed = int(rows_left * per_row) + unpacked
    how = [f"{rows_left} rows still to write at ~{_size(per_row)} each"] if rows_left and per_row else []
    how.append(f"a copy of the {_size(unpacked)} of parts to pack into shards")
    return needed, " and ".join(how)


def output_full(layout: OutputLayout, error: OSError, rows_left: int) -> OutputFull:
    """The user's error for a full output filesystem."""
    usage = shutil.disk_usage(layout.base)
    needed, how = space_needed(layout, rows_left)
    return OutputFull(
        f"the output {layout.location} ran out of space ({error.strerror or error}: {_size(usage.free)} free of "
        f"{_size(usage.total)}); the rest of this run needs about {_size(needed)} ({how}). Free at least that "
        f"much (or move output.dir), then rerun the same command: it resumes from the parts already written, "
        f"none of which is torn"
    )
