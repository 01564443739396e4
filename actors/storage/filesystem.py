"""A URI's filesystem with chorus's retry policy (retry.py) around every call: `open_uri`.

pyarrow's filesystem for a URI (S3, GCS, ...) wrapped in a `pyarrow.fs.PyFileSystem`, so every
caller -- listings, footers, reads, writes, deletes, in the driver and in Ray tasks (it pickles)
-- gets the same behaviour without a line of its own:

- every metadata call (information, listing, delete, create_dir, copy, move) is retried as
  the policy says; a delete tried again after an unknown outcome that finds the object gone
  counts as done (the earlier try took effect);
- a read is retried per request, at the position it was at (`_Reader`);
- a write is spooled (in memory, past SPOOL_BYTES to a local temporary file) and uploaded whole
  when the stream closes, the whole upload retried (`_Upload`): an object appears complete or
  not at all, and a write answered with an error after it took effect is simply written again.

The S3 SDK underneath makes REQUEST_ATTEMPTS attempts per HTTP request (its "standard" mode:
backoff with jitter), for the parts of a multipart upload; small objects go in one PutObject
(`allow_delayed_open`) instead of a create / part / complete sequence.
"""

from __future__ import annotations

import logging
import tempfile
from typing import Optional

import pyarrow as pa
import pyarrow.fs as pafs

from .retry import DEFAULT_POLICY, RetryPolicy, retrying

log = logging.getLogger("chorus")

REQUEST_ATTEMPTS = 3  # per HTTP request, by the S3 SDK (the multipart upload's parts)
SPOOL_BYTES = 64 << 20  # a write held in memory up to this size, then in a local temporary file
_COPY_BYTES = 8 << 20


def _s3_with_request_retries(fs: pafs.FileSystem) -> pafs.FileSystem:
    """The S3 filesystem `from_uri` resolved (endpoint, region, credentials chain), rebuilt with
    the SDK's standard retries and delayed open; as it was where its options cannot be read."""
    try:
        options = fs.__reduce__()[1][0]  # the options pyarrow pickles it with
        return pafs.S3FileSystem(
            **{
                **options,
                "retry_strategy": pafs.AwsStandardS3RetryStrategy(max_attempts=REQUEST_ATTEMPTS),
                "allow_delayed_open": True,
            }
        )
    except (TypeError, IndexError, AttributeError) as e:  # another pyarrow's options
        log.debug("S3 filesystem kept as from_uri made it: %r", e)
        return fs


def open_uri(uri: str, policy: RetryPolicy = DEFAULT_POLICY) -> tuple[pafs.FileSystem, str]:
    """(filesystem, path inside it) for a URI (s3://, gs://, ...): pyarrow's, with every call
    retried as `policy` says (the module doc)."""
    fs, path = pafs.FileSystem.from_uri(uri)
    if isinstance(fs, pafs.LocalFileSystem):
        return fs, path
    if fs.type_name == "s3":
        fs = _s3_with_request_retries(fs)
    scheme = uri.split("://", 1)[0]
    return pafs.PyFileSystem(RetryingHandler(fs, scheme, policy)), path


def unwrap(fs: pafs.FileSystem) -> pafs.FileSystem:
    """The store's own filesystem under a retrying one (its type, its region); others as they are."""
    handler = getattr(fs, "handler", None)
    return handler.inner if isinstance(handler, RetryingHandler) else fs


