"""One small object of an S3 store written with preconditions: created only if absent
(`If-None-Match: *`), replaced or deleted only in the exact version seen (`If-Match: <etag>`).
pyarrow's S3 filesystem writes unconditionally, so this goes through boto3, the store's own
client, configured the way the rest of chorus's S3 access is: the standard AWS environment
(AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, AWS_PROFILE, ~/.aws) and the
bucket region pyarrow resolved.

Every call goes through chorus's retry policy (actors/storage), and the SDK makes one attempt
per call: a conditional write answered with an error may still have taken effect, and a blind
resend would then be refused by our own write. So after such an error the outcome is decided
by the object itself: a refusal that follows an unknown outcome reads the object back, and an
object holding exactly the bytes this call sent is this call's own write (every body chorus
sends is unique: a lease record carries its run and the time it was written).

A store that does not check these headers (some S3-compatible servers ignore them, others
answer 501) is found out before it is relied on: `probe` creates a scratch object twice and
expects the second create to be refused; transient failures are retried, never read as a
missing feature.
"""

from __future__ import annotations

import logging
import uuid
from typing import Optional

import pyarrow.fs as pafs

from actors.files import TEMP_PREFIX
from actors.storage import StoreError, retrying, unwrap

log = logging.getLogger("chorus")

# what a refused precondition looks like: 412 (the condition failed), 409 (S3: a concurrent
# conditional write to the same key is in progress: lost too), 404 (If-Match on a key gone)
_REFUSED = {"PreconditionFailed", "ConditionalRequestConflict", "NoSuchKey", "412", "409", "404"}
_UNSUPPORTED = {"NotImplemented", "501"}
# the SDK's own retries off (see the module doc); a stuck request ends well within a lease's life
_CLIENT_CONFIG = {"retries": {"mode": "standard", "total_max_attempts": 1}, "connect_timeout": 5, "read_timeout": 15}


class Unsupported(RuntimeError):
    """The store does not honour conditional writes."""


def _code(error) -> str:
    return str(getattr(error, "response", {}).get("Error", {}).get("Code", ""))


class ConditionalObject:
    def __init__(self, client, bucket: str, key: str):
        self.client, self.bucket, self.key = client, bucket, key

    @property
    def uri(self) -> str:
        return f"s3://{self.bucket}/{self.key}"

    @classmethod
    def for_path(cls, fs: pafs.FileSystem, path: str) -> Optional[ConditionalObject]:
        """For `path` ("bucket/key", as pyarrow names it) of an S3 filesystem; None for any
        other store, or when boto3 is not installed."""
        store = unwrap(fs)
        if store.type_name != "s3":
            return None
        try:
            import boto3
            from botocore.config import Config
        except ImportError:
            log.warning("boto3 is not installed: the lease on this S3 output cannot use conditional writes")
            return None
        bucket, _, key = path.partition("/")
        region = getattr(store, "region", None) or None
        return cls(boto3.client("s3", region_name=region, config=Config(**_CLIENT_CONFIG)), bucket, key)

    def _attempt(self, method: str, **kwargs):
        """One client call; None when the store refused its precondition (or there is no
        such object)."""
        from botocore.exceptions import ClientError

        try:
            return getattr(self.client, method)(Bucket=self.bucket, Key=self.key, **kwargs)
        except ClientError as e:
            if _code(e) in _REFUSED:
                return None
            if _code(e) in _UNSUPPORTED:
                raise Unsupported(f"{method}: {e}") from e
            raise

    def _get(self) -> Optional[tuple[bytes, str]]:
        answer = self._attempt("get_object")
        return None if answer is None else (answer["Body"].read(), answer["ETag"])

    def _retried(self, what: str, attempt):
        return retrying(attempt, self.uri, what, answers=(Unsupported,))

    def _write(self, what: str, body: bytes, **condition) -> Optional[str]:
        """One conditional PutObject: its etag, or None when the store refused it. After a try
        with an unknown outcome, a refusal is checked against the object: holding `body`, it
        is this write's own (the module doc)."""
        unknown = False

        def attempt() -> Optional[str]:
            nonlocal unknown
            try:
                answer = self._attempt("put_object", Body=body, **condition)
            except Unsupported:
                raise
            except Exception:
                unknown = True  # it may have taken effect
                raise
            if answer is not None:
                return answer["ETag"]
            if not unknown:
                return None
            seen = self._get()
            if seen is not None and seen[0] == body:
                log.info("%s %s: an earlier try answered with an error had taken effect", what, self.uri)
                return seen[1]
            return None

        return self._retried(what, attempt)

    def create(self, body: bytes) -> Optional[str]:
        """Write the object only if no object is there; its etag, or None."""
        return self._write("creating", body, IfNoneMatch="*")

    def read(self) -> Optional[tuple[bytes, str]]:
        """(body, etag) of the object as it is now; None when there is none."""
        return self._retried("reading", self._get)  # a body cut off mid-read is read again

    def replace(self, body: bytes, etag: str) -> Optional[str]:
        """Write the object only if it is still the version `etag`; the new etag, or None."""
        return self._write("replacing", body, IfMatch=etag)

    def remove(self) -> None:
        """Delete the object unconditionally (a scratch object of ours)."""
        self._retried("deleting", lambda: self._attempt("delete_object"))

    def delete(self, etag: str) -> bool:
        """Delete the object only if it is still the version `etag`; whether it is gone now
        because of this call. Stores that accept no condition on a delete get a read of the
        etag, then a plain delete (a replacement landing between the two would be lost: the
        holder is releasing it anyway)."""
        try:
            if self._retried("deleting", lambda: self._attempt("delete_object", IfMatch=etag)) is not None:
                return True
        except Unsupported:
            pass
        seen = self.read()  # refused: gone already (an earlier try took effect), or another's now
        if seen is None:
            return True
        if seen[1] != etag:
            return False
        self.remove()
        return True

    def probe(self) -> Optional[str]:
        """None when the store refuses a second create of one key; else why chorus cannot use
        conditional writes here. A scratch key beside ours, named as a temporary file of ours,
        so a driver starting meanwhile and looking at the folder does not take it for someone
        else's file. A store that keeps failing raises StoreError: no conclusion from faults."""
        folder, _, name = self.key.rpartition("/")
        scratch_name = f"{TEMP_PREFIX}probe-{uuid.uuid4().hex}-{name}"
        scratch = ConditionalObject(self.client, self.bucket, f"{folder}/{scratch_name}" if folder else scratch_name)
        try:
            if scratch.create(f"probe {uuid.uuid4().hex}".encode()) is None:
                return "the store refused to create a new scratch object with If-None-Match"
            if scratch.create(f"probe again {uuid.uuid4().hex}".encode()) is not None:
                return "the store accepted a second create of one key: it ignores If-None-Match"
            return None
        except Unsupported as e:
            return f"the store does not implement conditional writes ({e})"
        finally:
            try:
                scratch.remove()
            except StoreError as e:  # a leftover scratch object is named as a lease temp: never foreign
                log.warning("could not delete the probe's scratch object: %s", e)
