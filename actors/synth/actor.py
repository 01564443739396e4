"""SynthActor, the Ray Data callable class, as wiring: it loads the model once and connects the
parts, each with one job (docs/architecture.md §2):

    caller (one thread per block; blocks.py): rows -> RowSpecs (rows.py) -> references
        (references.py, cached per actor) -> segment chains (chain.py) -> the engine feeder
    engine feeder (one thread; feeder.py): every block's rows through the engine's slots
    quality gate (actors/quality/gate.py): each segment attempt checked, a rejected one
        generated again at once; each decoded row measured (actors/quality/)
    finisher (one thread; finisher.py): hearing (decode, the checks' measurements, FLAC:
        actors/quality/hearing.py, in the codec's child process on CPU), output rows (output.py)
    crash guard (guard.py): attempts ledger, quarantine, watchdog around each call
    on a CPU engine the callers and the finisher run below the engine thread (priority.py)

Each call turns an Arrow batch of input rows into an Arrow batch of output rows, exactly one
per input row, whatever happened to it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import itertools
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np
import pyarrow as pa

from actors import schema as S
from actors.memory import HeapTrimmer, bound_native_caches
from actors.quality.asr import load_asr
from actors.quality.gate import QualityGate
from actors.ray_metrics import ActorMetrics
from actors.synth import loading
from actors.synth.blocks import Preparer, longest_first, run_block
from actors.synth.chain import ChainPlanner
from actors.synth.clock import BusyClock
from actors.synth.feeder import EngineFeeder
from actors.synth.finisher import Finisher
from actors.synth.guard import CrashGuard
from actors.synth.jobs import Block, BlockShare
from actors.synth.listening import load_mos, load_speaker_check
from actors.synth.output import RowWriter, batch_columns, output_table_per_row
from actors.synth.priority import yield_to_engine
from actors.synth.recorder import Recorder
from actors.synth.references import CodecShape, ReferenceStore
from actors.synth.rows import RefSpec, RowError, RowSpec
from actors.synth.settings import ActorSettings

log = logging.getLogger(f"chorus.{__name__}")  # one namespace: configuring "chorus" reaches every module


class SynthActor:
    """`settings`: everything the actor is told (pipeline/run/actor_settings.py::actor_arguments builds it
    from the run config); `recorder`: what tests and debugging watch (nothing by default)."""

    def __init__(self, settings: ActorSettings, recorder: Optional[Recorder] = None):
        constructed = time.perf_counter()  # the actor's own start-up: imports, model + codec load
        if not isinstance(settings, ActorSettings):
            raise TypeError(
                f"SynthActor takes an ActorSettings (actors/synth/settings.py), got {type(settings).__name__}"
            )
        settings.validate()
        bound_native_caches()  # before the model's first oneDNN call (actors/memory.py)
        self.settings, self.recorder = settings, recorder or Recorder()
        loaded = loading.load(settings)
        self.lm, self.codec, self.engine = loaded.lm, loaded.codec, loaded.engine
        base_sampling = loaded.sampling
        self.clock = BusyClock()  # engine steps and codec calls, overlap counted once
        self.writer = RowWriter(
            settings,
            settings.model.name or self.lm.name,
            str(self.lm.device),
            self.codec.sample_rate,
            self.codec.frame_length,
        )
        shape = CodecShape(
            self.lm.config.num_codebooks, self.lm.config.codebook_size, self.codec.sample_rate, self.codec.frame_length
        )
        self.references = ReferenceStore(settings, loaded.codec_runner, shape)
        # positions one request may take (prompt + frames): the engine's slot, within the model's context
        positions = min(self.engine.config.max_tokens, self.lm.config.max_seq_len)
        self.planner = ChainPlanner(settings, loaded.builder, positions, frozenset(self.lm.tokenizer.special))
        self.preparer = Preparer(settings, base_sampling, self.references, self.planner)
        self._codec_runner = loaded.codec_runner
        self.memory_plan = loaded.memory_plan  # on a GPU (actors/synth/memory_plan.py); None on CPU
        self.gate = self._quality_gate(settings)
        self.finisher = Finisher(
            settings,
            loaded.codec_runner,
            self.clock,
            self.writer,
            lambda: self.feeder.holding,
            self.gate,
            lambda job: self.feeder.submit(job),  # a row the gate sends back for another round
            loaded.codec_stream,
            loaded.listen_pool,
        )
        self.feeder = EngineFeeder(
            self.engine, settings, self.clock, self.recorder, self.writer.actor, self.finisher.intake.put, self.gate
        )
        self.guard = CrashGuard(settings, self.writer.actor, self._quarantined)
        self.metrics = ActorMetrics(self.writer.actor)  # Ray's dashboard / Prometheus; a no-op outside Ray
        self.heap = HeapTrimmer()  # freed memory back to the system now and then (actors/memory.py)
        self._numbers = itertools.count(1)
        self.init_ms = (time.perf_counter() - constructed) * 1000.0
        self.feeder.start()
        self.finisher.start(functools.partial(yield_to_engine, str(self.lm.device)))
        self._log_ready(loaded)

    def _log_ready(self, loaded: loading.Loaded) -> None:
        log.info(
            "SynthActor %s ready on %s in %.1fs: %s (%s), codec %s, kv %s",
            self.writer.actor,
            self.lm.device,
            self.init_ms / 1000.0,
            loaded.checkpoint,
            self.lm.config.family,
            loaded.codec_path,
            self.engine.kv_bytes(),
        )

    def _quality_gate(self, settings: ActorSettings) -> QualityGate:
        """The gate with the optional checks quality.asr / .speaker / .mos name (each None,
        nothing of it imported, when unset); on a GPU what they took there goes into the plan."""
        quality, device = settings.quality, str(self.lm.device)
        before = self._device_allocated()
        asr = load_asr(quality, device)
        speaker = load_speaker_check(quality, device, self._reference_wave)
        mos = load_mos(quality, settings.run.threads, device)
        if self.memory_plan is not None:  # what the check models took on the device
            self.memory_plan = self.memory_plan.measured(checks=self._device_allocated() - before)
            log.info("memory measured on %s: %s", device, self.memory_plan.describe()["measured"])
        return QualityGate(settings, self.codec.frame_length, self.codec.sample_rate, asr, speaker, mos)

    def _device_allocated(self) -> int:
        """Bytes torch holds allocated on the actor's GPU (0 on a CPU)."""
        if self.lm.device.type != "cuda":
            return 0
        import torch

        return torch.cuda.memory_allocated(self.lm.device)

    def _reference_wave(self, ref: RefSpec) -> tuple[np.ndarray, int]:
        """A reference's audio for the speaker check: its clip read as the run reads it, or,
        for a row that gave only ref_codes, those codes decoded (the voice the model was shown)."""
        if ref.source is not None:
            return self.references.load_in_time(ref.source), self.codec.sample_rate
        return self._codec_runner.decode_batch([ref.codes], max_batch_rows=1)[0], self.codec.sample_rate

    def __call__(self, batch: pa.Table) -> pa.Table:
        """One block, start to end; safe to call from several threads at once (SynthStage
        does), the blocks then sharing the engine's slots."""
        return self._call(batch, None)

    def _call(self, batch: pa.Table, write: Optional[Callable[[pa.Table], None]]) -> pa.Table:
        """One block under the crash guard; with `write`, its rows go to `write` in parts as they
        finish (blocks.run_block) and the table returned holds only what was not written."""
        table = self.guard.run(batch, next(self._numbers), lambda rows, number: run_block(self, rows, number, write))
        if write is None:  # written parts are counted as they are written (SynthStage)
            self.metrics.record_block(table)
        self.heap.maybe_trim()
        return table

    def batch_columns(self, block: Block, share: BlockShare, rows: int) -> dict:
        """The `batch` struct of `rows` rows of `block` written together with `share`."""
        figures = {
            "init_ms": self.init_ms,
            "kv_bytes": int(self.engine.kv_bytes()["total"]),
            "busy_s": self.feeder.busy_s,
            "model_busy_s": self.clock.seconds(),
        }
        name = f"{self.writer.actor}:{block.number}" + (f".{block.parts}" if block.parts > 1 else "")
        return batch_columns(share, name, rows, self.engine.config.max_rows, figures)

    def _quarantined(self, row_batch: pa.Table, message: str) -> pa.Table:
        values = row_batch.to_pylist()[0]
        return output_table_per_row([self.writer.error(RowSpec(0, values.get(S.ID), values), message, False)])

    def engine_only(self, batch: pa.Table, block_rows: Optional[int] = None) -> dict:
        """The batch's rows through the engine alone, in this thread, nothing else running in
        the actor: references, segments and first prompts are made first (untimed), then every
        segment is generated as in a run (the feeder's own loop: a freed slot refilled at once,
        a long row's next segment first, the rows in the order a run hands them over: blocks of
        `block_rows` in input order, each longest budget first) and no audio is decoded. What a
        run's frames/s is compared to (pipeline.bench's vs_engine_only). Call it on an actor
        with no block in flight."""
        jobs = self.preparer.jobs(batch, Block(0, batch.num_rows, self.feeder.busy_s))
        self.preparer.prepare(jobs)
        block_rows = block_rows or max(1, len(jobs))
        ready = deque(
            job
            for start in range(0, len(jobs), block_rows)
            for job in sorted(jobs[start : start + block_rows], key=longest_first)
            if job.ok
        )
        began = time.perf_counter()
        steps = self.feeder.drain(list(ready))
        return {
            "rows": sum(1 for j in jobs if j.ok),
            "frames": sum(r.frames for j in jobs if j.chain is not None for r in j.chain.results),
            "seconds": time.perf_counter() - began,
            "steps": steps,
        }

    def encode_references(self, batch: pa.Table) -> list[Encoded]:
        """Per row of an input batch (canonical column names): its reference's codes (a plain
        row), each of its voices' codes (a dialogue row), or why it has none. The same checks,
        loading and encoding as a synthesized row's voices, each distinct clip encoded once
        (python -m pipeline.encode_refs)."""
        rows: list = []  # per row: its voices, or the RowError's message
        for values in batch.to_pylist():
            try:
                rows.append((bool(values.get(S.VOICES)), self.references.voices(values)))
            except RowError as e:
                rows.append((False, str(e)))
        wanted = [voice.ref for _, voices in rows if not isinstance(voices, str) for voice in voices]
        resolved = self.references.resolve(wanted)
        out = []
        for dialogue, voices in rows:
            if isinstance(voices, str):
                out.append(Encoded(error=voices))
                continue
            outcomes = [resolved[voice.ref.key] for voice in voices]
            failed = [(i, o.failure.message) for i, o in enumerate(outcomes) if o.failure is not None]
            if failed:
                index, message = failed[0]
                out.append(Encoded(error=f"voices[{index}]: {message}" if dialogue else message))
            elif dialogue:
                out.append(Encoded(voices=[o.codes for o in outcomes]))
            else:
                out.append(Encoded(codes=outcomes[0].codes if outcomes else None))
        return out


