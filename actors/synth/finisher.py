"""The finisher, two threads per actor: rows the engine feeder is done with are heard in codec
batches of similar length (actors/quality/hearing.py: decoded, measured, encoded to FLAC) and
turned into output rows; a block's call returns when its last row is here.

The first thread decodes: in the codec's child process on CPU (which also measures and encodes
there, so none of that work runs in the engine loop's process), or here, on the codec's CUDA
stream on a GPU, so its kernels overlap the engine's instead of queueing behind them. Rows
decoded here are measured and FLAC-encoded on the listen pool (listen_pool.py: processes beside
the actor) when there is one, else at once in this thread. The second thread takes each batch
when it is heard and runs the quality gate (actors/quality/gate.py: loudness, silence,
clipping, speech rate from the measurements; ASR, speaker similarity and MOS when set, on the
codec's stream too) before its output rows are built; so the decode of the next batch never
waits for a batch's listening or its checks. A row whose audio fails a check quality.reject
lists goes back to the engine feeder for another round instead (the gate says from where), and
a row the gate kept without frames has nothing to decode and is written as `rejected`.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any, Optional

from actors import schema as S
from actors.quality import hearing
from actors.quality.gate import QualityGate
from actors.synth.clock import BusyClock
from actors.synth.jobs import RowJob
from actors.synth.output import RowWriter
from actors.synth.settings import ActorSettings

log = logging.getLogger(f"chorus.{__name__}")  # one namespace: configuring "chorus" reaches every module


# heard batches waiting for the gate: enough that a slow check never stalls the decode at once,
# few enough that their waves stay a small part of the actor's memory
HEARD_BATCHES = 4


class Listening:
    """A decoded batch's rows being listened to on the pool: `collect` waits for them."""

    def __init__(self, jobs: list[RowJob], futures: list, take: Callable[[list[RowJob], list], None]):
        self._jobs, self._futures, self._take = jobs, futures, take

    def collect(self) -> None:
        self._take(self._jobs, [f if isinstance(f, hearing.Heard) else f.result() for f in self._futures])


