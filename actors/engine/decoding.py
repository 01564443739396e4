"""One frame's decisions for a batch of rows, shared by the batched engine and the uncached
reference loop so that both pick tokens by the same rules from the same random streams.

Per frame: the main (slow) token over the semantic ids + <|im_end|> (S1 repetition penalty,
S2 repetition-aware resampling), then codebook 0 = main - semantic_begin (clamped), then
codebooks 1..C-1 from the fast stack; then the frame is accepted or the row stops
(`accept_frame`, host side, the one stop rule).

Every row's sampling state lives on the device, one entry per KV slot (`SlotSampling`): its
settings, written once at admission, its random-stream keys and frame counter, and ring
buffers of its recent main tokens and codes. A frame reads and updates them with tensor ops
only: nothing is read back to the host until the frame's tokens are.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor

from .architecture import ModelArchitecture
from .kernels.sampler import sample_code_op, sample_main_op
from .sampling import DRAW_MAIN, DRAW_RAS, RowSampling, apply_repetition_penalty, counter_uniforms, sample, seed_keys
from .types import STOP_BUDGET, STOP_EOS, SamplingParams


class Candidates:
    """The slow-sampling vocabulary: <|im_end|> and every semantic id, in ascending id order
    so that index order equals id order (greedy ties go to the lowest id, as over the full
    vocabulary)."""

    def __init__(self, config: ModelArchitecture, im_end_id: int, device):
        ids = sorted({im_end_id, *range(config.semantic_begin_id, config.semantic_end_id + 1)})
        self.ids = torch.tensor(ids, dtype=torch.int64, device=device)
        self.im_end_index = ids.index(im_end_id)
        self.im_end_id = im_end_id
        self.semantic_begin_id = config.semantic_begin_id
        self.semantic_end_id = config.semantic_end_id
        self.is_semantic = (self.ids >= config.semantic_begin_id) & (self.ids <= config.semantic_end_id)


@dataclass
class BatchSampling:
    """The sampling state of one batch's rows: views into `SlotSampling` (a slice of
    consecutive slots) or gathered copies (a tensor of slot ids; then `SlotSampling.commit`
    writes the updated history back)."""

    main: RowSampling
    ras: RowSampling
    ras_window: Tensor  # [B] int64
    penalty: Tensor  # [B] float32
    penalty_window: Tensor  # [B] int64
    allow_eos: Tensor  # [B] bool
    key1: Tensor  # [B] int64
    key2: Tensor  # [B] int64
    frame: Tensor  # [B] int64: frames this row has sampled so far
    uniforms: Optional[Tensor]  # [B, 1 + C] float32: this frame's draws (main, RAS, codebooks 1..C-1)
    main_history: Tensor  # [B, H] int64 candidate indices, oldest first, -1 = empty
    code_history: Tensor  # [B, C, H] int64 codes, oldest first, -1 = empty
    # host-side facts about these rows (static per batch composition, so a captured frame
    # specialises on them instead of testing tensors)
    width_main: int  # ids ranked for top-k/top-p of the main token
    width_code: int  # likewise for codebooks
    any_ras: bool
    any_penalty: bool
    # the draws run as the fused kernels (kernels/sampler.py), which hash their own uniforms
    fused: bool = False

    def recent(self, history: Tensor, window: Tensor) -> Tensor:
        """history [B, H] (or [B, H] of one codebook) limited to each row's last `window`
        frames: older entries become -1."""
        h = history.shape[-1]
        keep = torch.arange(h, device=history.device).unsqueeze(0) >= (h - window).unsqueeze(1)
        return torch.where(keep, history, torch.full_like(history, -1))


@dataclass(frozen=True)
class BatchFacts:
    """What a batch's rows decide about the shape of its frame, read on the host: how many best
    ids top-k/top-p rank, and whether repetition-aware resampling or a penalty runs. A compiled
    or captured frame specialises on them (they key its graphs), instead of testing tensors."""

    width_main: int
    width_code: int
    any_ras: bool
    any_penalty: bool

    @staticmethod
    def of(params: list[SamplingParams], slots: SlotSampling) -> BatchFacts:
        def width(limit: int) -> int:
            ks = [p.top_k for p in params if not p.greedy]
            if not ks or min(ks) == 0:
                return limit if ks else 1
            # a power of two >= the largest k: few distinct widths, so few captured variants
            return min(limit, 1 << (max(ks) - 1).bit_length())

        return BatchFacts(
            width_main=width(slots.vocab),
            width_code=width(slots.codebook_size),
            any_ras=any(p.ras_window > 0 and not p.greedy for p in params),
            any_penalty=any(p.repetition_penalty != 1.0 for p in params),
        )


class SlotSampling:
    """Per-slot sampling state on the device (see the module docstring). The host mirrors the
    few settings that decide a batch's static facts (top-k widths, whether RAS or a penalty is
    on), so building a batch never reads the device."""

    def __init__(self, slots: int, num_codebooks: int, history: int, vocab: int, codebook_size: int, device):
        self.slots, self.history, self.device = slots, history, device
        self.vocab, self.codebook_size = vocab, codebook_size

        def zeros(dtype, *shape):
            return torch.zeros(slots, *shape, dtype=dtype, device=device)

        self.temperature, self.top_p, self.top_k = zeros(torch.float32), zeros(torch.float32), zeros(torch.int64)
        self.ras_temperature, self.ras_top_p = zeros(torch.float32), zeros(torch.float32)
        self.ras_window, self.penalty, self.penalty_window = (
            zeros(torch.int64),
            zeros(torch.float32),
            zeros(torch.int64),
        )
        self.allow_eos = zeros(torch.bool)
        self.key1, self.key2, self.frame = zeros(torch.int64), zeros(torch.int64), zeros(torch.int64)
        self.main_history = torch.full((slots, history), -1, dtype=torch.int64, device=device)
        self.code_history = torch.full((slots, num_codebooks, history), -1, dtype=torch.int64, device=device)
        self.penalty.fill_(1.0)
        self.temperature.fill_(0.0)  # free slots decode as greedy junk in padded batches
        self.top_p.fill_(1.0)
        self.ras_top_p.fill_(1.0)
        self.params: list[Optional[SamplingParams]] = [None] * slots
        # a frame's draws: main, its RAS redraw, then codebooks 1..C-1
        self.draw_indices = torch.arange(1 + num_codebooks, dtype=torch.int64, device=device)

    def admit(self, slot: int, params: SamplingParams, stop_on_eos: bool) -> None:
        """Write a new row's settings into its slot: a handful of scalar writes, once per row."""
        if max(params.ras_window, params.repetition_window if params.repetition_penalty != 1.0 else 0) > self.history:
            raise ValueError(f"sampling windows above {self.history} frames are not kept by this engine")
        key1, key2 = seed_keys(params.seed)
        values = {
            "temperature": params.temperature,
            "top_p": params.top_p,
            "top_k": params.top_k,
            "ras_temperature": params.ras_temperature,
            "ras_top_p": params.ras_top_p,
            "ras_window": params.ras_window if not params.greedy else 0,
            "penalty": params.repetition_penalty,
            "penalty_window": params.repetition_window if params.repetition_penalty != 1.0 else 0,
            "allow_eos": stop_on_eos,
            "key1": key1,
            "key2": key2,
            "frame": 0,
        }
        for name, value in values.items():
            getattr(self, name)[slot] = value
        self.main_history[slot] = -1
        self.code_history[slot] = -1
        self.params[slot] = params

    def release(self, slot: int) -> None:
        self.params[slot] = None

    def move(self, src: int, dst: int) -> None:
        for tensor in self._tensors():
            tensor[dst] = tensor[src]
        self.params[dst], self.params[src] = self.params[src], None

    def _tensors(self) -> list[Tensor]:
        return [
            self.temperature, self.top_p, self.top_k, self.ras_temperature, self.ras_top_p, self.ras_window,
            self.penalty, self.penalty_window, self.allow_eos, self.key1, self.key2, self.frame,
            self.main_history, self.code_history,
        ]  # fmt: skip

    def facts(self, live_slots: list[int]) -> BatchFacts:
        """The host-side facts of a batch of these slots' rows (padding rows of a bucket are free
        slots and do not count)."""
        return BatchFacts.of([self.params[s] for s in live_slots if self.params[s] is not None], self)

    def batch(
        self, rows, live_slots: Optional[list[int]] = None, facts: Optional[BatchFacts] = None, fused: bool = False
    ) -> BatchSampling:
        """The state of the batch addressed by `rows` (a slice or an int64 tensor of slots), with
        the static facts of `live_slots` (or `facts` as given). Tensor ops only: no host reads.
        `fused`: drawn by the sampling kernels, which compute their own uniforms."""
        facts = facts if facts is not None else self.facts(live_slots or [])
        t = self.temperature[rows]
        k = self.top_k[rows]
        greedy = None if fused else (t == 0) | (k == 1)  # the kernels decide it per row themselves
        return BatchSampling(
            main=RowSampling(t, self.top_p[rows], k, greedy),
            ras=RowSampling(self.ras_temperature[rows], self.ras_top_p[rows], k, greedy),
            ras_window=self.ras_window[rows],
            penalty=self.penalty[rows],
            penalty_window=self.penalty_window[rows],
            allow_eos=self.allow_eos[rows],
            key1=self.key1[rows],
            key2=self.key2[rows],
            frame=self.frame[rows],
            uniforms=None
            if fused
            else counter_uniforms(self.key1[rows], self.key2[rows], self.frame[rows], self.draw_indices),
            main_history=self.main_history[rows],
            code_history=self.code_history[rows],
            width_main=facts.width_main,
            width_code=facts.width_code,
            any_ras=facts.any_ras,
            any_penalty=facts.any_penalty,
            fused=fused,
        )

    def tensors(self) -> list[Tensor]:
        """Every per-slot tensor (the decode step reads them all; a captured step needs each to
        keep its address)."""
        return self._tensors() + [self.draw_indices]

    def commit(self, rows, main_index: Tensor, codes: Tensor, state: BatchSampling) -> None:
        """Record the frame just sampled: shift it into the rows' histories, count the frame."""
        self.main_history[rows] = torch.cat([state.main_history[:, 1:], main_index.unsqueeze(1)], dim=1)
        self.code_history[rows] = torch.cat([state.code_history[:, :, 1:], codes.unsqueeze(2)], dim=2)
        self.frame[rows] = state.frame + 1


