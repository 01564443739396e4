"""One sampling kernel per draw: the main token of a frame (end-of-speech mask, S1's repetition
penalty, the draw, S2's repetition-aware redraw) or one codebook's code (its limit, the
penalty, the draw), each a single launch instead of the ~30-50 of the eager form
(actors/engine/sampling.py and decoding.py's pick_main / pick_code: the references).

A program per row: the row's logits in float32, ranked by a sort of (value, id) keys (ties to
the lowest id, as the eager stable sort), then upstream's order: top-p over the softmax of all
the logits, top-k, temperature, a softmax over the kept ids, the inverse-CDF draw in float64
in rank order. The uniform is the row's counter-based hash of (seed keys, frame, draw index)
(docs/architecture.md §5.9), computed in the kernel with the same integer arithmetic, so a
row's draws depend on nothing but the row. Greedy rows (temperature 0 or top_k 1) take rank 0.
"""

import torch
from torch import Tensor

from ..sampling import _MUL_A, _MUL_B, DRAWS_PER_FRAME, RowSampling, apply_repetition_penalty, counter_uniforms, sample
from .triton_shim import runs_on, tl, triton


@triton.jit
def _mix32(x):
    x = x ^ (x >> 16)
    x = (x * _MUL_A) & 0xFFFFFFFF
    x = x ^ (x >> 15)
    x = (x * _MUL_B) & 0xFFFFFFFF
    return x ^ (x >> 15)


@triton.jit
def _uniform(key1_ptr, key2_ptr, frame_ptr, row, draw, DRAWS: tl.constexpr):
    """The row's uniform in [0, 1 - 2^-24] for draw `draw` of its current frame."""
    key1 = tl.load(key1_ptr + row).to(tl.int64)
    key2 = tl.load(key2_ptr + row).to(tl.int64)
    frame = tl.load(frame_ptr + row).to(tl.int64)
    counter = (frame * DRAWS + draw) & 0xFFFFFFFF
    h = _mix32(_mix32(counter ^ key1) ^ key2)
    return (h >> 8).to(tl.float32) * (1.0 / 16777216.0)


@triton.jit
def _penalise(vals, offs, hist_ptr, window, penalty, H: tl.constexpr):
    """S1's repetition penalty over the row's last `window` history entries (-1 = empty)."""
    seen = offs < 0
    for j in range(H - window, H):
        past = tl.load(hist_ptr + j)
        seen = seen | ((offs == past) & (past >= 0))
    penalised = tl.where(vals < 0, vals * penalty, tl.div_rn(vals, penalty))
    return tl.where(seen, penalised, vals)


@triton.jit
def _rank(vals, offs):
    """(values in rank order, their ids): descending, ties to the lowest id (lanes past V hold
    -inf and the highest ids, so they rank last). One sort of 64-bit keys: the value's bits made
    monotonic in the high half, the id reversed in the low half."""
    bits = vals.to(tl.int32, bitcast=True)
    ordered = tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits).to(tl.int64)
    key = (ordered << 32) | (4294967295 - offs.to(tl.int64))
    key = tl.sort(key, descending=True)
    high = (key >> 32).to(tl.int32)
    ranked = tl.where(high < 0, high ^ 0x7FFFFFFF, high).to(tl.float32, bitcast=True)
    ids = 4294967295 - (key & 4294967295)
    return ranked, ids


@triton.jit
def _draw(ranked, ids, offs, lse, top_p, top_k, temperature, u, V, BLOCK: tl.constexpr):
    """The id drawn with uniform u: top-p on the softmax of all logits, top-k, temperature,
    softmax over the kept ids, inverse CDF in float64 (searchsorted right=True) in rank order."""
    cum = tl.cumsum(tl.exp(ranked - lse), axis=0)
    k = tl.where(top_k > 0, top_k, V)
    remove = ((cum > top_p) | (offs >= k)) & (offs > 0)
    scaled = tl.where(remove, float("-inf"), ranked) / tl.maximum(temperature, 1e-5)
    top = tl.max(scaled, axis=0)
    e = tl.exp(scaled - top)
    probs = e / tl.sum(e, axis=0)
    cdf = tl.cumsum(probs.to(tl.float64), axis=0)
    total = tl.sum(tl.where(offs == BLOCK - 1, cdf, 0.0), axis=0)
    target = u.to(tl.float64) * total
    rank = tl.minimum(tl.sum((cdf <= target).to(tl.int32), axis=0), V - 1)
    return tl.sum(tl.where(offs == rank, ids, 0), axis=0)