class RetryingHandler(pafs.FileSystemHandler):
    """pyarrow's handler protocol over another filesystem, every call retried (the module doc)."""

    def __init__(self, inner: pafs.FileSystem, scheme: str, policy: RetryPolicy = DEFAULT_POLICY):
        self.inner, self.scheme, self.policy = inner, scheme, policy

    def __reduce__(self):
        return RetryingHandler, (self.inner, self.scheme, self.policy)

    def __eq__(self, other) -> bool:
        return isinstance(other, RetryingHandler) and self.inner.equals(other.inner) and self.scheme == other.scheme

    def __ne__(self, other) -> bool:
        return not self == other

    def uri(self, path: str) -> str:
        return f"{self.scheme}://{path}"

    def call(self, what: str, path: str, operation):
        return retrying(operation, self.uri(path), what, self.policy)

    def get_type_name(self) -> str:
        return f"chorus-retrying-{self.inner.type_name}"

    def normalize_path(self, path: str) -> str:
        return self.inner.normalize_path(path)

    def get_file_info(self, paths: list) -> list:
        return [self.call("reading information on", p, lambda p=p: self.inner.get_file_info(p)) for p in paths]

    def get_file_info_selector(self, selector: pafs.FileSelector) -> list:
        return self.call("listing", selector.base_dir, lambda: self.inner.get_file_info(selector))

    def create_dir(self, path: str, recursive: bool) -> None:
        self.call("creating", path, lambda: self.inner.create_dir(path, recursive=recursive))

    def delete_dir(self, path: str) -> None:
        self.call("deleting", path, lambda: self.inner.delete_dir(path))

    def delete_dir_contents(self, path: str, missing_dir_ok: bool = False) -> None:
        self.call("deleting under", path, lambda: self.inner.delete_dir_contents(path, missing_dir_ok=missing_dir_ok))

    def delete_root_dir_contents(self) -> None:
        self.call("deleting under", "", self.inner.delete_root_dir_contents)

    def delete_file(self, path: str) -> None:
        tried = []

        def attempt() -> None:
            try:
                self.inner.delete_file(path)
            except FileNotFoundError:
                if not tried:  # absent before any try of ours
                    raise
            finally:
                tried.append(True)

        self.call("deleting", path, attempt)

    def move(self, src: str, dest: str) -> None:
        self.call("moving", src, lambda: self.inner.move(src, dest))

    def copy_file(self, src: str, dest: str) -> None:
        self.call("copying", src, lambda: self.inner.copy_file(src, dest))

    def open_input_stream(self, path: str) -> pa.NativeFile:
        return pa.PythonFile(_Reader(self, path), mode="r")

    def open_input_file(self, path: str) -> pa.NativeFile:
        return pa.PythonFile(_Reader(self, path), mode="r")

    def open_output_stream(self, path: str, metadata: Optional[dict] = None) -> pa.NativeFile:
        return pa.PythonFile(_Upload(self, path, metadata), mode="w")

    def open_append_stream(self, path: str, metadata: Optional[dict] = None) -> pa.NativeFile:
        raise NotImplementedError(f"{self.uri(path)}: object stores do not append")


class _ObjectFile:
    """What pa.PythonFile asks a file-like object: a reader reads and seeks, a writer writes."""

    READS = True

    def readable(self) -> bool:
        return self.READS

    def seekable(self) -> bool:
        return self.READS

    def writable(self) -> bool:
        return not self.READS


class _Reader(_ObjectFile):
    """A file-like reader of one object: each read a request of its own at the position it was
    at, retried (reopening the object) as the handler's policy says."""

    def __init__(self, handler: RetryingHandler, path: str):
        self.handler, self.path = handler, path
        self.file: Optional[pa.NativeFile] = None
        self.size = handler.call("opening", path, self._open)
        self.position = 0
        self.closed = False

    def _open(self) -> int:
        self.file = self.handler.inner.open_input_file(self.path)
        return self.file.size()

    def _read_at(self, count: int, offset: int) -> bytes:
        try:
            if self.file is None:
                self._open()
            return self.file.read_at(count, offset)
        except Exception:
            self.file = None  # a reset connection: the next try opens afresh
            raise

    def read(self, count: int = -1) -> bytes:
        count = self.size - self.position if count is None or count < 0 else min(count, self.size - self.position)
        if count <= 0:
            return b""
        data = self.handler.call("reading", self.path, lambda: self._read_at(count, self.position))
        self.position += len(data)
        return data

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self.position, 2: self.size}[whence]
        self.position = base + offset
        return self.position

    def tell(self) -> int:
        return self.position

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
        self.closed = True


class _Upload(_ObjectFile):
    """A file-like writer of one object: the bytes are spooled and uploaded whole at close,
    the upload retried as the handler's policy says (the module doc)."""

    READS = False

    def __init__(self, handler: RetryingHandler, path: str, metadata: Optional[dict]):
        self.handler, self.path, self.metadata = handler, path, metadata
        self.spool = tempfile.SpooledTemporaryFile(max_size=SPOOL_BYTES)
        self.closed = False

    def write(self, data) -> int:
        return self.spool.write(data)

    def flush(self) -> None:
        pass

    def tell(self) -> int:
        return self.spool.tell()

    def _upload(self) -> None:
        self.spool.seek(0)
        # compression=None: the outer stream already applied what its caller asked (pyarrow would
        # otherwise gzip a name ending in .gz a second time)
        with self.handler.inner.open_output_stream(self.path, compression=None, metadata=self.metadata) as out:
            while chunk := self.spool.read(_COPY_BYTES):
                out.write(chunk)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            self.handler.call("writing", self.path, self._upload)
        finally:
            self.spool.close()
