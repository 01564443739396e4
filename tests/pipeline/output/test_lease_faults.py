"""The output's lease on a real S3 server behind a real fault-injecting proxy
(tests/fault_proxy.py), no Ray: a lease write answered 500 after it took effect is this
driver's own, the conditional-write probe tells a store without conditional writes from a
faulty one (and says which it decided), a heartbeat that cannot renew loses the lease before
it could go stale, and heartbeats answered with errors after they took effect keep it."""

from __future__ import annotations

import json
import logging
import time

import pytest
from fault_proxy import AMBIGUOUS, NOT_IMPLEMENTED, SLOWDOWN, UNCONDITIONAL, Rule

from actors.storage import StoreError, give_up_by
from pipeline.errors import LeaseLost, OutputInUse
from pipeline.names import LEASE_FILE
from pipeline.output.layout import OutputLayout
from pipeline.output.lease import Lease

RECORD = r"/out/_chorus\.lock$"  # the lease record itself (not the probe's scratch objects)
PROBE = r"/out/\.tmp-probe-"


def record(s3_store, location: str) -> dict:
    """The lease record as the store holds it (read past the proxy)."""
    return json.loads(s3_store.get(f"{location}/{LEASE_FILE}"))


@pytest.mark.slow  # ~8 s: waits out the retry policy
def test_a_first_lease_write_answered_500_after_it_took_effect_is_this_drivers_own(fault_proxy, s3_store):
    fault_proxy.set_rates(slowdown=0.10, ambiguous=0.10, drop=0.05)
    for round_ in range(2):
        location = f"{s3_store.bucket()}/out"
        rule = fault_proxy.add(Rule(AMBIGUOUS, RECORD, method="PUT", times=1))
        lease = Lease(OutputLayout(location), f"run-{round_}", heartbeat_s=0.2)
        lease.acquire()
        try:
            assert rule.hits == 1
            assert lease.kind == "exact-object" and lease.took_over is None
            assert record(s3_store, location)["run"] == f"run-{round_}"
            with pytest.raises(OutputInUse, match=f"run run-{round_}"):
                Lease(OutputLayout(location), "another-run").acquire()
        finally:
            lease.release()
        assert s3_store.keys(location) == []  # released, and no probe object left


@pytest.mark.parametrize(
    "rules, kind, said",
    [
        # faults on the probe's creates: retried, and the store's real answers decide
        ([Rule(AMBIGUOUS, PROBE, method="PUT", times=1), Rule(SLOWDOWN, PROBE, times=4)], "exact-object", None),
        ([Rule(NOT_IMPLEMENTED, PROBE, method="PUT", times=None)], "read-back", "does not implement conditional"),
        ([Rule(UNCONDITIONAL, PROBE, method="PUT", times=None)], "read-back", "accepted a second create"),
    ],
    ids=["faults", "501", "ignored"],
)
def test_the_probe_tells_a_store_without_conditional_writes_from_a_faulty_one(
    fault_proxy, s3_store, caplog, rules, kind, said
):
    for rule in rules:
        fault_proxy.add(rule)
    location = f"{s3_store.bucket()}/out"
    lease = Lease(OutputLayout(location), "probed")
    with caplog.at_level(logging.WARNING, logger="chorus"):
        lease.acquire()
    lease.release()
    assert lease.kind == kind and all(rule.hits for rule in rules)
    if said is None:
        assert lease.weaker_because is None and "no conditional create" not in caplog.text
    else:  # the downgrade is a logged decision, with its reason
        assert said in lease.weaker_because and said in caplog.text and "no conditional create" in caplog.text


def test_a_probe_that_keeps_failing_stops_the_start_and_never_downgrades(fault_proxy, s3_store):
    fault_proxy.add(Rule(SLOWDOWN, PROBE, times=None))
    lease = Lease(OutputLayout(f"{s3_store.bucket()}/out"), "probed")
    with give_up_by(time.monotonic() + 2.0), pytest.raises(StoreError, match="creating s3://.*probe"):
        lease.acquire()
    assert lease.kind is None


def test_a_heartbeat_that_cannot_renew_loses_the_lease_before_it_could_go_stale(fault_proxy, s3_store):
    location = f"{s3_store.bucket()}/out"
    lease = Lease(OutputLayout(location), "refused", heartbeat_s=0.25, stale_s=3.0)
    lease.acquire()
    time.sleep(0.6)  # a few beats renew it
    fault_proxy.add(Rule(SLOWDOWN, RECORD, times=None))  # every lease request refused from now on
    written = record(s3_store, location)["heartbeat"]
    deadline = time.monotonic() + 10
    while lease.lost is None and time.monotonic() < deadline:
        time.sleep(0.05)
    lost_at = time.time()
    assert lease.lost is not None and "could not be renewed" in lease.lost
    assert lost_at - written < lease.stale_s  # before any other driver may judge it dead
    with pytest.raises(LeaseLost, match="launches no more work.*Rerun the same command"):
        lease.check()
    began = time.monotonic()
    lease.release()  # the store still refuses: given up quickly, the record left for the next run
    assert time.monotonic() - began < lease.heartbeat_s + 5
    assert record(s3_store, location)["run"] == "refused"


def test_heartbeats_answered_500_after_they_took_effect_keep_the_lease(fault_proxy, s3_store):
    location = f"{s3_store.bucket()}/out"
    lease = Lease(OutputLayout(location), "kept", heartbeat_s=0.2, stale_s=6.0)
    lease.acquire()
    # three answers in a row: the first beat's write took effect, its retries were refused by
    # that very write (told 500 as well), and the next read-back finds the record its own
    rule = fault_proxy.add(Rule(AMBIGUOUS, RECORD, method="PUT", times=3))
    time.sleep(2.5)
    try:
        assert rule.hits == 3 and lease.lost is None
        held = record(s3_store, location)
        assert held["run"] == "kept" and time.time() - held["heartbeat"] < 1.0
    finally:
        lease.release()
    assert s3_store.keys(location) == []
