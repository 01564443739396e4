"""What an actor tells the run's driver about the cluster's doings: that it started (a second
start of the same Ray actor is a restart: its process died of a crash, out of memory, its node
lost) and that a block it runs had been running on an actor that died (Ray runs the blocks a
dead actor held again).

The driver starts one small actor per run under `events_actor_name(run_id)`
(pipeline/run/cluster_events.py), which counts what it is told; an actor finds it by that name.
Best effort: outside Ray, or with no such actor (a bench, encode-refs), nothing is sent, and a
failed send never costs a row. Public Ray only (the runtime context's actor id)."""

from __future__ import annotations

import logging

log = logging.getLogger(f"chorus.{__name__}")  # one namespace: configuring "chorus" reaches every module


def events_actor_name(run_id: str) -> str:
    """The name of run `run_id`'s events actor, in the driver's Ray namespace."""
    return f"chorus-run-events-{run_id}"


def actor_id() -> str | None:
    """This process's Ray actor id (None outside an actor): the same across its restarts."""
    import sys

    if "ray" not in sys.modules:
        return None
    import ray

    if not ray.is_initialized():
        return None
    return ray.get_runtime_context().get_actor_id()


class RunEventsClient:
    """The actor's side: `started(actor_id)` once per actor process, `retried()` once per block it
    runs that had been running on an actor that died."""

    def __init__(self, run_id: str):
        self.name = events_actor_name(run_id) if run_id else None
        self._handle = None

    def started(self, actor: str | None) -> None:
        if actor:
            self._send("started", actor)

    def retried(self) -> None:
        self._send("retried")

    def _send(self, method: str, *args) -> None:
        if self.name is None:
            return
        try:
            import ray

            if not ray.is_initialized():
                return
            if self._handle is None:
                self._handle = ray.get_actor(self.name)
            getattr(self._handle, method).remote(*args)
        except Exception as e:  # no events actor (not a run), or it is gone: the figure is lost, not the row
            log.debug("run events: %s not sent (%r)", method, e)
            self.name = None
