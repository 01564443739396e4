"""The scheduler: which requests wait, which hold a slot, what each step does. It owns no
tensors: it plans (admission, prefill chunks, compaction, retirement) and asks the runner and
the KV-cache manager to act, then turns each row's accepted frames into its Result.

A step admits queued requests into free slots (lowest first) and prefills them, decodes one
frame for every live row, retires the rows that stopped, and moves the rows still running
down to the lowest slots, so the next frame reads the cache as one view. A request added at
any time joins at the next step through a free slot; its numbers do not depend on when.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from actors.alone import each_alone

from .architecture import ModelArchitecture
from .cache import SlotKVCache
from .decoding import accept_frame
from .runner import ModelRunner, PrefillWork
from .settings import EngineConfig
from .types import STOP_BUDGET, STOP_ERROR, Request, Result

# observer(request_id, frame_index, slow_logits [n_candidates], fast_logits [C-1, codebook_size])
LogitObserver = Callable[[str, int, object, object], None]


@dataclass
class Sequence:
    """One request's life inside the engine (host state only)."""

    seq_id: int
    request: Request
    submitted_at: float
    slot: int = -1
    frames: list = field(default_factory=list)  # accepted frames, each int64 [C]
    admitted_at: float = 0.0
    prefill_s: float = 0.0
    first_frame_at: float = 0.0
    reused: int = 0
    finished: bool = False  # stopped or aborted (a deferred frame's tokens for it are dropped)


def shared_prefix(request: Request) -> int:
    """Columns of the request's prompt that may be shared through the prefix cache: its
    declared prefix, but never the last column (the first decode frame feeds that one)."""
    return min(request.prefix_len, request.prompt.shape[1] - 1) if request.prefix_key else 0


def prefill_chunks(request: Request, chunk: int) -> list[tuple[int, int]]:
    """Chunk bounds over the prompt's columns 0..T-2. They depend only on the request (the
    shared prefix is always its own run of chunks), never on what is cached, so a row computes
    the same numbers whether or not its prefix was reused."""
    total = request.prompt.shape[1] - 1
    prefix = shared_prefix(request)
    bounds = list(range(0, prefix, chunk)) + list(range(prefix, total, chunk)) + [total]
    return [(s, e) for s, e in zip(bounds[:-1], bounds[1:]) if e > s]


