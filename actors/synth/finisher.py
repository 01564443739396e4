"""The finisher, one thread per actor: rows the engine feeder is done with are decoded to audio
in codec batches of similar length, encoded to FLAC and turned into output rows; a block's call
returns when its last row is here. On CUDA its codec work runs on a stream of its own, so it
overlaps the engine's kernels instead of queueing behind them (CPU: threads are enough).

Each decoded batch is measured by the quality gate (gate.py: loudness, silence, clipping,
speech rate; ASR, speaker similarity and MOS when set) before its output rows are built; a row
whose audio fails a check quality.reject lists goes back to the engine feeder for another
round instead (gate.py says from where), and a row the gate kept without frames has nothing to
decode and is written as `rejected`.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any, Optional

import numpy as np

from actors.alone import each_alone
from actors.settings import ActorSettings
from actors.synth.clock import BusyClock
from actors.synth.gate import QualityGate
from actors.synth.jobs import Job
from actors.synth.output import RowWriter

log = logging.getLogger(__name__)


class Finisher:
    def __init__(
        self,
        settings: ActorSettings,
        codec_runner: Any,
        clock: BusyClock,
        writer: RowWriter,
        engine_holding: Callable[[], int],
        gate: QualityGate,
        send_back: Callable[[Job], None],
        stream: Any = None,
    ):
        self.settings, self.codec_runner, self.clock, self.writer = settings, codec_runner, clock, writer
        self.gate = gate
        self._send_back = send_back  # the engine feeder's submit: a row the gate regenerates
        self._engine_holding = engine_holding  # rows still in the engine feeder: more may come soon
        self._stream = stream
        self.intake: queue.Queue = queue.Queue()

    def start(self) -> None:
        threading.Thread(target=self._serve, name="chorus-finisher", daemon=True).start()

    def _serve(self) -> None:
        if self._stream is not None:
            import torch

            torch.cuda.set_stream(self._stream)  # this thread's current stream from now on
        while True:
            jobs = self._next_batch()
            again: list[Job] = []
            try:
                # similar lengths decode together: a batch pads to its longest row
                with self.clock.busy():
                    self.decode(sorted((j for j in jobs if j.ok and j.result.frames), key=lambda j: j.result.frames))
                again = self._checked(jobs)
            except Exception as e:  # a bug or a device failure: the rows still come back, as errors
                log.error("decode failed in %s:\n%s", self.writer.actor, traceback.format_exc())
                for job in jobs:
                    if job.wave is None:
                        job.fail(f"internal error in actor {self.writer.actor}: {e!r}", retryable=True)
            for job in jobs:
                if any(job is back for back in again):
                    self._send_back(job)  # waits while the engine's queue is full
                else:
                    self._finish(job)

    def _checked(self, jobs: list[Job]) -> list[Job]:
        """The gate's checks on the decoded rows (those it sends back are returned); their CPU
        time is shared among the rows by length (the checks' cost grows with the audio)."""
        heard = [(job, len(job.wave)) for job in jobs if job.wave is not None]  # a row sent back loses its wave
        began = time.thread_time()
        again = self.gate.audio(jobs)
        spent_ms = (time.thread_time() - began) * 1000.0
        samples = sum(n for _, n in heard) or 1
        for job, n in heard:
            job.checks_ms += spent_ms * n / samples
        return again

    def _finish(self, job: Job) -> None:
        began = time.perf_counter()
        out = self.writer.row(job, self._flac(job))
        job.wave, job.rounds = None, []  # the FLAC holds it now; an actor keeps no decoded audio longer
        job.block.finish(job, out, (time.perf_counter() - began) * 1000.0)

    def _flac(self, job: Job) -> Optional[bytes]:
        if not job.ok or job.wave is None:
            return None
        from actors import audio

        try:
            return audio.encode_audio(job.wave, self.writer.sample_rate, "flac")
        except Exception as e:
            job.fail(f"FLAC encoding: {e!r}")
            return None

    def _next_batch(self) -> list[Job]:
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

    def decode(self, jobs: list[Job]) -> None:
        """The rows' codes to waves, codec_batch_rows at a time; one row whose codes break a
        batch fails alone (retryable), after its batch is decoded row by row."""
        rows = self.settings.engine.codec_batch_rows
        for start in range(0, len(jobs), rows):
            group = jobs[start : start + rows]
            began = time.perf_counter()
            waves = each_alone(
                group,
                lambda batch: self.codec_runner.decode_batch([j.result.codes for j in batch], max_batch_rows=rows),
                lambda job, e: job.fail(f"codec decode: {e!r}", retryable=True),
            )
            elapsed_ms = (time.perf_counter() - began) * 1000.0
            frames = sum(j.result.frames for j in group) or 1
            for job, wave in zip(group, waves):
                if wave is None:
                    continue
                job.decode_ms = elapsed_ms * job.result.frames / frames
                job.codec_ms += job.decode_ms
                if not np.all(np.isfinite(wave)):
                    job.fail("codec decode produced non-finite samples")
                    continue
                job.wave = wave
