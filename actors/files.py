"""Files written whole: a reader (another process, a resumed run, a browser) sees the old
content or the new, never a torn one, because the data goes to a temporary name beside the
target, is flushed to disk, and is renamed over it (a rename within one directory is atomic
on POSIX and Windows). A failed write leaves nothing behind."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Optional, Union

TEMP_PREFIX = ".tmp-"  # readers (pyarrow, Ray, HF datasets, globs) skip names starting with '.'


@contextmanager
def atomic_open(
    path: Union[str, Path], mode: str = "wb", prefix: str = TEMP_PREFIX, before_replace: Optional[Callable] = None
) -> Iterator[IO]:
    """`with atomic_open(path, "w") as f: ...` writes `path` whole or not at all. The file gets
    the permissions of any new file (the umask's), not a private temporary file's.
    `before_replace` runs once the data is on disk, just before the rename (a test's crash point)."""
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_open writes whole files: mode 'w' or 'wb', got {mode!r}")
    path = Path(path)
    temp = path.with_name(f"{prefix}{os.getpid()}-{uuid.uuid4().hex[:8]}-{path.name}")
    try:
        with open(temp, mode.replace("w", "x"), encoding=None if "b" in mode else "utf-8") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        if before_replace is not None:
            before_replace()
        os.replace(temp, path)
    except BaseException:
        try:
            os.unlink(temp)
        except OSError:
            pass
        raise


def write_atomically(path: Union[str, Path], data: Union[str, bytes], prefix: str = TEMP_PREFIX) -> None:
    with atomic_open(path, "wb" if isinstance(data, bytes) else "w", prefix=prefix) as f:
        f.write(data)