class Scheduler:
    def __init__(self, config: EngineConfig, model_config: ModelArchitecture, cache: SlotKVCache, runner: ModelRunner):
        self.config, self.mc, self.cache, self.runner = config, model_config, cache, runner
        self.im_end_id = runner.candidates.im_end_id
        self.waiting: deque[Sequence] = deque()
        self.live: list[Sequence] = []  # ascending slots, always 0..len-1 at decode time
        self.done: list[tuple[int, Result]] = []  # finished outside a decode (errors, zero budgets)
        self._next_id = 0
        self.observe: Optional[LogitObserver] = None
        # engine.overlap_host: a step launches its frame, then reads the previous frame's tokens
        # and does its bookkeeping while the device works (None: on CUDA)
        overlap = config.overlap_host
        self.overlap = runner.device.type == "cuda" if overlap is None else bool(overlap)
        self._pending: Optional[tuple[list[Sequence], object]] = None  # the frame launched, not read

    # -- requests ----------------------------------------------------------------------
    def add(self, request: Request, problem: Optional[str]) -> int:
        now = time.perf_counter()
        seq = Sequence(self._next_id, request, now)
        self._next_id += 1
        if problem:
            self.done.append((seq.seq_id, self._error(seq, problem)))
        elif request.max_frames == 0:  # a zero budget stops at once, no work needed
            seq.admitted_at = now
            self.done.append((seq.seq_id, self._finish(seq, STOP_BUDGET)))
        else:
            self.waiting.append(seq)
        return seq.seq_id

    def abort(self, request_id: str) -> bool:
        for seq in list(self.waiting):
            if seq.request.request_id == request_id:
                self.waiting.remove(seq)
                return True
        for seq in self.live:
            if seq.request.request_id == request_id:
                seq.finished = True
                self.live.remove(seq)
                self.runner.release(seq.slot)
                self._compact()
                return True
        return False

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.live or self.done or self._pending)

    # -- one step ----------------------------------------------------------------------
    def step(self) -> list[tuple[int, Result]]:
        finished, self.done = self.done, []
        admitted = []
        while self.waiting and self.cache.free_slots():
            seq = self.waiting.popleft()
            seq.slot = self.cache.allocate(seq.request.request_id)
            self.runner.admit(seq.slot, seq.request.prompt, seq.request.sampling, seq.request.stop_on_eos)
            admitted.append(seq)

        def prefill_failed(seq: Sequence, error: Exception) -> None:
            self.runner.release(seq.slot)
            finished.append((seq.seq_id, self._error(seq, f"prefill failed: {error!r}")))

        for group in _prefix_leaders_first(admitted):
            # a group that fails is prefilled one by one, so a row that breaks cannot take others down
            each_alone(group, self._prefill, prefill_failed)
        try:
            self._compact()
            launched = None
            if self.live:
                overlap = self.overlap and self.observe is None
                out = self.runner.decode(len(self.live), keep_logits=self.observe is not None, deferred=overlap)
                launched = (list(self.live), out)
            if self._pending is not None:  # the previous frame, read while this one runs
                finished.extend(self._accept(*self._pending))
                self._pending = None
            if launched is not None and launched[1].tokens is None:
                self._pending = launched
            elif launched is not None:
                finished.extend(self._accept(*launched))
        except BaseException:
            self.done = finished + self.done  # results already made are handed out next time
            raise
        return finished

    def _prefill(self, group: list[Sequence]) -> None:
        work = [
            PrefillWork(
                seq.slot, seq.request.prompt, prefill_chunks(seq.request, self.config.prefill_chunk),
                seq.request.prefix_key, shared_prefix(seq.request),
            )
            for seq in group
        ]  # fmt: skip
        began = time.perf_counter()
        self.runner.prefill(work)
        for seq, w in zip(group, work):
            seq.admitted_at, seq.prefill_s, seq.reused = began, w.seconds, w.reused
            self.live.append(seq)
        self.live.sort(key=lambda s: s.slot)

    def _accept(self, rows: list[Sequence], out) -> list[tuple[int, Result]]:
        """A frame's tokens for the rows it was launched for: each row keeps its frame or stops
        (retired, its slot freed). A row that stopped since the launch (a deferred frame, read one
        step late) gets nothing from it: the frame was decoded past its end and is dropped."""
        all_tokens = out.wait()
        now = time.perf_counter()
        finished = []
        for i, seq in enumerate(rows):
            if seq.finished:
                continue
            tokens = all_tokens[i]
            if self.observe is not None:
                fast = out.fast_logits[i] if out.fast_logits is not None else out.slow_logits[i, :0]
                self.observe(seq.request.request_id, len(seq.frames), out.slow_logits[i], fast)
            req = seq.request
            keep, reason = accept_frame(
                int(tokens[0]), self.im_end_id, req.stop_on_eos, len(seq.frames), req.max_frames
            )
            if keep:
                seq.frames.append(tokens[1:])
                if len(seq.frames) == 1:
                    seq.first_frame_at = now
            if reason is not None:
                seq.finished = True
                self.live.remove(seq)
                self.runner.release(seq.slot)
                finished.append((seq.seq_id, self._finish(seq, reason)))
        self._compact()
        return finished

    def _compact(self) -> None:
        """Keep the live rows in the lowest slots: a batch over slots 0..n-1 reads the cache as
        a view, where scattered slots would gather (copy) every layer's K/V at every step.
        Each hole below n takes the highest live row above it, so a step moves at most as many
        rows as stopped (a row's numbers do not depend on its slot or its batch position)."""
        n = len(self.live)
        holes = [slot for slot in range(n) if self.cache.owner[slot] is None]
        above = sorted((seq for seq in self.live if seq.slot >= n), key=lambda seq: -seq.slot)
        for hole, seq in zip(holes, above):
            self.runner.move(seq.slot, hole)
            seq.slot = hole
        self.live.sort(key=lambda seq: seq.slot)

    # -- results -----------------------------------------------------------------------
    def _error(self, seq: Sequence, message: str) -> Result:
        now = time.perf_counter()
        prompt = seq.request.prompt
        return Result(
            request_id=seq.request.request_id,
            codes=np.zeros((self.mc.num_codebooks, 0), np.int64),
            stop_reason=STOP_ERROR,
            error=message,
            prompt_tokens=int(prompt.shape[-1]) if isinstance(prompt, np.ndarray) and prompt.ndim == 2 else 0,
            total_ms=(now - seq.submitted_at) * 1e3,
        )

    def _finish(self, seq: Sequence, reason: str) -> Result:
        now = time.perf_counter()
        c = self.mc.num_codebooks
        codes = np.stack(seq.frames, axis=1).astype(np.int64) if seq.frames else np.zeros((c, 0), np.int64)
        return Result(
            request_id=seq.request.request_id,
            codes=codes,
            stop_reason=reason,
            prompt_tokens=int(seq.request.prompt.shape[1]),
            frames=codes.shape[1],
            prefix_reused_tokens=seq.reused,
            queue_ms=(seq.admitted_at - seq.submitted_at) * 1e3,
            prefill_ms=seq.prefill_s * 1e3,
            decode_ms=max(0.0, (now - seq.admitted_at - seq.prefill_s) * 1e3),
            first_frame_ms=(seq.first_frame_at - seq.submitted_at) * 1e3 if seq.frames else 0.0,
            total_ms=(now - seq.submitted_at) * 1e3,
        )


def _prefix_leaders_first(rows: list[Sequence]) -> list[list[Sequence]]:
    """Rows admitted together that share a prefix key: the first computes (or restores) the
    prefix, the rest are prefilled after it and restore it instead of recomputing."""
    seen, first, later = set(), [], []
    for seq in rows:
        key = seq.request.prefix_key if shared_prefix(seq.request) else None
        if key is not None and key in seen:
            later.append(seq)
        else:
            first.append(seq)
            if key is not None:
                seen.add(key)
    return [g for g in (first, later) if g]
