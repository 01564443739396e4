"""The batched dual-AR generation engine: continuous batching over fixed KV slots.

Roles follow vLLM: the scheduler (`Engine.generate`) admits queued requests into free slots,
prefills them (chunked, offset causal masks), then every step decodes one frame for all live
rows together — one batched slow step, then the batched fast stack over the codebooks — and
retires rows that stop, freeing their slot at once for the next request. Each row keeps its
own slot, random stream and stop state, so its result is what it would have produced alone.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import torch

from .cache import PrefixCache, SlotKVCache
from .decoding import Candidates, RowDecoder, first_code, pick_code, pick_main
from .loader import LoadedModel
from .model import pack_cpu_linears
from .settings import EngineConfig
from .types import STOP_BUDGET, STOP_EOS, STOP_ERROR, Request, Result

# observer(request_id, frame_index, slow_logits [n_candidates], fast_logits [C-1, codebook_size])
LogitObserver = Callable[[str, int, torch.Tensor, torch.Tensor], None]


def _shared_prefix(request: Request) -> int:
    """Columns of the request's prompt that may be shared through the prefix cache."""
    return request.prefix_len if request.prefix_key else 0


@dataclass
class StepRecord:
    kind: str  # "prefill" | "decode"
    slots: tuple[int, ...]
    input_len: int
    cache_before: tuple[int, ...]
    cache_after: tuple[int, ...]


@dataclass
class _Row:
    index: int
    request: Request
    decoder: RowDecoder
    slot: int = -1
    frames: list = field(default_factory=list)
    next_column: Optional[torch.Tensor] = None  # [1+C] fed at the next decode step
    logits: Optional[torch.Tensor] = None  # candidates' logits, ready to sample
    hidden: Optional[torch.Tensor] = None  # [fast_dim]
    admitted_at: float = 0.0
    prefill_s: float = 0.0
    first_frame_at: float = 0.0
    reused: int = 0


