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


class Block:
    """One call's batch inside the actor: its rows' outputs as they finish, and what the shared
    engine did for it. The engine feeder adds its step shares, the finisher its outputs."""

    def __init__(self, number: int, size: int, busy_s: float):
        self.number = number
        self.started, self.started_unix = time.perf_counter(), time.time()
        self.outputs: list = [None] * size
        self.remaining = size
        self.done = threading.Event()
        if size == 0:
            self.done.set()
        self._lock = threading.Lock()
        self.busy_at_start = busy_s  # the actor's engine busy seconds when the block came in
        self.prep_ms = self.codec_ms = self.encode_ms = self.checks_ms = 0.0
        self.engine_ms = self.engine_steps = self.slot_rows = 0.0
        self.occupancy_sum, self.steps_seen = 0.0, 0

    def finish(self, job: RowJob, out: dict, encode_ms: float) -> None:
        with self._lock:
            self.outputs[job.spec.index] = out
            self.codec_ms += job.decode_ms
            self.encode_ms += encode_ms
            self.checks_ms += job.checks_ms
            self.remaining -= 1
            if self.remaining == 0:
                self.done.set()

    def add_step(self, seconds: float, rows: int, live: int, occupancy: float) -> None:
        """`rows` of this block among the `live` rows of one engine step of `seconds`."""
        share = rows / live
        self.engine_ms += seconds * 1000.0 * share
        self.engine_steps += share
        self.slot_rows += rows
        self.occupancy_sum += occupancy
        self.steps_seen += 1
