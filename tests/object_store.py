"""An S3-compatible server for the tests, on 127.0.0.1 only: moto's server mode, started in the
test process, reached the way a user's environment reaches S3 (the standard AWS variables:
AWS_ENDPOINT_URL, keys, region), so chorus's own code, its subprocess drivers and its Ray
workers all find it without a line of test-only configuration.

moto checks `If-None-Match: *` and `If-Match` on PutObject and DeleteObject (what the exact
lease needs); it does not check them on a multipart upload's completion, which chorus does not
use for the lease.
"""

from __future__ import annotations

import logging
import os
import uuid
from pathlib import Path

# what a user sets to reach an S3-compatible store (the endpoint is filled in once it listens)
AWS_ENVIRONMENT = {
    "AWS_ACCESS_KEY_ID": "chorus-test",
    "AWS_SECRET_ACCESS_KEY": "chorus-test-secret",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",  # never ask a cloud's metadata address for credentials
}


class S3Store:
    """The running server: buckets on demand, uploads and downloads of whole trees."""

    def __init__(self):
        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no line per request in the test log
        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self._server.start()
        host, port = self._server.get_host_and_port()
        self.endpoint = f"http://{host}:{port}"
        self.environment = {**AWS_ENVIRONMENT, "AWS_ENDPOINT_URL": self.endpoint}
        self._saved = {name: os.environ.get(name) for name in self.environment}
        os.environ.update(self.environment)
        import boto3

        self.client = boto3.client("s3")

    def stop(self) -> None:
        for name, value in self._saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        self._server.stop()

    def bucket(self) -> str:
        """A new empty bucket; its s3:// URI."""
        name = f"chorus-{uuid.uuid4().hex[:12]}"
        self.client.create_bucket(Bucket=name)
        return f"s3://{name}"

    @staticmethod
    def split(uri: str) -> tuple[str, str]:
        bucket, _, key = uri.removeprefix("s3://").partition("/")
        return bucket, key

    def put(self, uri: str, body: bytes) -> None:
        bucket, key = self.split(uri)
        self.client.put_object(Bucket=bucket, Key=key, Body=body)

    def get(self, uri: str) -> bytes:
        bucket, key = self.split(uri)
        return self.client.get_object(Bucket=bucket, Key=key)["Body"].read()

    def keys(self, uri: str) -> list[str]:
        """Every object's key under `uri`, relative to it, sorted (folder markers left out)."""
        bucket, prefix = self.split(uri.rstrip("/") + "/")
        found = []
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            # a key ending in "/" is a folder's marker (pyarrow's create_dir), not an object
            found += [item["Key"][len(prefix) :] for item in page.get("Contents", []) if not item["Key"].endswith("/")]
        return sorted(found)

    def upload(self, local: Path, uri: str) -> None:
        """A file to the object `uri`, or a folder's files under the prefix `uri`."""
        if local.is_file():
            self.put(uri, local.read_bytes())
            return
        for path in sorted(p for p in local.rglob("*") if p.is_file()):
            self.put(f"{uri.rstrip('/')}/{path.relative_to(local).as_posix()}", path.read_bytes())

    def download(self, uri: str, local: Path) -> list[Path]:
        """Every object under the prefix `uri` into the folder `local`; the files written."""
        written = []
        for key in self.keys(uri):
            path = local / key
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(self.get(f"{uri.rstrip('/')}/{key}"))
            written.append(path)
        return written