def pick_main(logits: Tensor, state: BatchSampling, cand: Candidates) -> Tensor:
    """logits [B, len(cand.ids)] over the candidates -> candidate indices [B]."""
    logits = logits.float()
    # with EOS stopping off the row may not end itself: <|im_end|> is not offered
    is_eos = torch.arange(logits.shape[-1], device=logits.device) == cand.im_end_index
    logits = torch.where(is_eos.unsqueeze(0) & ~state.allow_eos.unsqueeze(1), float("-inf"), logits)
    if state.any_penalty:
        logits = apply_repetition_penalty(logits, state.recent(state.main_history, state.penalty_window), state.penalty)
    choice = sample(logits, state.main, state.uniforms[:, DRAW_MAIN], state.width_main)
    if not state.any_ras:
        return choice
    # S2 repetition-aware sampling: a semantic token already among the row's last
    # `ras_window` frames is redrawn at the RAS temperature/top-p (never on the first frame;
    # greedy rows stay greedy: their ras_window is 0)
    recent = state.recent(state.main_history, state.ras_window)
    repeated = (recent == choice.unsqueeze(1)).any(dim=1) & cand.is_semantic[choice]
    redraw = sample(logits, state.ras, state.uniforms[:, DRAW_RAS], state.width_main)
    return torch.where(repeated, redraw, choice)


