"""The model runner: turns the scheduler's decisions into batch tensors and runs them.

Prefill writes a row's prompt K/V (all columns but the last) in batched chunk rounds. A decode
frame feeds every live row's pending column (the prompt's last column, or the frame it sampled
last) through the slow stack, samples the main token, runs the fast stack over the codebooks
with their draws, and records the frame in the per-slot sampling state — all on the device,
then reads the frame's tokens back once. Everything a frame needs lives in per-slot device
buffers, so the frame can be one compiled graph (and one CUDA graph per batch-size bucket).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch
from torch import Tensor

from .attention import attend_length
from .buckets import bucket_size, bucket_sizes, cpu_buckets
from .cache import PrefixCache, SlotKVCache
from .compile_cache import load_artifacts, use_triton_cache
from .compiling import compiled_frame, compiles, use_cache_dir
from .decoding import BatchFacts, BatchSampling, Candidates, SlotSampling, pick_code, pick_main_token
from .graphs import StepGraphs, kv_bucket, kv_buckets
from .kernels import kernel_path
from .kernels.stack import gate_up_weight
from .loader import LoadedModel
from .packing import load_native_ops, pack_cpu_linears, prepare_linears
from .prefill import PackedPrefill
from .read_back import StepBuffers
from .settings import EngineConfig


@dataclass
class StepRecord:
    """One forward call, for tests (contract: each prompt column is fed exactly once)."""

    kind: str  # "prefill" | "decode"
    slots: tuple[int, ...]
    input_len: int
    cache_before: tuple[int, ...]
    cache_after: tuple[int, ...]


@dataclass
class PrefillWork:
    """One admitted row's prefill, as the scheduler planned it. chunks cover columns
    0..T-2 of the prompt (the last column is fed by the first decode frame); their bounds
    depend only on the request, never on what is cached. `reused` is set by the runner."""

    slot: int
    prompt: np.ndarray
    chunks: list[tuple[int, int]]
    prefix_key: Optional[str]
    prefix_len: int
    reused: int = 0
    seconds: float = 0.0


@dataclass
class FrameOutput:
    tokens: Optional[np.ndarray]  # [n, 1+C] int64: main token id, then the C codes, per live row
    slow_logits: Optional[Tensor] = None  # [n, n_candidates], when asked for
    fast_logits: Optional[Tensor] = None  # [n, C-1, codebook_size], when asked for
    pending: Optional[Callable[[], np.ndarray]] = None  # a deferred frame: waits for its tokens

    def wait(self) -> np.ndarray:
        if self.tokens is None:
            self.tokens = self.pending()
        return self.tokens


class ModelRunner:
    def __init__(self, loaded: LoadedModel, config: EngineConfig, cache: SlotKVCache):
        self.loaded, self.config, self.cache = loaded, config, cache
        self.model, self.mc, self.device = loaded.model, loaded.config, loaded.device
        c = self.mc
        self.candidates = Candidates(c, loaded.im_end_id, self.device)
        limits = config.codebook_limits
        if limits is not None and len(limits) != c.num_codebooks:
            raise ValueError(f"codebook_limits needs {c.num_codebooks} values, got {len(limits)}")
        self.limits = None if limits is None else tuple(int(x) for x in limits)
        self.sampling = SlotSampling(
            config.max_rows, c.num_codebooks, config.sampling_history, len(self.candidates.ids), c.codebook_size,
            self.device,
        )  # fmt: skip
        # per slot: the column its next decode frame feeds (prompt's last, then each sampled frame)
        self.next_tokens = torch.zeros(config.max_rows, 1 + c.num_codebooks, dtype=torch.int64, device=self.device)
        self.prefixes = PrefixCache(config.prefix_cache_entries)
        self.steps: list[StepRecord] = []
        self.logit_head = self.model.candidate_head(self.candidates.ids)
        packed = prepare_linears(self.model, self.logit_head, config.fp8_weights, config.cpu_packed_linears)
        self.compiled = compiles(config, self.device, packed_linears=packed > 0)
        # the fused kernels (kernels/): each row attends to its own keys, so a captured step
        # needs no key bucket (one graph per batch bucket)
        self.kernel_path = kernel_path(config.kernels, self.device.type)
        self.fused = self.kernel_path != "eager"  # fused or compiled: the kernels package's stack
        if cache.kv_dtype != cache.dtype and not self.fused:
            raise ValueError("an FP8 K/V cache needs engine.kernels=fused or compiled (the eager path cannot read it)")
        # CUDA graphs of the whole step, captured by the engine (graphs.py); a compiled frame
        # on CUDA runs inside them
        self.graphs = StepGraphs(self.device) if config.cuda_graphs and self.device.type == "cuda" else None
        self.static = config.static_shapes or self.compiled or self.graphs is not None
        self.buckets = config.decode_buckets
        if self.buckets is None and self.compiled and self.device.type == "cpu":
            self.buckets = cpu_buckets(config.max_rows)
        self.kv_buckets = [config.max_tokens] if self.fused else kv_buckets(config.max_tokens, config.kv_buckets)
        self.cache_loaded = False  # a saved mega-cache was loaded (compile_cache.py)
        compiling = self.compiled or self.kernel_path != "eager" or self.graphs is not None
        self.compile_cache = use_cache_dir(config.compile_cache_dir) if compiling else None
        if self.compile_cache is not None:  # Triton's cache and the saved mega-cache beside inductor's
            use_triton_cache(self.compile_cache)
            self.cache_loaded = load_artifacts(self.compile_cache, self.device)
        if self.compiled and packed:
            # the frame calls the packed linears through an op it can trace, C++ where it can be
            # built (packing.py); an eager engine made later on this model switches them back
            load_native_ops(self.compile_cache)
            pack_cpu_linears(self.model, traceable=True)
            pack_cpu_linears(self.logit_head, traceable=True)
        # fused: prefill packs every admitted row's chunk into one call, graphed per token bucket
        self.packed = None
        if self.fused:
            self.packed = PackedPrefill(
                self.model, cache, config.max_tokens, self.device, self.graphs, self.kernel_path
            )
        self._build_step_tables(config)
        self._frame = compiled_frame(self._decode_frame, self.device) if self.compiled else self._decode_frame
        # the step's inputs and outputs, living as long as the engine (read_back.py)
        buffers = StepBuffers(config.max_rows, 1 + c.num_codebooks, self.device)
        self.positions, self._positions_host, self.frame_out = buffers.positions, buffers.host, buffers.out
        self.read_back, self.reach = buffers.read_back, buffers.reach
        # a context manager each eager device step runs in (audit.audit_steps watches steps)
        self.watch_step = None

    def _build_step_tables(self, config: EngineConfig) -> None:
        """The step's tables, built once before any captured frame (a step may not keep what it
        makes): RoPE, codebook offsets, row slots, the fused path's joined gate/up weights."""
        self.model._slow_rope(config.max_tokens, self.device)
        self.model._fast_rope(self.device)
        self.model.codebook_offsets(self.device)
        self.model.row_slots(slice(0, max(config.max_rows, self.mc.num_codebooks + 1)), 0, self.device)
        if self.fused:
            for layer in [*self.model.layers, *self.model.fast_layers]:
                if "_gate_up_fp8" not in layer.feed_forward.__dict__:  # FP8 layers keep their own
                    gate_up_weight(layer.feed_forward)

    # -- slots -------------------------------------------------------------------------
    def admit(self, slot: int, prompt: np.ndarray, sampling, stop_on_eos: bool) -> None:
        """A new row took `slot`: its sampling state, and its prompt's last column as the
        column its first decode frame feeds."""
        self.sampling.admit(slot, sampling, stop_on_eos)
        self.next_tokens[slot] = torch.from_numpy(np.ascontiguousarray(prompt[:, -1], dtype=np.int64))

    def release(self, slot: int) -> None:
        self.sampling.release(slot)
        self.cache.release(slot)

    def move(self, src: int, dst: int) -> None:
        """Move a live row to a free slot: K/V, sampling state, pending column."""
        self.cache.move(src, dst)
        self.sampling.move(src, dst)
        self.next_tokens[dst] = self.next_tokens[src]

    # -- prefill -----------------------------------------------------------------------
    def prefill(self, work: list[PrefillWork]) -> None:
        """Write the K/V of newly admitted rows (slots already taken). Rows go through their
        chunks in rounds, one chunk per row per round, batched: shorter chunks are padded, their
        padding lands beyond the row's real length (masked, and overwritten before it is read)."""
        prompts = {}
        for w in work:
            w.reused, w.seconds = 0, 0.0
            if w.prefix_key and w.prefix_len:
                entry = self.prefixes.lookup(w.prefix_key, w.prompt[:, : w.prefix_len])
                if entry is not None:
                    w.reused = PrefixCache.restore(entry, self.cache, w.slot)
            prompts[w.slot] = torch.from_numpy(np.ascontiguousarray(w.prompt, dtype=np.int64)).to(self.device)
        todo = {w.slot: [ch for ch in w.chunks if ch[1] > w.reused] for w in work}
        round_index = 0
        while True:
            pending = [w for w in work if round_index < len(todo[w.slot])]
            if not pending:
                break
            chunks = [todo[w.slot][round_index] for w in pending]
            if self.packed is not None:  # fused: every width in one packed call (prefill.py)
                began = time.perf_counter()
                self.packed.run([w.slot for w in pending], [w.prompt for w in pending], chunks)
                self._record_prefill(pending, chunks, began)
            else:
                for group, group_chunks in _similar_widths(pending, chunks):
                    self._prefill_group(group, group_chunks, prompts)
            round_index += 1

    def _prefill_group(self, group: list[PrefillWork], chunks: list[tuple[int, int]], prompts: dict) -> None:
        """One batched prefill call: each row's chunk, padded to the group's longest."""
        began = time.perf_counter()
        width = max(e - s for s, e in chunks)
        tokens = torch.zeros(len(group), 1 + self.mc.num_codebooks, width, dtype=torch.int64, device=self.device)
        for i, (w, (s, e)) in enumerate(zip(group, chunks)):
            tokens[i, :, : e - s] = prompts[w.slot][:, s:e]
        starts = torch.tensor([s for s, _ in chunks], device=self.device)
        # padding positions run past the row's chunk; keep them inside the slot
        positions = (starts.unsqueeze(1) + torch.arange(width, device=self.device)).clamp_(
            max=self.config.max_tokens - 1
        )
        attend_len = attend_length(max(s for s, _ in chunks) + width, self.config.max_tokens, self.device.type)
        self.model.forward_slow(
            tokens, positions, cache=self.cache.slow, rows=self._slot_rows([w.slot for w in group]),
            attend_len=attend_len, last_only=True, want_logits=False,
        )  # fmt: skip
        self._record_prefill(group, chunks, began)

    def _record_prefill(self, group: list[PrefillWork], chunks: list[tuple[int, int]], began: float) -> None:
        """The rows' chunks are written: their lengths, step records, prefixes to keep, seconds."""
        for w, (s, e) in zip(group, chunks):
            before = self.cache.lengths[w.slot]
            self.cache.set_written(w.slot, e)
            if self.config.record_steps:
                self.steps.append(StepRecord("prefill", (w.slot,), e - s, (before,), (e,)))
            if w.prefix_key and e == w.prefix_len and w.reused == 0:
                self.prefixes.store(w.prefix_key, w.prompt[:, :e], self.cache, w.slot)
        elapsed = time.perf_counter() - began
        for w in group:
            w.seconds += elapsed

    def _slot_rows(self, slots: list[int]):
        """How a forward call addresses these slots (ascending): a slice when consecutive,
        which reads the cache as a view, else a tensor of slot ids (a gather)."""
        if slots == list(range(slots[0], slots[0] + len(slots))):
            return slice(slots[0], slots[-1] + 1)
        return torch.tensor(slots, device=self.device)

    # -- decode ------------------------------------------------------------------------
    def decode(self, n_live: int, keep_logits: bool = False, deferred: bool = False) -> FrameOutput:
        """One frame for the live rows, which hold slots 0..n_live-1 (the scheduler keeps
        them there). Static mode pads the batch to its bucket with free slots (their junk
        lands in positions nobody reads) and attends over a fixed key count (keys_read).
        `deferred`: return at once, the tokens' copy under way (FrameOutput.pending)."""
        lengths = self.cache.lengths
        b = bucket_size(n_live, self.config.max_rows, self.buckets) if self.static else n_live
        reached = max(lengths[:n_live]) + 1
        attend_len = self.keys_read(reached)
        self.stage_positions(lengths[:b])
        if self.static and self.device.type == "cpu":
            self.reach.fill_(attend_length(reached, self.config.max_tokens, "cpu"))
        facts = self.sampling.facts(list(range(n_live)))
        logits = (None, None)
        if self.graphs is not None and not keep_logits:
            self.graphs.run((b, attend_len, facts), lambda: self._device_step(b, attend_len, facts, False))
        else:
            with self.watch_step() if self.watch_step else contextlib.nullcontext():
                logits = self._device_step(b, attend_len, facts, keep_logits)
        self.cache.advance(range(n_live))
        if self.config.record_steps:
            after = self.cache.lengths
            self.steps.append(StepRecord("decode", tuple(range(n_live)), 1, lengths[:n_live], after[:n_live]))
        # the frame's one read-back (a copy: on CPU .cpu() would hand out the buffer itself);
        # deferred, it is started now and waited for when the tokens are asked for (read_back.py)
        if deferred:
            return FrameOutput(tokens=None, pending=self.read_back.start(self.frame_out[:n_live]))
        out = FrameOutput(tokens=self.frame_out[:n_live].to("cpu", copy=True).numpy())
        if keep_logits:
            out.slow_logits, out.fast_logits = logits[0][:n_live], logits[1][:n_live]
        return out

    def keys_read(self, reached: int) -> int:
        """How many keys a step whose longest row needs `reached` reads: eager, those rounded up
        to whole chunks (attention.attend_length); static on CPU, the slot's capacity (of which
        the frame reads the chunks the rows reach: attention.attend_reached); static elsewhere,
        the smallest key bucket that holds them (graphs.kv_buckets)."""
        if self.fused:  # every row reads its own keys whatever this says: one shape
            return self.config.max_tokens
        if not self.static:
            return attend_length(reached, self.config.max_tokens, self.device.type)
        if self.device.type == "cpu":
            return self.config.max_tokens
        return kv_bucket(reached, self.kv_buckets)

    def stage_positions(self, values) -> None:
        """Write the next step's positions (one per batch row) into the step's input buffer."""
        n = len(values)
        self._positions_host[:n, 0] = torch.as_tensor(values, dtype=torch.int64)
        self.positions[:n].copy_(self._positions_host[:n], non_blocking=True)

    def _device_step(self, b: int, attend_len: int, facts: BatchFacts, keep_logits: bool):
        """The step's device work, batch rows 0..b-1: the frame, then its bookkeeping (the
        pending column, the sampling histories, the output buffer). Reads and writes only the
        engine's long-lived tensors (static_tensors), so it can run as a captured graph."""
        rows = slice(0, b)
        state = self.sampling.batch(rows, facts=facts, fused=self.kernel_path == "fused")
        tokens = self.next_tokens[rows].unsqueeze(-1)  # [b, 1+C, 1]
        reach = self.reach if self.static and self.device.type == "cpu" else None
        frame, main_index, slow_logits, fast_logits = self._frame(
            tokens, self.positions[rows], attend_len, state, keep_logits, reach
        )
        self.next_tokens[rows] = frame
        self.sampling.commit(rows, main_index, frame[:, 1:], state)
        self.frame_out[rows] = frame
        return slow_logits, fast_logits

    def capture_steps(self, sampling, budget_s: Optional[float] = None) -> int:
        """CUDA graphs: capture the step of every batch bucket x key bucket for rows sampling
        as `sampling` does, largest first (the graphs share one memory pool), within budget_s
        seconds (None: all). Needs an idle engine: each capture's eager step runs on free slots,
        whose junk is overwritten when a row takes them. Returns how many shapes were captured."""
        if self.graphs is None:
            return 0
        if any(owner is not None for owner in self.cache.owner):
            raise RuntimeError("capturing the decode steps needs an idle engine (rows are live)")
        facts = BatchFacts.of([sampling], self.sampling)
        began, done = time.perf_counter(), 0
        for b in sorted(bucket_sizes(self.config.max_rows, self.buckets), reverse=True):
            for keys in reversed(self.kv_buckets):
                if budget_s is not None and time.perf_counter() - began > budget_s:
                    return done
                if (b, keys, facts) not in self.graphs:
                    self.stage_positions([keys - 1] * b)
                    self.graphs.run((b, keys, facts), lambda b=b, keys=keys: self._device_step(b, keys, facts, False))
                    done += 1
        return done

    def static_tensors(self) -> tuple[list[Tensor], list[Tensor]]:
        """(every tensor a decode step may read, those it may also write): the weights and
        tables, the KV cache, the per-slot sampling state and the step's buffers. What a
        captured step's addresses are (audit.py checks a step against them)."""
        modules = list(self.model.modules()) + list(self.logit_head.modules())
        weights = [t for m in modules for t in [*m.parameters(recurse=False), *m.buffers(recurse=False)]]
        weights += [t for m in modules for t in vars(m).values() if isinstance(t, Tensor)]
        weights += [self.candidates.ids, self.candidates.is_semantic, self.positions, self.reach]
        cache = [t for layer in self.cache.slow + self.cache.fast for t in (layer.k, layer.v)]
        writable = cache + self.sampling.tensors() + [self.next_tokens, self.frame_out]
        return weights + writable, writable

    def _decode_frame(self, tokens: Tensor, positions: Tensor, attend_len: int, state: BatchSampling,
                      keep_logits: bool, reach: Optional[Tensor] = None):  # fmt: skip
        """The whole frame as one traceable function: no host reads, no data-dependent shapes.
        Its rows are slots 0..B-1 (B = tokens.shape[0])."""
        model, c = self.model, self.mc
        rows = slice(0, tokens.shape[0])
        out = model.forward_slow(
            tokens, positions, cache=self.cache.slow, rows=rows, attend_len=attend_len, last_only=True,
            logit_head=self.logit_head, reach=reach, fused=self.kernel_path,
        )  # fmt: skip
        slow_logits, hidden = out.logits[:, -1], out.hidden[:, -1]
        main_index, main, code = pick_main_token(slow_logits, state, self.candidates, c)
        codes = [code]
        # position 0 only writes its K/V: its head's logits are never sampled
        model.forward_fast(hidden.unsqueeze(1), start=0, cache=self.cache.fast, rows=rows, want_logits=False,
                           fused=self.kernel_path)  # fmt: skip
        fast_logits = []
        for k in range(1, c.num_codebooks):
            logits = model.forward_fast(
                model.fast_codebook_input(code), start=k, cache=self.cache.fast, rows=rows, fused=self.kernel_path
            )
            logits = logits[:, -1]
            if keep_logits:
                fast_logits.append(logits)
            code = pick_code(logits, k, state, None if self.limits is None else self.limits[k])
            codes.append(code)
        frame = torch.stack([main, *codes], dim=1)
        kept = torch.stack(fast_logits, dim=1) if fast_logits else None
        return frame, main_index, (slow_logits if keep_logits else None), kept


def _similar_widths(work: list[PrefillWork], chunks: list[tuple[int, int]], slack: float = 1.0):
    """Split one round's rows into groups whose chunk lengths differ by at most `slack`x.
    The default batches only equal lengths: padding would change the number of queries, and
    with it a row's float32 numbers. Yields (rows, their chunks)."""
    order = sorted(range(len(work)), key=lambda i: chunks[i][1] - chunks[i][0])
    groups: list[list[int]] = []
    first_width = None
    for i in order:
        width = chunks[i][1] - chunks[i][0]
        if first_width is None or width > slack * first_width:
            groups.append([])
            first_width = width
        groups[-1].append(i)
    return [([work[i] for i in g], [chunks[i] for i in g]) for g in groups]