class Finisher:
    def __init__(
        self,
        settings: ActorSettings,
        codec_runner: Any,
        clock: BusyClock,
        writer: RowWriter,
        engine_holding: Callable[[], int],
        gate: QualityGate,
        send_back: Callable[[RowJob], None],
        stream: Any = None,
        pool: Any = None,
    ):
        self.settings, self.codec_runner, self.clock, self.writer = settings, codec_runner, clock, writer
        self.gate = gate
        self._send_back = send_back  # the engine feeder's submit: a row the gate regenerates
        self._engine_holding = engine_holding  # rows still in the engine feeder: more may come soon
        self._stream = stream
        self.pool = pool  # a ListenPool (listen_pool.py), or None: rows decoded here are listened to here
        self.intake: queue.Queue = queue.Queue()
        self._heard: queue.Queue = queue.Queue(maxsize=HEARD_BATCHES)

    def start(self, prepare_thread: Callable[[], None]) -> None:
        """The finisher's threads, which call `prepare_thread` first (actors/synth/priority.py)."""
        for target, name in ((self._decode, "chorus-finisher"), (self._judge, "chorus-finisher-gate")):
            threading.Thread(target=target, args=(prepare_thread,), name=name, daemon=True).start()

    def _on_stream(self, prepare_thread: Callable[[], None]) -> None:
        prepare_thread()
        if self._stream is not None:
            import torch

            torch.cuda.set_stream(self._stream)  # this thread's current stream from now on

    def _decode(self, prepare_thread: Callable[[], None]) -> None:
        self._on_stream(prepare_thread)
        while True:
            jobs = self._next_batch()
            listening = None
            try:
                # similar lengths decode together: a batch pads to its longest row
                with self.clock.busy():
                    listening = self.hear(
                        sorted((j for j in jobs if j.ok and j.result.frames), key=lambda j: j.result.frames)
                    )
            except Exception as e:  # a bug or a device failure: the rows still come back, as errors
                self._failed(jobs, e)
            self._heard.put((jobs, listening))

    def _judge(self, prepare_thread: Callable[[], None]) -> None:
        self._on_stream(prepare_thread)
        while True:
            jobs, listening = self._heard.get()
            again: list[RowJob] = []
            try:
                if listening is not None:
                    listening.collect()
                again = self._checked(jobs)
            except Exception as e:
                self._failed(jobs, e)
            for job in jobs:
                if any(job is back for back in again):
                    self._send_back(job)  # waits while the engine's queue is full
                else:
                    self._finish(job)

    def _failed(self, jobs: list[RowJob], e: Exception) -> None:
        log.error("hearing failed in %s:\n%s", self.writer.actor, traceback.format_exc())
        for job in jobs:
            if job.heard is None:
                job.fail(f"internal error in actor {self.writer.actor}: {e!r}", retryable=True)

    def _checked(self, jobs: list[RowJob]) -> list[RowJob]:
        """The gate on the heard rows (those it sends back are returned); the CPU time of what
        it runs here (the checks on models: ASR, speaker, MOS) is shared among the rows by
        length (their cost grows with the audio)."""
        heard = [(job, job.heard.samples) for job in jobs if job.heard is not None]  # a row sent back loses it
        began = time.thread_time()
        again = self.gate.audio(jobs)
        spent_ms = (time.thread_time() - began) * 1000.0
        samples = sum(n for _, n in heard) or 1
        for job, n in heard:
            job.checks_ms += spent_ms * n / samples
        return again

    def _finish(self, job: RowJob) -> None:
        began = time.perf_counter()
        heard = job.heard
        out = self.writer.row(job, heard.flac if job.ok and heard is not None else None)
        flac_ms = heard.flac_ms if heard is not None else 0.0
        job.heard, job.rounds = None, []  # the row holds the FLAC now; an actor keeps no audio longer
        job.block.finish(job, out, flac_ms + (time.perf_counter() - began) * 1000.0)

    def _next_batch(self) -> list[RowJob]:
        """Up to codec_batch_rows finished rows. Rows leave the engine one or two at a time, and
        on a GPU a codec call costs nearly the same for one row as for eight (launch and dispatch
        bound at these sizes; on CPU rows of like length still share a call's fixed cost), so
        while the engine still has rows live the finisher waits up to codec_wait_ms for a fuller
        batch; with nothing live no more are coming, and it decodes what it has at once (the
        last rows of a run are not held back)."""
        engine = self.settings.engine
        jobs = [self.intake.get()]
        deadline = time.perf_counter() + engine.codec_wait_ms / 1000.0
        while len(jobs) < engine.codec_batch_rows:
            try:
                jobs.append(self.intake.get_nowait())
                continue
            except queue.Empty:
                pass
            left = deadline - time.perf_counter()
            if left <= 0 or self._engine_holding() == 0:
                break
            try:
                jobs.append(self.intake.get(timeout=min(left, 0.01)))
            except queue.Empty:
                pass
        return jobs

    def _task(self, job: RowJob) -> hearing.HearTask:
        """What hearing a row needs: its codes, words, segments' and turns' frames, channels."""
        plan = job.chain.plan
        segment_frames = [r.frames for r in job.chain.results]
        per_speaker = job.spec.dialogue and self.settings.output.channels == S.CHANNELS_PER_SPEAKER
        return hearing.HearTask(
            job.result.codes,
            plan.words,
            tuple(kept.frames for kept in job.quality.segments) if job.quality is not None else (),
            keep_wave=self.gate.needs_wave,
            turns=tuple((voice, frames) for (voice, _), frames in zip(plan.turns, plan.turn_frames(segment_frames))),
            channels=len(job.spec.voices) if per_speaker else 1,
        )

    def hear(self, jobs: list[RowJob]) -> Optional[Listening]:
        """The rows decoded, measured and FLAC-encoded, codec_batch_rows per decode call: all of
        it by the codec's child process when there is one; else decoded here and listened to on
        the pool (returned: `collect` it) or here. A row whose codes break a batch fails alone
        (retryable), after its batch is decoded row by row."""
        settings = self.settings
        tasks = [self._task(job) for job in jobs]
        runner, engine = self.codec_runner, settings.engine
        batching = {"max_batch_rows": engine.codec_batch_rows, "frame_bucket": engine.codec_frame_bucket}
        if hasattr(runner, "hear"):  # the codec's child process (actors/synth/codec_process.py)
            self._take(jobs, runner.hear(tasks, settings.quality, **batching))
            return None
        rate, frame = runner.sample_rate, runner.frame_length
        waves = hearing.decoded(runner.decode_batch, tasks, frame, **batching)
        if self.pool is None:
            listened = [
                w if isinstance(w, hearing.Heard) else hearing.listen(t, w, settings.quality, rate, frame)
                for t, (w, _) in zip(tasks, waves)
            ]
            self._take(jobs, listened, [ms for _, ms in waves])
            return None
        futures = [w if isinstance(w, hearing.Heard) else self.pool.submit(t, w) for t, (w, _) in zip(tasks, waves)]
        decode_ms = [ms for _, ms in waves]
        return Listening(jobs, futures, lambda jobs, heard: self._take(jobs, heard, decode_ms))

    @staticmethod
    def _take(jobs: list[RowJob], heard: list, decode_ms: Optional[list[float]] = None) -> None:
        """Each row's Heard (its decode's share `decode_ms`, when it was decoded here) onto it."""
        for index, (job, row) in enumerate(zip(jobs, heard)):
            if decode_ms is not None and row.failure is None:
                row.decode_ms = decode_ms[index]
            job.decode_ms = row.decode_ms
            job.codec_ms += row.decode_ms
            job.checks_ms += row.checks_ms
            if row.failure is not None:
                job.fail(row.failure, retryable=row.retryable)
            else:
                job.heard = row
