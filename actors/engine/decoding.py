"""One frame's decisions for a batch of rows, shared by the batched engine and the uncached
reference loop so that both pick tokens by the same rules from the same random streams.

Per frame: the main (slow) token over the semantic ids + <|im_end|> (S1 repetition penalty,
S2 repetition-aware resampling), then codebook 0 = main - semantic_begin (clamped), then
codebooks 1..C-1 from the fast stack."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Optional

import torch
from torch import Tensor

from .config import ModelConfig
from .sampling import RowSampling, apply_repetition_penalty, sample
from .types import SamplingParams


class Candidates:
    """The slow-sampling vocabulary: <|im_end|> and every semantic id, in ascending id order
    so that index order equals id order (greedy ties go to the lowest id, as over the full
    vocabulary)."""

    def __init__(self, config: ModelConfig, im_end_id: int, device):
        ids = sorted({im_end_id, *range(config.semantic_begin_id, config.semantic_end_id + 1)})
        self.ids = torch.tensor(ids, dtype=torch.int64, device=device)
        self.im_end_index = ids.index(im_end_id)
        self.im_end_id = im_end_id
        self.semantic_begin_id = config.semantic_begin_id
        self.semantic_end_id = config.semantic_end_id
        self.is_semantic = [config.semantic_begin_id <= i <= config.semantic_end_id for i in ids]


@dataclass
class RowDecoder:
    """A row's sampling state: settings, its own random stream and its recent history."""

    params: SamplingParams
    stop_on_eos: bool
    generator: torch.Generator = field(init=False)
    main_history: list[int] = field(default_factory=list)  # candidate indices, one per frame
    code_history: list[list[int]] = field(default_factory=list)  # per frame, C codes

    def __post_init__(self):
        self.generator = torch.Generator(device="cpu")
        self.generator.manual_seed(int(self.params.seed))

    def recent_main(self, window: int) -> list[int]:
        return self.main_history[-window:] if window > 0 else []

    def recent_codes(self, codebook: int, window: int) -> list[int]:
        return [frame[codebook] for frame in self.code_history[-window:]] if window > 0 else []


def _history_tensor(values: Sequence[Sequence[int]], device) -> Tensor:
    width = max((len(v) for v in values), default=0) or 1
    out = torch.full((len(values), width), -1, dtype=torch.int64)
    for i, v in enumerate(values):
        if v:
            out[i, : len(v)] = torch.tensor(v, dtype=torch.int64)
    return out.to(device)


def _sampling(rows: Sequence[RowDecoder], device, ras: bool = False) -> RowSampling:
    if ras:
        return RowSampling.stack(
            [r.params.ras_temperature for r in rows],
            [r.params.ras_top_p for r in rows],
            [r.params.top_k for r in rows],
            device,
        )
    return RowSampling.stack(
        [r.params.temperature for r in rows], [r.params.top_p for r in rows], [r.params.top_k for r in rows], device
    )


def _penalise(logits: Tensor, rows: Sequence[RowDecoder], histories: Sequence[Sequence[int]]) -> Tensor:
    if all(r.params.repetition_penalty == 1.0 for r in rows):
        return logits
    penalty = torch.tensor([r.params.repetition_penalty for r in rows], dtype=logits.dtype, device=logits.device)
    return apply_repetition_penalty(logits, _history_tensor(histories, logits.device), penalty)


def pick_main(logits: Tensor, rows: Sequence[RowDecoder], cand: Candidates) -> Tensor:
    """logits [B, len(cand.ids)] over the candidates -> candidate indices [B]."""
    logits = logits.float()
    no_eos = [i for i, r in enumerate(rows) if not r.stop_on_eos]
    if no_eos:  # with EOS stopping off the row may not end itself: <|im_end|> is not offered
        logits = logits.clone()
        logits[no_eos, cand.im_end_index] = float("-inf")
    logits = _penalise(logits, rows, [r.recent_main(r.params.repetition_window) for r in rows])
    choice = sample(logits, _sampling(rows, logits.device), [r.generator for r in rows])
    # S2 repetition-aware sampling: a semantic token already among the row's last
    # `ras_window` frames is redrawn at the RAS temperature/top-p (never on the first frame;
    # greedy rows stay greedy).
    redo = []
    picks = choice.tolist()
    for i, r in enumerate(rows):
        p = r.params
        if p.ras_window > 0 and not p.greedy and cand.is_semantic[picks[i]] and picks[i] in r.recent_main(p.ras_window):
            redo.append(i)
    if redo:
        sub = [rows[i] for i in redo]
        idx = torch.tensor(redo, device=logits.device)
        choice[idx] = sample(logits[idx], _sampling(sub, logits.device, ras=True), [r.generator for r in sub])
    return choice


def pick_code(logits: Tensor, codebook: int, rows: Sequence[RowDecoder], limit: Optional[int]) -> Tensor:
    """logits [B, codebook_size] for codebook k >= 1 -> codes [B]."""
    logits = logits.float()
    if limit is not None and limit < logits.shape[-1]:
        logits = logits.clone()
        logits[:, limit:] = float("-inf")
    logits = _penalise(logits, rows, [r.recent_codes(codebook, r.params.repetition_window) for r in rows])
    return sample(logits, _sampling(rows, logits.device), [r.generator for r in rows])


def first_code(main_tokens: Tensor, config: ModelConfig) -> Tensor:
    """Codebook 0 of a frame: the main token's offset into the semantic range, clamped (an
    <|im_end|> frame gets 0)."""
    return torch.clamp(main_tokens - config.semantic_begin_id, 0, config.codebook_size - 1)
