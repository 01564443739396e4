"""The one retry policy of every object-store call chorus makes itself.

An object store under load answers `503 SlowDown`, `500 InternalError`, resets connections and
times out; a day-long job meets each of these thousands of times. `retrying` runs one call
again after such a transient failure, waiting longer each time (exponential backoff with
jitter, so that many writers do not come back in step), a bounded number of times; a
permanent failure (access denied, no such bucket, bad credentials) raises `StoreError` at
once, naming the URI and the fix. A thread may set a time past which its retries stop
(`give_up_by`: the lease's heartbeat must stop trying before its lease goes stale).

The SDKs underneath make one attempt per request for conditional writes (their outcome after
an error is decided by reading back, pipeline/output/conditional.py) and a few per request for
pyarrow's transfers (a multipart upload's parts, filesystem.py): this policy is what a whole
call gets.
"""

from __future__ import annotations

import logging
import random
import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Optional, TypeVar

log = logging.getLogger("chorus")

T = TypeVar("T")

TRANSIENT, PERMANENT, ABSENT = "transient", "permanent", "absent"

# pyarrow names the S3 SDK's error ("AWS Error SLOW_DOWN during PutObject operation: ..."; a
# HEAD has no body, so its 503 reads "AWS Error UNKNOWN (HTTP status 503)"), GCS a gRPC status,
# botocore the store's own code; a multipart upload whose completion was answered 500 after it
# took effect is gone when the SDK retries it (NO_SUCH_UPLOAD): the whole upload is redone
_TRANSIENT_WORDS = (
    "SLOW_DOWN",
    "SlowDown",
    "THROTTLING",
    "Throttling",
    "TooManyRequests",
    "RequestLimitExceeded",
    "INTERNAL_FAILURE",
    "InternalError",
    "SERVICE_UNAVAILABLE",
    "ServiceUnavailable",
    "NETWORK_CONNECTION",
    "REQUEST_TIMEOUT",
    "RequestTimeout",
    "NO_SUCH_UPLOAD",
    "NoSuchUpload",
    "curlCode",
    "UNAVAILABLE",
    "DEADLINE_EXCEEDED",
    "RESOURCE_EXHAUSTED",
    "Connection reset",
    "Connection was closed",
    "timed out",
)
_STATUS = re.compile(r"HTTP status (\d{3})")
_TRANSIENT_STATUS = {408, 429} | set(range(500, 600))
# the permanent failures a user can fix, and how
_FIXES = (
    (
        ("ACCESS_DENIED", "AccessDenied", "PERMISSION_DENIED", "Forbidden", "HTTP status 403"),
        "the store refused access: check that the credentials chorus runs with (AWS_ACCESS_KEY_ID / "
        "AWS_SECRET_ACCESS_KEY, AWS_PROFILE or the node's role; on a cluster, every node's) may read and write it",
    ),
    (
        ("NO_SUCH_BUCKET", "NoSuchBucket"),
        "the bucket does not exist: create it, or fix the URI",
    ),
    (
        (
            "INVALID_ACCESS_KEY_ID",
            "InvalidAccessKeyId",
            "SIGNATURE_DOES_NOT_MATCH",
            "SignatureDoesNotMatch",
            "NoCredentialsError",
            "UNAUTHENTICATED",
            "ExpiredToken",
        ),
        "the store did not accept the credentials: check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (or "
        "AWS_PROFILE), and AWS_ENDPOINT_URL for an S3-compatible store",
    ),
)
_OTHER_FIX = "the store refused the request; fix what it names, then rerun the same command to resume"


class StoreError(RuntimeError):
    """An object-store call that failed for good: a permanent error, or transient ones past the
    retry policy. Its message names the URI and what to do."""


def _error_code(error: BaseException) -> tuple[str, Optional[int]]:
    """(code, HTTP status) of a botocore ClientError; ("", None) for anything else."""
    response = getattr(error, "response", None)
    if not isinstance(response, dict):
        return "", None
    code = str(response.get("Error", {}).get("Code", ""))
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return code, status if isinstance(status, int) else None


