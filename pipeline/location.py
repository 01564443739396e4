"""Where things are: a local path or a URI (s3://, gs://, file://, anything pyarrow reads), its
filesystem, and the run's scratch folders. A leaf: imports nothing of the driver."""

from __future__ import annotations

import errno
import os
import re
import shutil
import tempfile
from typing import Optional

import pyarrow.fs as pafs

from actors.demo import cache_root
from actors.errors import ConfigError
from actors.storage import open_uri

_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def is_local(location: str) -> bool:
    return not _SCHEME.match(location) or location.startswith("file://")


def local_path(location: str) -> str:
    if location.startswith("file://"):
        location = location[len("file://") :]
    return os.path.abspath(os.path.expanduser(location))


def absolute(location: Optional[str]) -> Optional[str]:
    """A local path made absolute (file:// and ~ resolved); a URI, or None, as it is."""
    if location is None or not is_local(location):
        return location
    return local_path(location)


def open_location(location: str) -> tuple[pafs.FileSystem, str]:
    """(filesystem, path inside it) for a local path or any URI pyarrow understands; a URI's
    filesystem retries every call as chorus's one retry policy says (actors/storage)."""
    if is_local(location):
        return pafs.LocalFileSystem(), local_path(location)
    return open_uri(location)


def scratch_dir(output_location: str, folder: str, run_id: str) -> str:
    """A run's working folder (`folder`/`run_id`): beside the output when the output is local
    (a shared filesystem serves every node), else in this machine's chorus cache
    ($CHORUS_CACHE or ~/.cache/chorus: the driver's node only)."""
    if is_local(output_location):
        return os.path.join(local_path(output_location), folder, run_id)
    return os.path.join(str(cache_root()), folder, run_id)


def check_writable(location: str, key: str) -> None:
    """Refuse a local folder that cannot be created or written (a path under a file, a
    read-only or system filesystem, no permission), naming `key`; leaves nothing behind: the
    test is a folder made and removed in the nearest existing one. A URI is checked by its
    store when it is first written."""
    if not is_local(location):
        return
    path = local_path(location)
    existing = path
    while not os.path.lexists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise ConfigError(f"{key}={location!r} cannot be created: {existing} is a file; choose another {key}")
    try:
        shutil.rmtree(tempfile.mkdtemp(prefix=".chorus-write-test-", dir=existing))
    except OSError as e:
        why = os.strerror(e.errno) if e.errno else str(e)
        fix = "choose a folder you can write" + (", or fix its permissions" if e.errno == errno.EACCES else "")
        raise ConfigError(f"{key}={location!r} cannot be written ({why} in {existing}); {fix}") from e
