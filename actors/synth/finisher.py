"""The finisher, one thread per actor: rows the engine feeder is done with are heard in codec
batches of similar length (actors/quality/hearing.py: decoded, measured, encoded to FLAC; in the
codec's child process on CPU, so none of that work runs in the engine loop's process) and turned
into output rows; a block's call returns when its last row is here. On CUDA its codec work runs
on a stream of its own, so it overlaps the engine's kernels instead of queueing behind them.

Each heard batch goes through the quality gate (actors/quality/gate.py: loudness, silence,
clipping, speech rate from the measurements; ASR, speaker similarity and MOS when set) before
its output rows are built; a row whose audio fails a check quality.reject lists goes back to the
engine feeder for another round instead (the gate says from where), and a row the gate kept without frames has nothing to
decode and is written as `rejected`.
"""

from __future__ import annotations

import functools
import logging
import queue
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

from actors import schema as S
from actors.quality import hearing
from actors.quality.gate import QualityGate
from actors.synth.clock import BusyClock
from actors.synth.jobs import RowJob
from actors.synth.output import RowWriter
from actors.synth.settings import ActorSettings

log = logging.getLogger(f"chorus.{__name__}")  # one namespace: configuring "chorus" reaches every module


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
    ):
        self.settings, self.codec_runner, self.clock, self.writer = settings, codec_runner, clock, writer
        self.gate = gate
        self._send_back = send_back  # the engine feeder's submit: a row the gate regenerates
        self._engine_holding = engine_holding  # rows still in the engine feeder: more may come soon
        self._stream = stream
        self.intake: queue.Queue = queue.Queue()

    def start(self, prepare_thread: Callable[[], None]) -> None:
        """The finisher's thread, which calls `prepare_thread` first (actors/synth/priority.py)."""
        threading.Thread(target=self._serve, args=(prepare_thread,), name="chorus-finisher", daemon=True).start()

    def _serve(self, prepare_thread: Callable[[], None]) -> None:
        prepare_thread()
        if self._stream is not None:
            import torch

            torch.cuda.set_stream(self._stream)  # this thread's current stream from now on
        while True:
            jobs = self._next_batch()
            again: list[RowJob] = []
            try:
                # similar lengths decode together: a batch pads to its longest row
                with self.clock.busy():
                    self.hear(sorted((j for j in jobs if j.ok and j.result.frames), key=lambda j: j.result.frames))
                again = self._checked(jobs)
            except Exception as e:  # a bug or a device failure: the rows still come back, as errors
                log.error("decode failed in %s:\n%s", self.writer.actor, traceback.format_exc())
                for job in jobs:
                    if job.heard is None:
                        job.fail(f"internal error in actor {self.writer.actor}: {e!r}", retryable=True)
            for job in jobs:
                if any(job is back for back in again):
                    self._send_back(job)  # waits while the engine's queue is full
                else:
                    self._finish(job)

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

    def hear(self, jobs: list[RowJob]) -> None:
        """The rows decoded, measured and FLAC-encoded, codec_batch_rows per decode call: by the
        codec's child process when there is one, else here. A row whose codes break a batch
        fails alone (retryable), after its batch is decoded row by row."""
        settings = self.settings
        tasks = [self._task(job) for job in jobs]
        runner, engine = self.codec_runner, settings.engine
        # the codec's child process hears in the child (actors/synth/codec_process.py); a codec in
        # this process, here
        hear = runner.hear if hasattr(runner, "hear") else functools.partial(hearing.hear_with, runner)
        heard = hear(
            tasks, settings.quality, max_batch_rows=engine.codec_batch_rows, frame_bucket=engine.codec_frame_bucket
        )
        for job, row in zip(jobs, heard):
            job.decode_ms = row.decode_ms
            job.codec_ms += row.decode_ms
            job.checks_ms += row.checks_ms
            if row.failure is not None:
                job.fail(row.failure, retryable=row.retryable)
            else:
                job.heard = row
