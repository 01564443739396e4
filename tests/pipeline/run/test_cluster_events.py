"""The driver's count of restarted actors and of blocks run again after their actor died
(pipeline/run/cluster_events.py), as the actors' crash guard tells it (actors/synth/guard.py,
actors/synth/run_events.py): a real Ray actor holding a CrashGuard, whose process exits hard in
the middle of a block; Ray restarts it and retries the block."""

from __future__ import annotations

import secrets

import pyarrow as pa

from actors import schema as S
from actors.synth.guard import CrashGuard
from actors.synth.job_settings import ClusterSettings
from actors.synth.run_events import RunEventsClient
from actors.synth.settings import ActorSettings, RunContext
from pipeline.run.cluster_events import ClusterEvents


def guarded_worker():
    """The synthesis actor's guard and nothing else, a block's rows coming back as they went in
    (a class made here: Ray pickles it whole, the workers cannot import a test module)."""

    class GuardedWorker:
        def __init__(self, settings: ActorSettings):
            self.guard = CrashGuard(settings, "worker", lambda batch, why: batch)

        def run(self, batch: pa.Table, number: int) -> pa.Table:
            return self.guard.run(batch, number, lambda table, _: table)

    return GuardedWorker


def _block(*ids: str) -> pa.Table:
    return pa.table({S.ID: list(ids)})


def test_a_restarted_actor_and_its_retried_block_are_counted(ray_cluster, tmp_path):
    import ray

    run_id = f"events-{secrets.token_hex(3)}"
    events = ClusterEvents(run_id)
    settings = ActorSettings(
        cluster=ClusterSettings(crash_on_batch=2, crash_marker=str(tmp_path / "crashed")),
        run=RunContext(run_id=run_id, attempts_dir=str(tmp_path / "attempts")),
    )
    worker = ray.remote(num_cpus=0, max_restarts=1, max_task_retries=1)(guarded_worker()).remote(settings)
    assert ray.get(worker.run.remote(_block("a", "b"), 1)).column(S.ID).to_pylist() == ["a", "b"]
    for _ in range(3):  # the counter actor answers each poll on the next one
        events.poll()
        ray.get(events._counters.counts.remote())
    assert events.figures()["actors_restarted"] == 0 and events.text() == ""
    # the second block: the process exits hard inside it; Ray restarts the actor and runs it again
    assert ray.get(worker.run.remote(_block("c", "d"), 2)).column(S.ID).to_pylist() == ["c", "d"]
    assert (tmp_path / "crashed").exists()
    assert ray.get(worker.run.remote(_block("e"), 3)).column(S.ID).to_pylist() == ["e"]  # not a retry
    events.close()
    figures = events.figures()
    assert (figures["actors_restarted"], figures["blocks_retried"]) == (1, 1), figures
    assert events.text() == "1 actor restart(s), 1 block(s) retried"


def test_actors_outside_a_run_send_nothing(ray_cluster):
    client = RunEventsClient("no-such-run")  # no events actor of that name: nothing sent, nothing raised
    client.started("some-actor-id")
    client.retried()
    assert client.name is None
    RunEventsClient("").retried()  # no run id (a bench, encode-refs)