@triton.jit
def _sample_code_kernel(
    logits_ptr, out_ptr, temp_ptr, top_p_ptr, top_k_ptr, penalty_ptr, window_ptr, hist_ptr, hist_stride,
    key1_ptr, key2_ptr, frame_ptr, draw, V, limit, stride_row,
    H: tl.constexpr, PENALTY: tl.constexpr, DRAWS: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    vals = tl.load(logits_ptr + row * stride_row + offs, mask=offs < V, other=float("-inf")).to(tl.float32)
    vals = tl.where(offs < limit, vals, float("-inf"))
    if PENALTY:
        window = tl.load(window_ptr + row)
        vals = _penalise(vals, offs, hist_ptr + row * hist_stride, window, tl.load(penalty_ptr + row), H)
    top = tl.max(vals, axis=0)
    lse = top + tl.log(tl.sum(tl.exp(vals - top), axis=0))
    ranked, ids = _rank(vals, offs)
    temperature = tl.load(temp_ptr + row)
    top_k = tl.load(top_k_ptr + row)
    u = _uniform(key1_ptr, key2_ptr, frame_ptr, row, draw, DRAWS)
    drawn = _draw(ranked, ids, offs, lse, tl.load(top_p_ptr + row), top_k, temperature, u, V, BLOCK)
    greedy = (temperature == 0.0) | (top_k == 1)
    tl.store(out_ptr + row, tl.where(greedy, tl.sum(tl.where(offs == 0, ids, 0), axis=0), drawn))


@triton.jit
def _sample_main_kernel(
    logits_ptr, out_ptr, temp_ptr, top_p_ptr, top_k_ptr, ras_temp_ptr, ras_top_p_ptr, ras_window_ptr,
    penalty_ptr, window_ptr, hist_ptr, hist_stride, allow_eos_ptr, im_end, key1_ptr, key2_ptr, frame_ptr, V,
    stride_row, ids_ptr, token_ptr, code_ptr, semantic_begin, codebook_size,
    H: tl.constexpr, PENALTY: tl.constexpr, RAS: tl.constexpr, DRAWS: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    vals = tl.load(logits_ptr + row * stride_row + offs, mask=offs < V, other=float("-inf")).to(tl.float32)
    refused = tl.load(allow_eos_ptr + row).to(tl.int32) == 0  # EOS stopping off: never offered
    vals = tl.where((offs == im_end) & refused, float("-inf"), vals)
    history = hist_ptr + row * hist_stride
    if PENALTY:
        window = tl.load(window_ptr + row)
        vals = _penalise(vals, offs, history, window, tl.load(penalty_ptr + row), H)
    top = tl.max(vals, axis=0)
    lse = top + tl.log(tl.sum(tl.exp(vals - top), axis=0))
    ranked, ids = _rank(vals, offs)
    temperature = tl.load(temp_ptr + row)
    top_k = tl.load(top_k_ptr + row)
    greedy = (temperature == 0.0) | (top_k == 1)
    first = tl.sum(tl.where(offs == 0, ids, 0), axis=0)
    u = _uniform(key1_ptr, key2_ptr, frame_ptr, row, 0, DRAWS)
    choice = _draw(ranked, ids, offs, lse, tl.load(top_p_ptr + row), top_k, temperature, u, V, BLOCK)
    choice = tl.where(greedy, first, choice)
    if RAS:  # S2: a semantic token among the last ras_window frames is redrawn (RAS settings)
        ras_window = tl.load(ras_window_ptr + row)
        repeated = choice < 0
        for j in range(H - ras_window, H):
            repeated = repeated | (tl.load(history + j) == choice)
        repeated = repeated & (choice != im_end)
        u_ras = _uniform(key1_ptr, key2_ptr, frame_ptr, row, 1, DRAWS)
        redraw = _draw(ranked, ids, offs, lse, tl.load(ras_top_p_ptr + row), top_k, tl.load(ras_temp_ptr + row),
                       u_ras, V, BLOCK)  # fmt: skip
        choice = tl.where(repeated, tl.where(greedy, first, redraw), choice)
    tl.store(out_ptr + row, choice)
    token = tl.load(ids_ptr + choice)  # the candidate's token id, and codebook 0 (first_code)
    tl.store(token_ptr + row, token)
    tl.store(code_ptr + row, tl.minimum(tl.maximum(token - semantic_begin, 0), codebook_size - 1))


def _rows(logits: Tensor) -> tuple[Tensor, int]:
    logits = logits if logits.stride(-1) == 1 else logits.contiguous()
    return logits, logits.stride(0)


def sample_code_reference(
    logits: Tensor, temperature: Tensor, top_p: Tensor, top_k: Tensor, penalty: Tensor, window: Tensor,
    history: Tensor, key1: Tensor, key2: Tensor, frame: Tensor, draw: int, limit: int, any_penalty: bool,
) -> Tensor:  # fmt: skip
    """The eager form of one codebook's draw (decoding.pick_code, ranking every id)."""
    logits = logits.float()
    v = logits.shape[-1]
    if limit < v:
        logits = torch.where(torch.arange(v, device=logits.device) < limit, logits, float("-inf"))
    if any_penalty:
        logits = apply_repetition_penalty(logits, _recent(history, window), penalty)
    rows = RowSampling(temperature, top_p, top_k, (temperature == 0) | (top_k == 1))
    return sample(logits, rows, counter_uniforms(key1, key2, frame, draw))


def sample_main_reference(
    logits: Tensor, temperature: Tensor, top_p: Tensor, top_k: Tensor, ras_temperature: Tensor, ras_top_p: Tensor,
    ras_window: Tensor, penalty: Tensor, window: Tensor, history: Tensor, allow_eos: Tensor, key1: Tensor,
    key2: Tensor, frame: Tensor, im_end: int, any_penalty: bool, any_ras: bool, ids: Tensor, semantic_begin: int,
    codebook_size: int,
) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
    """The eager form of the main token's draw (decoding.pick_main, ranking every candidate):
    (candidate index, token id, codebook 0) per row."""
    index = _main_index(logits, temperature, top_p, top_k, ras_temperature, ras_top_p, ras_window, penalty, window,
                        history, allow_eos, key1, key2, frame, im_end, any_penalty, any_ras)  # fmt: skip
    token = ids[index]
    return index, token, torch.clamp(token - semantic_begin, 0, codebook_size - 1)


def _main_index(
    logits, temperature, top_p, top_k, ras_temperature, ras_top_p, ras_window, penalty, window, history, allow_eos,
    key1, key2, frame, im_end, any_penalty, any_ras,
) -> Tensor:  # fmt: skip
    logits = logits.float()
    is_eos = torch.arange(logits.shape[-1], device=logits.device) == im_end
    logits = torch.where(is_eos.unsqueeze(0) & ~allow_eos.unsqueeze(1), float("-inf"), logits)
    if any_penalty:
        logits = apply_repetition_penalty(logits, _recent(history, window), penalty)
    greedy = (temperature == 0) | (top_k == 1)
    choice = sample(logits, RowSampling(temperature, top_p, top_k, greedy), counter_uniforms(key1, key2, frame, 0))
    if not any_ras:
        return choice
    repeated = (_recent(history, ras_window) == choice.unsqueeze(1)).any(dim=1) & (choice != im_end)
    ras = RowSampling(ras_temperature, ras_top_p, top_k, greedy)
    return torch.where(repeated, sample(logits, ras, counter_uniforms(key1, key2, frame, 1)), choice)


def _recent(history: Tensor, window: Tensor) -> Tensor:
    h = history.shape[-1]
    keep = torch.arange(h, device=history.device).unsqueeze(0) >= (h - window).unsqueeze(1)
    return torch.where(keep, history, torch.full_like(history, -1))


def sample_code_triton(
    logits, temperature, top_p, top_k, penalty, window, history, key1, key2, frame, draw, limit, any_penalty
) -> Tensor:
    """The codebook kernel: logits [B, V] -> codes [B] (int64)."""
    b, v = logits.shape
    logits, stride = _rows(logits)
    out = torch.empty(b, dtype=torch.int64, device=logits.device)
    if b:
        _sample_code_kernel[(b,)](
            logits, out, temperature, top_p, top_k, penalty, window, history, history.stride(0), key1, key2, frame,
            draw, v, min(int(limit), v), stride,
            H=history.shape[-1], PENALTY=bool(any_penalty), DRAWS=DRAWS_PER_FRAME, BLOCK=triton.next_power_of_2(v),
        )  # fmt: skip
    return out


def sample_main_triton(
    logits, temperature, top_p, top_k, ras_temperature, ras_top_p, ras_window, penalty, window, history, allow_eos,
    key1, key2, frame, im_end, any_penalty, any_ras, ids, semantic_begin, codebook_size,
) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
    """The main token's kernel: logits [B, candidates] -> (candidate indices, token ids, codebook 0)."""
    b, v = logits.shape
    logits, stride = _rows(logits)
    out, token, code = (torch.empty(b, dtype=torch.int64, device=logits.device) for _ in range(3))
    if b:
        _sample_main_kernel[(b,)](
            logits, out, temperature, top_p, top_k, ras_temperature, ras_top_p, ras_window, penalty, window,
            history, history.stride(0), allow_eos, im_end, key1, key2, frame, v, stride, ids, token, code,
            semantic_begin, codebook_size,
            H=history.shape[-1], PENALTY=bool(any_penalty), RAS=bool(any_ras), DRAWS=DRAWS_PER_FRAME,
            BLOCK=triton.next_power_of_2(v),
        )  # fmt: skip
    return out, token, code


@torch.library.custom_op("chorus::sample_code", mutates_args=())
def sample_code_op(
    logits: Tensor, temperature: Tensor, top_p: Tensor, top_k: Tensor, penalty: Tensor, window: Tensor,
    history: Tensor, key1: Tensor, key2: Tensor, frame: Tensor, draw: int, limit: int, any_penalty: bool,
) -> Tensor:  # fmt: skip
    """One codebook's draw for every row: one launch."""
    args = (logits, temperature, top_p, top_k, penalty, window, history, key1, key2, frame, draw, limit, any_penalty)
    return sample_code_triton(*args) if runs_on(logits.device.type) else sample_code_reference(*args)


@sample_code_op.register_fake
def _(logits, *_):
    return logits.new_empty(logits.shape[0], dtype=torch.int64)


@torch.library.custom_op("chorus::sample_main", mutates_args=())
def sample_main_op(
    logits: Tensor, temperature: Tensor, top_p: Tensor, top_k: Tensor, ras_temperature: Tensor, ras_top_p: Tensor,
    ras_window: Tensor, penalty: Tensor, window: Tensor, history: Tensor, allow_eos: Tensor, key1: Tensor,
    key2: Tensor, frame: Tensor, im_end: int, any_penalty: bool, any_ras: bool, ids: Tensor, semantic_begin: int,
    codebook_size: int,
) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
    """The main token's draw for every row (with its repetition-aware redraw), its token id and
    codebook 0: one launch."""
    args = (logits, temperature, top_p, top_k, ras_temperature, ras_top_p, ras_window, penalty, window, history,
            allow_eos, key1, key2, frame, im_end, any_penalty, any_ras, ids, semantic_begin, codebook_size)  # fmt: skip
    return sample_main_triton(*args) if runs_on(logits.device.type) else sample_main_reference(*args)


@sample_main_op.register_fake
def _(logits, *_):
    return tuple(logits.new_empty(logits.shape[0], dtype=torch.int64) for _ in range(3))
