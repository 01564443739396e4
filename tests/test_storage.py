"""chorus's one retry policy for object stores (actors/storage) against a real S3 server behind
a real fault-injecting proxy (tests/fault_proxy.py), no Ray: transient faults retried until
the call succeeds, writes whole whatever the answers said, permanent failures at once with
the URI and the fix, a call that keeps failing given up within its bound."""

from __future__ import annotations

import time

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
from botocore.exceptions import ClientError, ConnectionClosedError
from fault_proxy import AMBIGUOUS, DENIED, DROP, SLOWDOWN, Rule

from actors.storage import RetryPolicy, StoreError, classify, give_up_by, open_uri, retries_spent
from actors.storage.retry import ABSENT, PERMANENT, TRANSIENT

QUICK = RetryPolicy(attempts=3, first_delay_s=0.05, max_delay_s=0.1)


def table(rows: int, tag: str) -> pa.Table:
    return pa.table({"n": list(range(rows)), "tag": [tag] * rows})


@pytest.mark.parametrize("fault", [SLOWDOWN, DROP, AMBIGUOUS])
def test_a_call_failing_past_the_sdks_own_tries_is_retried_until_it_succeeds(fault_proxy, s3_store, fault):
    fs, base = open_uri(f"{s3_store.bucket()}/out")
    path = f"{base}/x.parquet"
    # the SDK tries each request 3 times: 4 faults in a row fail its first call, not chorus's
    method = "PUT" if fault == AMBIGUOUS else None
    rule = fault_proxy.add(Rule(fault, r"/out/x\.parquet", method=method, times=4))
    before = retries_spent()
    with fs.open_output_stream(path) as sink:
        pq.write_table(table(100, fault), sink)
    assert pq.read_table(path, filesystem=fs).equals(table(100, fault))
    assert rule.hits == 4 and retries_spent() > before


@pytest.mark.slow  # > 7 s: the everyday subset stays under 5 minutes
def test_writes_reads_listings_and_deletes_are_whole_through_a_faulty_store(fault_proxy, s3_store):
    fault_proxy.set_rates(slowdown=0.10, ambiguous=0.10, drop=0.05)
    uri = f"{s3_store.bucket()}/out"
    fs, base = open_uri(uri)
    names = [f"part-{i}.parquet" for i in range(10)]
    for i, name in enumerate(names):
        with fs.open_output_stream(f"{base}/{name}") as sink:
            pq.write_table(table(1000 + i, name), sink)
    listed = fs.get_file_info(pafs.FileSelector(base))
    assert sorted(f.base_name for f in listed) == sorted(names)
    for i, name in enumerate(names):
        assert pq.read_table(f"{base}/{name}", filesystem=fs).equals(table(1000 + i, name))
        # what the store holds, read past the proxy: the whole file
        body = s3_store.get(f"{uri}/{name}")
        assert pq.read_table(pa.BufferReader(body)).equals(table(1000 + i, name))
    for name in names:
        fs.delete_file(f"{base}/{name}")
    assert s3_store.keys(uri) == []
    faults = fault_proxy.counts()["faults"]
    assert faults[SLOWDOWN] and faults[AMBIGUOUS] and faults[DROP], faults


def test_permanent_failures_fail_at_once_naming_the_uri_and_the_fix(fault_proxy, s3_store):
    uri = f"{s3_store.bucket()}/out"
    fs, base = open_uri(uri)
    rule = fault_proxy.add(Rule(DENIED, r"/out/secret", times=None))
    began = time.monotonic()
    with pytest.raises(StoreError) as denied:
        fs.get_file_info(f"{base}/secret")
    assert time.monotonic() - began < 2.0 and rule.hits == 1  # no retry, not even the SDK's
    assert f"{uri}/secret" in str(denied.value) and "credentials" in str(denied.value)
    missing_bucket = "s3://chorus-no-such-bucket-47/out"
    with pytest.raises(StoreError, match="chorus-no-such-bucket-47.*the bucket does not exist: create it"):
        open_uri(missing_bucket)[0].get_file_info(pafs.FileSelector("chorus-no-such-bucket-47/out"))
    with pytest.raises(FileNotFoundError):  # absent is an answer, for the caller to judge
        fs.open_input_file(f"{base}/nothing-here")


@pytest.mark.slow  # > 7 s: the everyday subset stays under 5 minutes
def test_a_call_that_keeps_failing_gives_up_within_its_bound(fault_proxy, s3_store):
    uri = f"{s3_store.bucket()}/out"
    fault_proxy.add(Rule(SLOWDOWN, r"/out/", times=None))
    fs, base = open_uri(uri, policy=QUICK)
    with pytest.raises(StoreError, match=rf"reading information on {uri}/x failed 3 time\(s\).*rerun the same command"):
        fs.get_file_info(f"{base}/x")
    # a thread's deadline ends the default policy's retries early (the lease's heartbeat)
    fs, base = open_uri(uri)
    began = time.monotonic()
    with give_up_by(time.monotonic() + 1.5), pytest.raises(StoreError, match="failed"):
        fs.get_file_info(f"{base}/x")
    assert time.monotonic() - began < 5.0  # the deadline, plus one call's own SDK tries


def test_errors_are_told_apart():
    def client_error(code: str, status: int) -> ClientError:
        return ClientError({"Error": {"Code": code}, "ResponseMetadata": {"HTTPStatusCode": status}}, "PutObject")

    assert classify(client_error("SlowDown", 503)) == TRANSIENT
    assert classify(client_error("InternalError", 500)) == TRANSIENT
    assert classify(client_error("AccessDenied", 403)) == PERMANENT
    assert classify(client_error("NoSuchBucket", 404)) == PERMANENT
    assert classify(client_error("NoSuchKey", 404)) == ABSENT
    assert classify(ConnectionClosedError(endpoint_url="http://127.0.0.1:1")) == TRANSIENT
    assert classify(FileNotFoundError("gone")) == ABSENT
    # pyarrow's own texts (a HEAD's 503 has no body to name its code)
    assert classify(OSError("AWS Error UNKNOWN (HTTP status 503) during HeadObject operation")) == TRANSIENT
    assert classify(OSError("AWS Error NETWORK_CONNECTION during GetObject operation: curlCode: 52")) == TRANSIENT
    assert classify(OSError("AWS Error ACCESS_DENIED during PutObject operation")) == PERMANENT


def test_waits_grow_with_jitter_and_are_bounded():
    policy = RetryPolicy()
    for _ in range(20):
        waits = list(policy.delays())
        assert len(waits) == policy.attempts - 1
        ceilings = [min(policy.max_delay_s, policy.first_delay_s * 2**k) for k in range(len(waits))]
        assert all(c / 2 <= w <= c for w, c in zip(waits, ceilings))
    assert sum(min(policy.max_delay_s, policy.first_delay_s * 2**k) for k in range(policy.attempts - 1)) < 75


def test_an_object_is_stored_as_the_bytes_written_whatever_its_name(s3_store):
    # pyarrow compresses by a name's extension unless told not to: a .gz written through the
    # retrying filesystem was gzipped a second time on its way to the store
    fs, base = open_uri(s3_store.bucket())
    payload = b"\x1f\x8b already gzip bytes"
    with fs.open_output_stream(f"{base}/cuts.000000.jsonl.gz", compression=None) as f:
        f.write(payload)
    assert s3_store.get(f"s3://{base}/cuts.000000.jsonl.gz") == payload