def pick_main_token(
    logits: Tensor, state: BatchSampling, cand: Candidates, config: ModelArchitecture
) -> tuple[Tensor, Tensor, Tensor]:
    """The frame's main draw: (candidate indices, token ids, codebook 0) [B] each; one launch on
    the fused path (kernels/sampler.py), else pick_main, the id and first_code."""
    if state.fused:
        return sample_main_op(
            logits, state.main.temperature, state.main.top_p, state.main.top_k, state.ras.temperature,
            state.ras.top_p, state.ras_window, state.penalty, state.penalty_window, state.main_history,
            state.allow_eos, state.key1, state.key2, state.frame, cand.im_end_index, state.any_penalty, state.any_ras,
            cand.ids, config.semantic_begin_id, config.codebook_size,
        )  # fmt: skip
    index = pick_main(logits, state, cand)
    token = cand.ids[index]
    return index, token, first_code(token, config)


def pick_code(logits: Tensor, codebook: int, state: BatchSampling, limit: Optional[int]) -> Tensor:
    """logits [B, codebook_size] for codebook k >= 1 -> codes [B]."""
    if state.fused:
        return sample_code_op(
            logits, state.main.temperature, state.main.top_p, state.main.top_k, state.penalty, state.penalty_window,
            state.code_history[:, codebook], state.key1, state.key2, state.frame, DRAW_RAS + codebook,
            logits.shape[-1] if limit is None else limit, state.any_penalty,
        )  # fmt: skip
    logits = logits.float()
    if limit is not None and limit < logits.shape[-1]:
        allowed = torch.arange(logits.shape[-1], device=logits.device) < limit
        logits = torch.where(allowed.unsqueeze(0), logits, float("-inf"))
    if state.any_penalty:
        recent = state.recent(state.code_history[:, codebook], state.penalty_window)
        logits = apply_repetition_penalty(logits, recent, state.penalty)
    return sample(logits, state.main, state.uniforms[:, DRAW_RAS + codebook], state.width_code)


def first_code(main_tokens: Tensor, config: ModelArchitecture) -> Tensor:
    """Codebook 0 of a frame: the main token's offset into the semantic range, clamped (an
    <|im_end|> frame gets 0)."""
    return torch.clamp(main_tokens - config.semantic_begin_id, 0, config.codebook_size - 1)


def accept_frame(main_token: int, im_end_id: int, stop_on_eos: bool, frames_before: int, max_frames: int):
    """The one stop rule (host side), for the engine and the reference loop alike: returns
    (keep_this_frame, stop_reason or None). An <|im_end|> frame ends the row and is not part
    of its output; a row stops with "budget" once it holds max_frames frames."""
    if main_token == im_end_id and stop_on_eos:
        return False, STOP_EOS
    if frames_before + 1 >= max_frames:
        return True, STOP_BUDGET
    return True, None
