"""The small types the actor's parts hand each other: a `Failure` (the first one a row meets is
its cause), a `RowJob` (one row in flight: its spec, its segment chain, what the finisher made
of it) and a `Block` (one call's rows and what the shared engine did for them)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from actors.synth.rows import RowSpec


@dataclass(frozen=True)
class Failure:
    """Why a row has no audio. `retryable`: the cause may be gone on a rerun (I/O, a timeout,
    an internal error), so a rerun redoes the row; content errors stay until the content changes."""

    message: str
    retryable: bool = False


class RowJob:
    """One row on its way through the actor. Each part writes its own fields: the caller the
    voices' codes and the chain, the engine feeder the chain's results and `result`, the
    quality gate `quality` and `tries`, the finisher `heard` (actors/quality/hearing.py: the
    FLAC, the audio's measurements). `fail` keeps the first failure only: later ones are consequences."""

    def __init__(self, spec: RowSpec, block: Optional[Block] = None):
        self.spec = spec
        self.block = block
        self.failure: Optional[Failure] = None
        # each voice's codes (given as codes, or from the actor's cache or the encode): the
        # prompt's references
        self.voice_codes: list[Optional[np.ndarray]] = [voice.ref.codes for voice in spec.voices]
        self.chain: Any = None  # the RowChain, once planned
        self.result: Any = None  # the engine's result for the whole row (or its failing segment)
        self.quality: Any = None  # the quality gate's RowQuality (actors/quality/row_quality.py)
        self.tries: Any = None  # the current segment's attempts (SegmentAttempts), while it runs
        self.heard: Any = None  # a hearing.Heard, from the row's decode until it is written
        self.rounds: list = []  # the gate's AudioRounds: each rejected decoded version, until written
        self.codec_ms = 0.0  # reference encode share + decode share
        self.decode_ms = 0.0  # the row's share of its codec decode call
        self.checks_ms = 0.0  # its share of the CPU time the checks on decoded audio took, every round

    @property
    def ok(self) -> bool:
        return self.failure is None

    def fail(self, message: str, retryable: bool = False) -> None:
        if self.failure is None:
            self.failure = Failure(message, retryable)


@dataclass
class BlockShare:
    """What the shared engine and the codec did for (part of) a block: the `batch` struct of the
    rows written with it (output.py batch_columns). A block written in several parts gives each
    part the share since the part before, so sums over parts are the block's."""

    started: float  # perf_counter when the block came in
    started_unix: float
    busy_at_start: float  # the actor's engine busy seconds then
    prep_ms: float = 0.0
    codec_ms: float = 0.0
    encode_ms: float = 0.0
    checks_ms: float = 0.0
    engine_ms: float = 0.0
    engine_steps: float = 0.0
    slot_rows: float = 0.0
    occupancy_sum: float = 0.0
    steps_seen: int = 0


class Block:
    """One call's batch inside the actor: its rows' outputs as they finish, and what the shared
    engine did for it. The engine feeder adds its step shares, the finisher its outputs; the
    caller takes the finished rows (all at the end, or in parts as they finish: `finished`)."""

    def __init__(self, number: int, size: int, busy_s: float):
        self.number = number
        self.started, self.started_unix = time.perf_counter(), time.time()
        self.outputs: list = [None] * size
        self.finished_at: list[Optional[float]] = [None] * size  # perf_counter when each row finished
        self.taken: list[bool] = [False] * size  # rows handed to a part already
        self.remaining = size
        self.done = threading.Event()
        if size == 0:
            self.done.set()
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self.busy_at_start = busy_s  # the actor's engine busy seconds when the block came in
        self.tally = BlockShare(self.started, self.started_unix, busy_s)
        self.parts = 0  # shares taken so far

    @property
    def prep_ms(self) -> float:
        return self.tally.prep_ms

    @prep_ms.setter
    def prep_ms(self, value: float) -> None:
        self.tally.prep_ms = value

    def finish(self, job: RowJob, out: dict, encode_ms: float) -> None:
        with self._lock:
            index = job.spec.index
            self.outputs[index], self.finished_at[index] = out, time.perf_counter()
            self.tally.codec_ms += job.decode_ms
            self.tally.encode_ms += encode_ms
            self.tally.checks_ms += job.checks_ms
            self.remaining -= 1
            if self.remaining == 0:
                self.done.set()
            self._changed.notify_all()

    def add_step(self, seconds: float, rows: int, live: int, occupancy: float) -> None:
        """`rows` of this block among the `live` rows of one engine step of `seconds`."""
        share = rows / live
        with self._lock:
            tally = self.tally
            tally.engine_ms += seconds * 1000.0 * share
            tally.engine_steps += share
            tally.slot_rows += rows
            tally.occupancy_sum += occupancy
            tally.steps_seen += 1

    def finished(self, wait_s: Optional[float]) -> list[tuple[int, float]]:
        """(index, finished_at) of the rows finished and not yet taken, after waiting up to
        `wait_s` seconds (None: no limit; 0: none) for one more row to finish."""
        with self._lock:
            before = self.remaining
            if self.remaining and (wait_s is None or wait_s > 0):
                self._changed.wait_for(lambda: self.remaining != before, timeout=wait_s)
            return [(i, at) for i, at in enumerate(self.finished_at) if at is not None and not self.taken[i]]

    def take(self, indices: list[int]) -> tuple[list[dict], BlockShare]:
        """These finished rows' outputs, marked taken, and the block's share since the last take."""
        with self._lock:
            for i in indices:
                self.taken[i] = True
            share, self.tally = self.tally, BlockShare(self.started, self.started_unix, self.busy_at_start)
            self.parts += 1
            return [self.outputs[i] for i in indices], share