def classify(error: BaseException) -> str:
    """TRANSIENT (worth another try), ABSENT (no such object: the caller decides what that
    means) or PERMANENT."""
    if isinstance(error, FileNotFoundError):
        return ABSENT
    code, status = _error_code(error)
    if code in ("NoSuchKey", "NotFound") or (status == 404 and code != "NoSuchBucket"):
        return ABSENT
    if status in _TRANSIENT_STATUS:
        return TRANSIENT
    text = f"{code} {error}"
    match = _STATUS.search(text)
    if match and int(match.group(1)) in _TRANSIENT_STATUS:
        return TRANSIENT
    if any(word in text for word in _TRANSIENT_WORDS):
        return TRANSIENT
    # botocore's connection failures (ConnectionClosedError, EndpointConnectionError, read and
    # connect timeouts) are HTTPClientErrors; Python's own are ConnectionError / TimeoutError
    names = {cls.__name__ for cls in type(error).__mro__}
    if names & {"HTTPClientError", "ConnectionError", "TimeoutError"}:
        return TRANSIENT
    return PERMANENT


def fix_for(error: BaseException) -> str:
    text = f"{_error_code(error)[0]} {type(error).__name__} {error}"
    return next((fix for words, fix in _FIXES if any(word in text for word in words)), _OTHER_FIX)


@dataclass(frozen=True)
class RetryPolicy:
    """At most `attempts` tries; before try k+1 a wait of between half and all of
    min(max_delay_s, first_delay_s * 2**k) (exponential backoff, "equal jitter"). At the
    defaults a call that keeps failing gives up after ~55 s (72 s at most)."""

    attempts: int = 10
    first_delay_s: float = 0.25
    max_delay_s: float = 20.0

    def delays(self) -> Iterator[float]:
        for retry in range(self.attempts - 1):
            ceiling = min(self.max_delay_s, self.first_delay_s * 2**retry)
            yield ceiling / 2 + random.uniform(0.0, ceiling / 2)


DEFAULT_POLICY = RetryPolicy()

_local = threading.local()
_spent_lock = threading.Lock()
_spent = 0


@contextmanager
def give_up_by(deadline: float):
    """Within the block, this thread's retries stop at `deadline` (time.monotonic())."""
    previous = getattr(_local, "deadline", None)
    _local.deadline = deadline if previous is None else min(previous, deadline)
    try:
        yield
    finally:
        _local.deadline = previous


def retries_spent() -> int:
    """Retries this process has made so far (every thread)."""
    return _spent


def _count_retry() -> None:
    global _spent
    with _spent_lock:
        _spent += 1


def retrying(
    operation: Callable[[], T],
    uri: str,
    what: str,
    policy: RetryPolicy = DEFAULT_POLICY,
    answers: tuple[type[BaseException], ...] = (),
) -> T:
    """`operation()`, tried again after each transient failure as `policy` says. An ABSENT
    answer (FileNotFoundError, NoSuchKey) and the exceptions in `answers` (the caller's own
    conclusions) are raised as they are; a permanent failure, or a transient one past the
    policy or this thread's `give_up_by`, raises StoreError naming `what` ("writing",
    "listing", ...) and `uri`."""
    began = time.monotonic()
    delays = policy.delays()
    tries = 0
    while True:
        tries += 1
        try:
            return operation()
        except (StoreError, *answers):  # a nested call's verdict, or the caller's own conclusions
            raise
        except Exception as error:
            kind = classify(error)
            if kind == ABSENT:
                raise
            if kind == PERMANENT:
                raise StoreError(f"{what} {uri} failed: {_short(error)}; {fix_for(error)}") from error
            wait = next(delays, None)
            deadline = getattr(_local, "deadline", None)
            if wait is None or (deadline is not None and time.monotonic() + wait > deadline):
                raise StoreError(
                    f"{what} {uri} failed {tries} time(s) over {time.monotonic() - began:.0f} s (last: "
                    f"{_short(error)}): the store is overloaded or unreachable; rerun the same command to "
                    f"resume once it answers"
                ) from error
            (log.info if tries >= 3 else log.debug)(
                "%s %s: %s; try %d in %.2f s", what, uri, _short(error), tries + 1, wait
            )
            _count_retry()
            time.sleep(wait)


def _short(error: BaseException) -> str:
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text[:300]}"
