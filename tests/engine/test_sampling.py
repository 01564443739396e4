"""Sampling rules against hand-computed distributions."""

import math

import numpy as np
import pytest
import torch

from actors.engine.architecture import parse_config, with_semantic_ids
from actors.engine.decoding import Candidates, SlotSampling, pick_main
from actors.engine.sampling import (
    RowSampling,
    apply_repetition_penalty,
    counter_uniforms,
    draw,
    filtered_probs,
    sample,
    seed_keys,
)
from actors.engine.types import SamplingParams, upstream_sampling


def rows(temperature, top_p, top_k):
    return RowSampling.stack([temperature], [top_p], [top_k], "cpu")


def uniforms(n, seed=0, frame=0, draw_index=0):
    """One counter-based uniform per row, row i seeded seed + i."""
    keys = [seed_keys(seed + i) for i in range(n)]
    key1 = torch.tensor([k[0] for k in keys])
    key2 = torch.tensor([k[1] for k in keys])
    return counter_uniforms(key1, key2, torch.full((n,), frame), draw_index)


LOGITS = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0]])


def softmax(x):
    e = np.exp(np.asarray(x, dtype=np.float64) - np.max(x))
    return e / e.sum()


def test_greedy_ties_go_to_lowest_id_and_temperature_zero_is_greedy():
    logits = torch.tensor([[0.0, 3.0, 1.0, 3.0], [5.0, 5.0, 5.0, 5.0]])
    s = RowSampling.stack([0.0, 0.0], [0.8, 0.8], [30, 30], "cpu")
    assert sample(logits, s, uniforms(2)).tolist() == [1, 0]
    # greedy never divides by zero and ignores the uniform, whatever it is
    for u in (torch.zeros(2), torch.full((2,), 1 - 2**-24)):
        assert sample(logits, s, u).tolist() == [1, 0]
    assert sample(logits, RowSampling.stack([0.7, 1.0], [1.0, 1.0], [1, 1], "cpu"), uniforms(2)).tolist() == [1, 0]


def test_top_k_renormalises_over_kept_set():
    p = filtered_probs(LOGITS, rows(1.0, 1.0, 2))[0].double().numpy()
    expected = np.zeros(5)
    expected[:2] = softmax([2.0, 1.0])
    assert np.allclose(p, expected, atol=1e-6)


def test_top_p_on_raw_softmax_then_temperature():
    raw = softmax(LOGITS[0].numpy())  # [0.575, 0.211, 0.128, 0.078, 0.029]
    cum = np.cumsum(raw)
    # top_p 0.8: keep while cumulative <= 0.8, plus the first one past it is removed
    keep = ~(cum > 0.8)
    keep[0] = True
    assert keep.tolist() == [True, True, False, False, False]
    p = filtered_probs(LOGITS, rows(0.5, 0.8, 0))[0].double().numpy()
    expected = np.where(keep, np.exp(LOGITS[0].numpy() / 0.5), 0)
    expected /= expected.sum()
    assert np.allclose(p, expected, atol=1e-6)
    # top-p keeps at least the best id even when it alone exceeds top_p
    p = filtered_probs(LOGITS, rows(1.0, 0.1, 0))[0]
    assert p[0] == 1 and p[1:].sum() == 0


def test_top_p_and_top_k_combine_in_upstream_order():
    # top-p on the raw softmax keeps 3 (cum 0.575, 0.786, 0.914 <= 0.95), top-k 2 cuts to 2,
    # then temperature 2 reshapes the survivors
    p = filtered_probs(LOGITS, rows(2.0, 0.95, 2))[0].double().numpy()
    e = np.exp(np.array([2.0, 1.0]) / 2.0)
    assert np.allclose(p[:2], e / e.sum(), atol=1e-6) and p[2:].sum() == 0


def test_draw_never_returns_zero_probability_ids():
    probs = torch.tensor([[0.0, 0.5, 0.0, 0.5, 0.0]])
    for u in [0.0, 1e-12, 0.4999999, 0.5, 0.9999999]:
        i = int(draw(probs, torch.tensor([u])))
        assert probs[0, i] > 0, u


@pytest.mark.parametrize("temperature, top_p, top_k", [(1.0, 1.0, 0), (0.7, 0.9, 3), (1.3, 0.95, 4)])
def test_empirical_distribution_matches_intended(temperature, top_p, top_k):
    """Chi-square goodness of fit over 4,000 seeded draws (fixed seeds: deterministic)."""
    n = 4000
    logits = LOGITS.repeat(n, 1)
    s = RowSampling.stack([temperature] * n, [top_p] * n, [top_k] * n, "cpu")
    picks = sample(logits, s, uniforms(n, seed=99)).numpy()
    expected = filtered_probs(LOGITS, rows(temperature, top_p, top_k))[0].double().numpy()
    counts = np.bincount(picks, minlength=5)
    assert counts[expected == 0].sum() == 0
    kept = expected > 0
    chi2 = ((counts[kept] - n * expected[kept]) ** 2 / (n * expected[kept])).sum()
    dof = kept.sum() - 1
    # 99.9% quantiles of chi-square for dof 1..4: 10.83, 13.82, 16.27, 18.47
    assert chi2 < [0, 10.83, 13.82, 16.27, 18.47][dof], (counts, expected)