@dataclass(frozen=True)
class Encoded:
    """A row's references encoded (SynthActor.encode_references): a plain row's `codes`, a
    dialogue row's `voices` (each voice's), or the `error` that left it without."""

    codes: Optional[np.ndarray] = None
    voices: Optional[list] = None
    error: Optional[str] = None


class SynthStage(SynthActor):
    """The face Ray Data drives (pipeline/run/synthesis.py): an async callable class, so one actor takes
    up to engine.max_concurrent_blocks blocks at once (the actor's concurrency limit is set to
    that); each runs SynthActor's call in a thread of its own, and they share the engine feeder.

    `sink` (the run's part writer, pipeline/output/parts.py PartSink; its `write(table)` makes
    one crash-safe part): the block's rows are written in parts as they finish, so rows never
    wait behind their block's slowest row (a long row) to be written; the call returns one row,
    its block's `rows` and `parts`. Ray Data cannot do this itself: a callable's yields, sync or
    async, reach the next stage only when the call returns (Ray 2.60). Without a sink (tests,
    encode_refs) the call returns the block's output rows."""

    def __init__(self, settings: ActorSettings, recorder: Optional[Recorder] = None, sink: Any = None):
        super().__init__(settings, recorder)
        self.sink = sink
        # null when the actor is built directly (tests, encode_refs); the driver resolves it
        blocks = self.settings.engine.max_concurrent_blocks or 2
        self._callers = concurrent.futures.ThreadPoolExecutor(
            blocks, thread_name_prefix="chorus-block", initializer=yield_to_engine, initargs=(str(self.lm.device),)
        )

    async def __call__(self, batch: pa.Table) -> pa.Table:
        loop = asyncio.get_running_loop()
        if self.sink is None:
            return await loop.run_in_executor(self._callers, SynthActor.__call__, self, batch)
        return await loop.run_in_executor(self._callers, self._written, batch)

    def _written(self, batch: pa.Table) -> pa.Table:
        parts = []

        def write(table: pa.Table) -> None:
            self.sink.write(table)
            self.metrics.record_block(table)
            parts.append(table.num_rows)

        rest = self._call(batch, write)
        if rest.num_rows:  # rows the guard answered itself (a quarantined row)
            write(rest)
        return pa.table({"rows": [batch.num_rows], "parts": [len(parts)]})