class Engine:
    def __init__(self, loaded: LoadedModel, config: Optional[EngineConfig] = None):
        config = config or EngineConfig()
        self.loaded, self.config = loaded, config
        self.model, self.mc = loaded.model, loaded.config
        self.device, self.dtype = loaded.device, loaded.dtype
        config.validate()
        self.cache = SlotKVCache(
            self.mc, config.max_rows, config.max_tokens, self.device, self.dtype, model_id=id(self.model)
        )
        self.prefixes = PrefixCache(config.prefix_cache_entries)
        self.candidates = Candidates(self.mc, loaded.im_end_id, self.device)
        limits = config.codebook_limits
        if limits is not None and len(limits) != self.mc.num_codebooks:
            raise ValueError(f"codebook_limits needs {self.mc.num_codebooks} values, got {len(limits)}")
        self.limits = limits
        self.steps: list[StepRecord] = []
        self.logit_head = self.model.candidate_head(self.candidates.ids)
        if config.cpu_packed_linears and self.device.type == "cpu":
            pack_cpu_linears(self.model, config.max_rows)
            pack_cpu_linears(self.logit_head, config.max_rows)
        self.model._slow_rope(config.max_tokens, self.device)  # build once, before any compiled step
        self._slow_step = self._slow_forward
        if config.compile:
            self._slow_step = torch.compile(self._slow_forward, dynamic=not config.static_shapes)

    # -- public ------------------------------------------------------------------------
    def kv_bytes(self) -> dict:
        return self.cache.bytes()

    def validate(self, request: Request) -> Optional[str]:
        """Why a request cannot run (None if it can): a per-request error, never an exception."""
        c = self.mc
        p = request.prompt
        if not isinstance(p, np.ndarray) or p.ndim != 2 or p.shape[0] != 1 + c.num_codebooks:
            shape = list(p.shape) if isinstance(p, np.ndarray) else type(p).__name__
            return f"prompt must be an int array of shape [{1 + c.num_codebooks}, T], got {shape}"
        if not np.issubdtype(p.dtype, np.integer):
            return f"prompt must hold integers, got {p.dtype}"
        if p.shape[1] == 0:
            return "prompt is empty"
        if p[0].min() < 0 or p[0].max() >= c.vocab_size:
            return f"prompt token ids must lie in [0, {c.vocab_size})"
        if p[1:].size and (p[1:].min() < 0 or p[1:].max() >= c.codebook_size):
            return f"prompt codes must lie in [0, {c.codebook_size})"
        if request.max_frames < 0:
            return f"max_frames must be >= 0, got {request.max_frames}"
        try:
            request.sampling.validate()
        except ValueError as e:
            return f"bad sampling settings: {e}"
        need = p.shape[1] + request.max_frames
        if need > self.config.max_tokens or need > c.max_seq_len:
            return (
                f"prompt ({p.shape[1]} tokens) + max_frames ({request.max_frames}) = {need} positions "
                f"exceeds the per-row budget (engine max_tokens {self.config.max_tokens}, model "
                f"max_seq_len {c.max_seq_len}); shorten the text/reference or lower max_frames "
                f"(no sliding window is applied)"
            )
        if not (0 <= request.prefix_len <= p.shape[1]):
            return f"prefix_len {request.prefix_len} is outside the prompt (0..{p.shape[1]})"
        return None

    @torch.inference_mode()
    def generate(self, requests: Iterable[Request], observe: Optional[LogitObserver] = None) -> list[Result]:
        """Run every request to completion; results in input order. `observe` sees every
        row's raw logits at every frame (tests compare them with the uncached reference)."""
        self.cache.check_compatible(id(self.model), self.device, self.dtype)
        start = time.perf_counter()
        requests = list(requests)
        results: list[Optional[Result]] = [None] * len(requests)
        queue: deque[_Row] = deque()
        for i, req in enumerate(requests):
            problem = self.validate(req)
            if problem:
                results[i] = self._error(req, problem, start)
            elif req.max_frames == 0:  # a zero budget stops at once, no work needed
                results[i] = self._finish(
                    _Row(i, req, RowDecoder(req.sampling, req.stop_on_eos), admitted_at=start), STOP_BUDGET, start
                )
            else:
                queue.append(_Row(i, req, RowDecoder(req.sampling, req.stop_on_eos)))
        live: list[_Row] = []
        try:
            while queue or live:
                admitted = []
                while queue and self.cache.free_slots():
                    row = queue.popleft()
                    row.slot = self.cache.allocate(row.request.request_id)
                    admitted.append(row)
                for group in self._prefix_leaders_first(admitted):
                    try:
                        self._prefill(group)
                        live.extend(group)
                    except Exception:  # retry alone, so a row that breaks cannot take others down
                        for row in group:
                            try:
                                self._prefill([row])
                                live.append(row)
                            except Exception as e:
                                self._release(row)
                                results[row.index] = self._error(row.request, f"prefill failed: {e!r}", start)
                if not live:
                    continue
                stopped = self._decode_step(live, observe)
                for row, reason in stopped:
                    live.remove(row)
                    self._release(row)
                    results[row.index] = self._finish(row, reason, start)
                if stopped and not self.config.static_shapes:
                    self._compact(live)
        finally:
            for row in live:  # only reached on an engine-level failure: leave the cache clean
                self._release(row)
        return results

    # -- scheduler pieces --------------------------------------------------------------
    def _release(self, row: _Row) -> None:
        if row.slot >= 0:
            self.cache.release(row.slot)
            row.slot = -1

    def _compact(self, live: list[_Row]) -> None:
        """Keep the live rows in the lowest slots: a batch over slots 0..n-1 reads the cache as
        a view, where scattered slots would gather (copy) every layer's K/V at every step.
        Moving a row copies its K/V once; its numbers do not change."""
        for target, row in enumerate(sorted(live, key=lambda r: r.slot)):
            if row.slot != target:  # every slot a row holds is live, so `target` is free here
                self.cache.move(row.slot, target)
                row.slot = target

    def _error(self, req: Request, message: str, start: float) -> Result:
        now = time.perf_counter()
        return Result(
            request_id=req.request_id,
            codes=np.zeros((self.mc.num_codebooks, 0), np.int64),
            stop_reason=STOP_ERROR,
            error=message,
            prompt_tokens=int(getattr(req.prompt, "shape", (0, 0))[-1]),
            total_ms=(now - start) * 1e3,
        )

    def _finish(self, row: _Row, reason: str, start: float) -> Result:
        now = time.perf_counter()
        c = self.mc.num_codebooks
        codes = torch.stack(row.frames, dim=1).cpu().numpy() if row.frames else np.zeros((c, 0), np.int64)
        queue_ms = (row.admitted_at - start) * 1e3
        return Result(
            request_id=row.request.request_id,
            codes=codes.astype(np.int64),
            stop_reason=reason,
            prompt_tokens=int(row.request.prompt.shape[1]),
            frames=codes.shape[1],
            prefix_reused_tokens=row.reused,
            queue_ms=queue_ms,
            prefill_ms=row.prefill_s * 1e3,
            decode_ms=max(0.0, (now - row.admitted_at - row.prefill_s) * 1e3),
            first_frame_ms=(row.first_frame_at - start) * 1e3 if row.frames else 0.0,
            total_ms=(now - start) * 1e3,
        )

    @staticmethod
    def _prefix_leaders_first(rows: list[_Row]) -> list[list[_Row]]:
        """Rows admitted together that share a prefix key: the first computes (or restores)
        the prefix, the rest are prefilled after it and restore it instead of recomputing."""
        seen, first, later = set(), [], []
        for row in rows:
            key = row.request.prefix_key if _shared_prefix(row.request) else None
            if key is not None and key in seen:
                later.append(row)
            else:
                first.append(row)
                if key is not None:
                    seen.add(key)
        return [g for g in (first, later) if g]

    def _chunks(self, row: _Row) -> list[tuple[int, int]]:
        """The row's prefill chunks. Boundaries depend only on the request (the shared prefix
        is always its own chunk run), never on what is cached, so a row computes the same
        numbers whether or not its prefix was reused; chunks already restored are skipped."""
        req = row.request
        total = req.prompt.shape[1]
        prefix = _shared_prefix(req)
        step = self.config.prefill_chunk
        bounds = list(range(0, prefix, step)) + list(range(prefix, total, step)) + [total]
        return [(s, e) for s, e in zip(bounds[:-1], bounds[1:]) if e > row.reused]

    def _prefill(self, rows: list[_Row]) -> None:
        """Prefill newly admitted rows (slots already taken). Rows go through their chunks in
        rounds, one chunk per row per round, batched: shorter chunks are padded, their padding
        lands beyond the row's real length (masked, and overwritten before it is ever read)."""
        t0 = time.perf_counter()
        prompts, plans = {}, {}
        for row in rows:
            row.admitted_at, row.reused = t0, 0
            req = row.request
            prefix = _shared_prefix(req)
            if prefix:
                entry = self.prefixes.lookup(req.prefix_key, req.prompt[:, :prefix])
                if entry is not None:
                    row.reused = PrefixCache.restore(entry, self.cache, row.slot)
                    self.cache.lengths[row.slot] = row.reused
            prompts[row.slot] = torch.from_numpy(np.ascontiguousarray(req.prompt, dtype=np.int64)).to(self.device)
            plans[row.slot] = self._chunks(row)
        spent = {row.slot: 0.0 for row in rows}
        round_index = 0
        while True:
            pending = [r for r in rows if round_index < len(plans[r.slot])]
            if not pending:
                break
            for group in self._similar_widths(pending, [plans[r.slot][round_index] for r in pending]):
                self._prefill_group(group, [plans[r.slot][round_index] for r in group], prompts, spent)
            round_index += 1
        for row in rows:
            row.prefill_s = spent[row.slot]

    @staticmethod
    def _similar_widths(rows: list[_Row], chunks: list[tuple[int, int]], slack: float = 1.25) -> list[list[_Row]]:
        """Split one round's rows into groups whose chunk lengths differ by at most `slack`x,
        so padding to the longest wastes little compute."""
        order = sorted(range(len(rows)), key=lambda i: chunks[i][1] - chunks[i][0])
        groups, first_width = [], None
        for i in order:
            width = chunks[i][1] - chunks[i][0]
            if first_width is None or width > slack * first_width:
                groups.append([])
                first_width = width
            groups[-1].append(rows[i])
        return groups

    def _prefill_group(self, group: list[_Row], chunks: list[tuple[int, int]], prompts: dict, spent: dict) -> None:
        """One batched prefill call: each row's chunk, padded to the group's longest."""
        began = time.perf_counter()
        width = max(e - s for s, e in chunks)
        tokens = torch.zeros(len(group), 1 + self.mc.num_codebooks, width, dtype=torch.int64, device=self.device)
        for i, (r, (s, e)) in enumerate(zip(group, chunks)):
            tokens[i, :, : e - s] = prompts[r.slot][:, s:e]
        starts = torch.tensor([s for s, _ in chunks], device=self.device)
        # padding positions run past the row's chunk; keep them inside the slot
        positions = (starts.unsqueeze(1) + torch.arange(width, device=self.device)).clamp_(
            max=self.config.max_tokens - 1
        )
        last = torch.tensor([e - s - 1 for s, e in chunks], device=self.device)
        attend_len = min(max(s for s, _ in chunks) + width, self.config.max_tokens)
        out = self.model.forward_slow(
            tokens,
            positions,
            cache=self.cache.slow,
            rows=self._slot_rows([r.slot for r in group]),
            attend_len=attend_len,
            last_only=True,
            select=last,
            logit_head=self.logit_head,
            want_logits=any(e == r.request.prompt.shape[1] for r, (_, e) in zip(group, chunks)),
        )
        for i, (r, (s, e)) in enumerate(zip(group, chunks)):
            before = self.cache.lengths[r.slot]
            self.cache.lengths[r.slot] = e
            if self.config.record_steps:
                self.steps.append(StepRecord("prefill", (r.slot,), e - s, (before,), (e,)))
            if r.request.prefix_key and e == r.request.prefix_len and r.reused == 0:
                self.prefixes.store(r.request.prefix_key, r.request.prompt[:, :e], self.cache, r.slot)
            if e == r.request.prompt.shape[1]:
                r.logits, r.hidden = out.logits[i, -1], out.hidden[i, -1]
        elapsed = time.perf_counter() - began
        for r in group:
            spent[r.slot] += elapsed

    def _slot_rows(self, slots: list[int]):
        """How a forward call addresses these slots (ascending): a slice when consecutive,
        which reads the cache as a view, else a tensor of slot ids (a gather)."""
        if slots == list(range(slots[0], slots[0] + len(slots))):
            return slice(slots[0], slots[-1] + 1)
        return torch.tensor(slots, device=self.device)

    def _slow_forward(self, tokens, positions, rows, attend_len):
        return self.model.forward_slow(
            tokens,
            positions,
            cache=self.cache.slow,
            rows=rows,
            attend_len=attend_len,
            last_only=True,
            logit_head=self.logit_head,
        )

    def _run_slow(self, rows: list[_Row]) -> None:
        """One batched decode forward for the rows whose last frame still has to be fed."""
        need = [r for r in rows if r.logits is None]
        if not need:
            return
        slots = [r.slot for r in need]
        before = tuple(self.cache.lengths[s] for s in slots)
        if self.config.static_shapes:
            # every slot, full capacity: one shape for every step (free slots compute junk that
            # lands beyond any live row's length and is overwritten before it is ever read)
            batch = self.config.max_rows
            by_slot = {r.slot: r for r in need}
            tokens = torch.zeros(batch, 1 + self.mc.num_codebooks, 1, dtype=torch.int64, device=self.device)
            lengths = torch.tensor(self.cache.lengths, device=self.device)
            for s, r in by_slot.items():
                tokens[s, :, 0] = r.next_column
            out = self._slow_step(tokens, lengths.unsqueeze(1), slice(0, batch), self.config.max_tokens)
            index = torch.tensor(slots, device=self.device)
            logits, hidden = out.logits[index, -1], out.hidden[index, -1]
        else:
            tokens = torch.stack([r.next_column for r in need]).unsqueeze(-1)  # [B, 1+C, 1]
            positions = torch.tensor(before, device=self.device).unsqueeze(1)
            out = self._slow_step(tokens, positions, self._slot_rows(slots), max(before) + 1)
            logits, hidden = out.logits[:, -1], out.hidden[:, -1]
        for i, r in enumerate(need):
            self.cache.lengths[r.slot] += 1
            r.logits, r.hidden = logits[i], hidden[i]
        if self.config.record_steps:
            self.steps.append(
                StepRecord("decode", tuple(slots), 1, before, tuple(self.cache.lengths[s] for s in slots))
            )

    def _decode_step(self, live: list[_Row], observe: Optional[LogitObserver] = None) -> list[tuple[_Row, str]]:
        """Sample one frame for every live row; return the rows that stopped."""
        live.sort(key=lambda r: r.slot)
        self._run_slow(live)
        logits = torch.stack([r.logits for r in live])
        hidden = torch.stack([r.hidden for r in live])
        decoders = [r.decoder for r in live]
        main_index = pick_main(logits, decoders, self.candidates)
        main = self.candidates.ids[main_index]
        fast_logits = [] if observe else None
        codes = self._fast_frame(hidden, main, decoders, fast_logits)  # [B, C]
        if observe:
            fast = torch.stack(fast_logits, dim=1) if fast_logits else logits[:, :0]
            for i, row in enumerate(live):
                observe(row.request.request_id, len(row.decoder.main_history), logits[i], fast[i])
        now = time.perf_counter()
        stopped = []
        main_list, index_list = main.tolist(), main_index.tolist()
        for i, row in enumerate(live):
            row.logits = row.hidden = None
            row.decoder.main_history.append(index_list[i])
            row.decoder.code_history.append(codes[i].tolist())
            if main_list[i] == self.candidates.im_end_id and row.request.stop_on_eos:
                stopped.append((row, STOP_EOS))
                continue
            row.frames.append(codes[i])
            if len(row.frames) == 1:
                row.first_frame_at = now
            if len(row.frames) >= row.request.max_frames:
                stopped.append((row, STOP_BUDGET))
                continue
            row.next_column = torch.cat([main[i : i + 1], codes[i]])
        return stopped

    def _fast_frame(
        self, hidden: torch.Tensor, main: torch.Tensor, decoders, keep_logits: Optional[list] = None
    ) -> torch.Tensor:
        """The batched fast stack for one frame: position 0 gets the slow hidden (its logits
        are ignored), position k gets the embedding of codebook k-1 and yields codebook k."""
        b = hidden.shape[0]
        rows = slice(0, b)
        self.model.forward_fast(hidden.unsqueeze(1), start=0, cache=self.cache.fast, rows=rows)
        code = first_code(main, self.mc)
        codes = [code]
        for k in range(1, self.mc.num_codebooks):
            logits = self.model.forward_fast(
                self.model.fast_codebook_input(code), start=k, cache=self.cache.fast, rows=rows
            )[:, -1]
            if keep_logits is not None:
                keep_logits.append(logits)
            code = pick_code(logits, k, decoders, None if self.limits is None else self.limits[k])
            codes.append(code)
        return torch.stack(codes, dim=1)
