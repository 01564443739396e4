"""One small object of an S3 store written with preconditions: created only if absent
(`If-None-Match: *`), replaced or deleted only in the exact version seen (`If-Match: <etag>`).
pyarrow's S3 filesystem writes unconditionally, so this goes through boto3, the store's own
client, configured the way the rest of chorus's S3 access is: the standard AWS environment
(AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, AWS_PROFILE, ~/.aws) and the
bucket region pyarrow resolved.

A store that does not check these headers (some S3-compatible servers ignore them, others
answer 501) is found out before it is relied on: `probe` creates a scratch object twice and
expects the second create to be refused.
"""

from __future__ import annotations

import logging
import uuid
from typing import Optional

import pyarrow.fs as pafs

from actors.files import TEMP_PREFIX

log = logging.getLogger("chorus")

# what a refused precondition looks like: 412 (the condition failed), 409 (S3: a concurrent
# conditional write to the same key is in progress: lost too), 404 (If-Match on a key gone)
_REFUSED = {"PreconditionFailed", "ConditionalRequestConflict", "NoSuchKey", "412", "409", "404"}
_UNSUPPORTED = {"NotImplemented", "501"}


class Unsupported(RuntimeError):
    """The store does not honour conditional writes."""


def _code(error) -> str:
    return str(getattr(error, "response", {}).get("Error", {}).get("Code", ""))


class ConditionalObject:
    def __init__(self, client, bucket: str, key: str):
        self.client, self.bucket, self.key = client, bucket, key

    @classmethod
    def for_path(cls, fs: pafs.FileSystem, path: str) -> Optional[ConditionalObject]:
        """For `path` ("bucket/key", as pyarrow names it) of an S3 filesystem; None for any
        other store, or when boto3 is not installed."""
        if fs.type_name != "s3":
            return None
        try:
            import boto3
        except ImportError:
            log.warning("boto3 is not installed: the lease on this S3 output cannot use conditional writes")
            return None
        bucket, _, key = path.partition("/")
        client = boto3.client("s3", region_name=getattr(fs, "region", None) or None)
        return cls(client, bucket, key)

    def _call(self, method: str, **kwargs):
        """The client call; None when the store refused its precondition."""
        from botocore.exceptions import ClientError

        try:
            return getattr(self.client, method)(Bucket=self.bucket, Key=self.key, **kwargs)
        except ClientError as e:
            if _code(e) in _REFUSED:
                return None
            if _code(e) in _UNSUPPORTED:
                raise Unsupported(f"{method}: {e}") from e
            raise

    def create(self, body: bytes) -> Optional[str]:
        """Write the object only if no object is there; its etag, or None."""
        answer = self._call("put_object", Body=body, IfNoneMatch="*")
        return None if answer is None else answer["ETag"]

    def read(self) -> Optional[tuple[bytes, str]]:
        """(body, etag) of the object as it is now; None when there is none."""
        answer = self._call("get_object")
        return None if answer is None else (answer["Body"].read(), answer["ETag"])

    def replace(self, body: bytes, etag: str) -> Optional[str]:
        """Write the object only if it is still the version `etag`; the new etag, or None."""
        answer = self._call("put_object", Body=body, IfMatch=etag)
        return None if answer is None else answer["ETag"]

    def delete(self, etag: str) -> bool:
        """Delete the object only if it is still the version `etag`. Stores that accept no
        condition on a delete get a read of the etag, then a plain delete (a replacement
        landing between the two would be lost: the holder is releasing it anyway)."""
        from botocore.exceptions import ClientError

        try:
            return self._call("delete_object", IfMatch=etag) is not None
        except (Unsupported, ClientError):
            seen = self.read()
            if seen is None or seen[1] != etag:
                return False
            self.client.delete_object(Bucket=self.bucket, Key=self.key)
            return True

    def probe(self) -> bool:
        """Whether the store refuses a second create of one key (a scratch key beside ours,
        named as a temporary file of ours, so a driver starting meanwhile and looking at the
        folder does not take it for someone else's file)."""
        folder, _, name = self.key.rpartition("/")
        scratch_name = f"{TEMP_PREFIX}probe-{uuid.uuid4().hex}-{name}"
        scratch = ConditionalObject(self.client, self.bucket, f"{folder}/{scratch_name}" if folder else scratch_name)
        try:
            first = scratch.create(b"probe")
            refused = first is not None and scratch.create(b"probe again") is None
        except Unsupported:
            return False
        finally:
            self.client.delete_object(Bucket=scratch.bucket, Key=scratch.key)
        return refused