def test_repetition_penalty_hand_computed():
    logits = torch.tensor([[2.0, -1.0, 0.5, 3.0]])
    out = apply_repetition_penalty(logits, torch.tensor([[1, 3, 3, -1]]), torch.tensor([2.0]))
    assert out.tolist() == [[2.0, -2.0, 0.5, 1.5]]
    same = apply_repetition_penalty(logits, torch.tensor([[1, 3]]), torch.tensor([1.0]))
    assert torch.equal(same, logits)


def _candidates():
    cfg = parse_config(
        {
            "model_type": "dual_ar",
            "vocab_size": 300,
            "n_layer": 1,
            "n_head": 2,
            "dim": 8,
            "head_dim": 4,
            "codebook_size": 3,
            "num_codebooks": 2,
        },
        "test",
    )
    cfg = with_semantic_ids(cfg, 280, 282, "test")
    return Candidates(cfg, im_end_id=261, device="cpu")


def _pick(cand, logits, params, history=(), stop_on_eos=True):
    """pick_main for one row whose recent main tokens (candidate indices, oldest first) are
    `history`, through the engine's per-slot device state."""
    state = SlotSampling(1, 2, 16, len(cand.ids), 3, "cpu")
    state.admit(0, params, stop_on_eos)
    for index in history:
        batch = state.batch(slice(0, 1), [0])
        state.commit(slice(0, 1), torch.tensor([index]), torch.zeros(1, 2, dtype=torch.int64), batch)
    return pick_main(logits, state.batch(slice(0, 1), [0]), cand).item()


def test_candidates_are_ordered_by_token_id():
    c = _candidates()
    assert c.ids.tolist() == [261, 280, 281, 282] and c.im_end_index == 0


def test_repetition_aware_sampling_redraws_repeated_tokens():
    """A semantic pick already in the row's window is redrawn at the RAS settings; a new
    token is kept. Settings: a near-greedy first draw, and a RAS draw over 2 candidates."""
    c = _candidates()
    logits = torch.tensor([[-9.0, 3.0, 2.5, -9.0]])
    params = SamplingParams(temperature=1e-3, top_p=1.0, top_k=2, ras_window=10, ras_temperature=1.0, ras_top_p=1.0)
    fresh = [_pick(c, logits, params.with_seed(s)) for s in range(400)]
    assert set(fresh) == {1}  # candidate 1 (id 280) is the near-certain normal pick
    repeated = [_pick(c, logits, params.with_seed(s), history=[1, 2]) for s in range(400)]
    share = repeated.count(2) / len(repeated)
    expected = softmax([3.0, 2.5])[1]  # RAS draw: temperature 1 over the top-2
    assert abs(share - expected) < 4 * math.sqrt(expected * (1 - expected) / 400)
    # outside the window: no redraw
    assert _pick(c, logits, params.with_seed(0), history=[1] + [2] * 10) == 1


def test_eos_off_never_offers_im_end():
    c = _candidates()
    logits = torch.tensor([[9.0, 0.0, 0.0, 0.0]])
    assert _pick(c, logits, SamplingParams(temperature=0)) == 0
    assert _pick(c, logits, SamplingParams(temperature=0), stop_on_eos=False) == 1


def test_upstream_defaults_and_validation():
    s2, s1 = upstream_sampling("s2"), upstream_sampling("s1")
    assert (s2.temperature, s2.top_p, s2.top_k, s2.ras_window) == (0.8, 0.8, 30, 10)
    assert (s1.repetition_penalty, s1.repetition_window) == (1.1, 16)
    for bad in (dict(temperature=-1), dict(top_p=0), dict(top_k=-2), dict(repetition_penalty=0)):
        with pytest.raises(ValueError):
            SamplingParams(**bad).validate()


def test_counter_uniforms_are_uniform_and_keyed_by_seed_frame_and_draw():
    """The counter-based stream: values in [0, 1 - 2^-24], uniform (chi-square over 20 bins of
    20,000 (seed, frame, draw) triples), and a change of seed, frame or draw index changes
    the value, while the same key gives the same value."""
    n = 20000
    seeds, frames = torch.arange(n) % 97, torch.arange(n) // 97
    keys = [seed_keys(int(s)) for s in seeds]
    key1, key2 = torch.tensor([k[0] for k in keys]), torch.tensor([k[1] for k in keys])
    u = counter_uniforms(key1, key2, frames, 3)
    assert u.dtype == torch.float32 and float(u.min()) >= 0 and float(u.max()) <= 1 - 2**-24
    counts = np.bincount((u.numpy() * 20).astype(int), minlength=20)
    chi2 = ((counts - n / 20) ** 2 / (n / 20)).sum()
    assert chi2 < 43.82  # 99.9% quantile, 19 degrees of freedom
    assert torch.equal(u, counter_uniforms(key1, key2, frames, 3))
    for other in (counter_uniforms(key1, key2, frames + 1, 3), counter_uniforms(key1, key2, frames, 4)):
        assert (other != u).float().mean() > 0.99
    assert seed_keys(0) != seed_keys(1) and seed_keys(2**40) != seed_keys(0) and seed_keys(-1) == seed_keys(2**64 - 1)
    # neighbouring streams are not correlated: draws of seed s and s+1 at the same counter
    a, b = u[:-1].double().numpy(), u[1:].double().numpy()
    assert abs(np.corrcoef(a, b)[0, 1]) < 0.05
