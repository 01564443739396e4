"""The engine feeder: the actor's only user of the engine, one thread. It takes rows from every
block's caller (an inbox), keeps each slot busy (a freed slot is refilled at once, a long row's
next segment ahead of rows not started), steps the engine and shares each step's time and slots
among the blocks whose rows were live. A row leaves it done or failed, to the finisher.

The bench's engine-only pass runs the same loop (`drain`) in the caller's thread, so there is
one engine loop to measure and to trust.

Every segment's result passes the quality gate (actors/quality/gate.py) before it is recorded:
an attempt the gate rejects goes back to the front of `ready` at once (the chain then asks for
the same segment, same prompt, the next attempt's seed), and a segment whose kept attempt has no
frames ends its row there, as `rejected`, not as an error.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import traceback
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from actors.engine.prompt import PromptError
from actors.quality.gate import QualityGate
from actors.synth.clock import BusyClock
from actors.synth.jobs import RowJob
from actors.synth.recorder import Recorder
from actors.synth.settings import ActorSettings

log = logging.getLogger(f"chorus.{__name__}")  # one namespace: configuring "chorus" reaches every module


@dataclass
class _Loop:
    """One engine loop's rows: `ready` (their next segment can be added), `running` (request id
    -> row), `suspects` (rows that were in the engine when it raised: they run one at a time,
    so a row that breaks the engine fails only itself), and where a row goes when it leaves."""

    leave: Callable[[RowJob], None]
    ready: deque = field(default_factory=deque)
    running: dict = field(default_factory=dict)
    suspects: set = field(default_factory=set)

    def holding(self) -> int:
        return len(self.ready) + len(self.running)


class EngineFeeder:
    def __init__(
        self,
        engine: Any,
        settings: ActorSettings,
        clock: BusyClock,
        recorder: Recorder,
        name: str,
        finished: Callable,
        gate: QualityGate,
    ):
        self.engine, self.settings, self.clock, self.recorder, self.name = engine, settings, clock, recorder, name
        self.gate = gate
        self._finished = finished  # the finisher's intake
        self.inbox: queue.Queue = queue.Queue()
        # back-pressure: rows past their caller's preparation and not yet out of the engine
        self._in_flight = threading.BoundedSemaphore(engine.config.max_rows + settings.engine.feed_queue_rows)
        self.steps = 0  # engine.step() calls over the actor's life (segments record when they finished)
        self.busy_s = 0.0  # seconds spent in engine.step()
        self.holding = 0  # rows the loop holds (ready or running); the finisher reads it

    def start(self) -> None:
        threading.Thread(target=self._serve, name="chorus-engine", daemon=True).start()

    def submit(self, job: RowJob) -> None:
        """Hand a planned row to the loop; waits while max_rows + feed_queue_rows are in flight."""
        self._in_flight.acquire()  # released when the row leaves the engine
        self.inbox.put(job)

    def _serve(self) -> None:
        loop = _Loop(leave=self._leave)
        while True:
            self.holding = loop.holding()
            if not loop.holding():
                loop.ready.append(self.inbox.get())
            while True:
                try:
                    loop.ready.append(self.inbox.get_nowait())
                except queue.Empty:
                    break
            self.holding = loop.holding()
            self._turn(loop)

    def _leave(self, job: RowJob) -> None:
        self._in_flight.release()
        self._finished(job)

    def drain(self, jobs: list[RowJob]) -> int:
        """Run `jobs` to the end in this thread, exactly as the loop would with nothing else
        coming in, and return the engine steps it took; call with no block in flight."""
        before = self.steps
        loop = _Loop(leave=lambda job: None, ready=deque(jobs))
        while loop.holding():
            self._turn(loop)
        return self.steps - before

    def _turn(self, loop: _Loop) -> None:
        """Fill the free slots, step the engine once, route what finished."""
        try:
            self._admit(loop)
            if not loop.running:
                return
            if not self.engine.has_unfinished():  # the engine stopped without answering: never silently ok
                for job in loop.running.values():
                    job.fail(f"generation: the engine finished without a result for segment {job.chain.segment + 1}")
                    self._out(loop, job)
                loop.running.clear()
                return
            live = list(loop.running.values())
            began = time.perf_counter()
            try:
                with self.clock.busy():
                    finished = self.engine.step()
            except Exception as e:
                self._engine_failed(loop, e)
                return
            self._account(live, time.perf_counter() - began)
            for result in finished:
                self._segment_finished(loop, result)
        except Exception as e:  # a bug in this loop: fail what it holds, keep serving
            log.error("engine loop failed in %s:\n%s", self.name, traceback.format_exc())
            for request_id in list(loop.running):
                self.engine.abort(request_id)
            for job in [*loop.running.values(), *loop.ready]:
                job.fail(f"internal error in actor {self.name}: {e!r}", retryable=True)
                self._out(loop, job)
            loop.running.clear()
            loop.ready.clear()

    def _admit(self, loop: _Loop) -> None:
        limit = 1 if loop.suspects else self.engine.config.max_rows
        while loop.ready and len(loop.running) < limit:
            job = loop.ready.popleft()
            try:
                # unique in the actor whatever the ids are: block number, row in the block
                request = job.chain.request(f"{job.block.number}.{job.spec.index}")
            except PromptError as e:  # its prompt could not be built: a row error
                job.fail(str(e))
                self._out(loop, job)
                continue
            self.engine.add(request)
            loop.running[request.request_id] = job

    def _segment_finished(self, loop: _Loop, result: Any) -> None:
        job = loop.running.pop(result.request_id, None)
        if job is None:  # not ours (another caller's request): cannot happen in an actor
            return
        result = self.gate.segment(job, result)
        if result is None:  # rejected, attempts left: the same segment again, first in line
            loop.ready.appendleft(job)
            return
        failure = job.chain.record(result, self.steps)
        if failure and not (result.ok and result.frames == 0):  # no frames after every attempt: rejected
            job.fail(failure)
        if job.ok and job.chain.more and result.frames:
            loop.ready.appendleft(job)
            return
        # a failed row reports the failing segment's result, as a one-segment row does
        job.result = job.chain.joined() if job.ok else result
        self._out(loop, job)

    def _out(self, loop: _Loop, job: RowJob) -> None:
        loop.suspects.discard(id(job))
        loop.leave(job)

    def _engine_failed(self, loop: _Loop, error: Exception) -> None:
        """The engine itself raised: take the running segments back (each starts again) and run
        them one at a time; one that fails alone is that row's error."""
        alone = bool(loop.suspects)
        for request_id, job in list(loop.running.items()):
            self.engine.abort(request_id)
            if alone:
                log.error("row %r failed the engine alone:\n%s", job.spec.id, traceback.format_exc())
                job.fail(f"internal error in the engine: {error!r}", retryable=True)
                self._out(loop, job)
            else:
                loop.suspects.add(id(job))
                loop.ready.appendleft(job)
        if not alone:
            log.warning("engine failed with %d rows in flight (%r); running each alone", len(loop.running), error)
        loop.running.clear()

    def _account(self, live: list[RowJob], seconds: float) -> None:
        """One engine step's time and slots, shared among the blocks whose rows were live."""
        self.steps += 1
        self.busy_s += seconds
        per_block = Counter(job.block for job in live)
        occupancy = len(live) / self.engine.config.max_rows
        for block, rows in per_block.items():
            block.add_step(seconds, rows, len(live), occupancy)
        self.recorder.on_step(self.steps, frozenset(b.number for b in per_block))
