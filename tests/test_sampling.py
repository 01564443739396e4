"""Sampling rules against hand-computed distributions."""

import math

import numpy as np
import pytest
import torch

from actors.engine.config import parse_config, with_semantic_ids
from actors.engine.decoding import Candidates, RowDecoder, pick_main
from actors.engine.sampling import RowSampling, apply_repetition_penalty, draw, filtered_probs, sample
from actors.engine.types import SamplingParams, upstream_sampling


def rows(temperature, top_p, top_k):
    return RowSampling.stack([temperature], [top_p], [top_k], "cpu")


def gens(n, seed=0):
    return [torch.Generator().manual_seed(seed + i) for i in range(n)]


LOGITS = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0]])


def softmax(x):
    e = np.exp(np.asarray(x, dtype=np.float64) - np.max(x))
    return e / e.sum()


def test_greedy_ties_go_to_lowest_id_and_temperature_zero_is_greedy():
    logits = torch.tensor([[0.0, 3.0, 1.0, 3.0], [5.0, 5.0, 5.0, 5.0]])
    s = RowSampling.stack([0.0, 0.0], [0.8, 0.8], [30, 30], "cpu")
    g = gens(2)
    states = [x.get_state() for x in g]
    assert sample(logits, s, g).tolist() == [1, 0]
    # greedy consumes no randomness and never divides by zero
    assert all(torch.equal(a.get_state(), b) for a, b in zip(g, states))
    assert sample(logits, RowSampling.stack([0.7, 1.0], [1.0, 1.0], [1, 1], "cpu"), gens(2)).tolist() == [1, 0]


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
    picks = sample(logits, s, gens(n, seed=99)).numpy()
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


def test_candidates_are_ordered_by_token_id():
    c = _candidates()
    assert c.ids.tolist() == [261, 280, 281, 282] and c.im_end_index == 0


def test_repetition_aware_sampling_redraws_repeated_tokens():
    """A semantic pick already in the row's window is redrawn at the RAS settings; a new
    token is kept. Settings: a near-greedy first draw, and a RAS draw over 2 candidates."""
    c = _candidates()
    logits = torch.tensor([[-9.0, 3.0, 2.5, -9.0]])
    params = SamplingParams(temperature=1e-3, top_p=1.0, top_k=2, ras_window=10, ras_temperature=1.0, ras_top_p=1.0)
    fresh = [pick_main(logits, [RowDecoder(params.with_seed(s), True)], c).item() for s in range(400)]
    assert set(fresh) == {1}  # candidate 1 (id 280) is the near-certain normal pick
    repeated = []
    for s in range(400):
        d = RowDecoder(params.with_seed(s), True)
        d.main_history = [1, 2]
        repeated.append(pick_main(logits, [d], c).item())
    share = repeated.count(2) / len(repeated)
    expected = softmax([3.0, 2.5])[1]  # RAS draw: temperature 1 over the top-2
    assert abs(share - expected) < 4 * math.sqrt(expected * (1 - expected) / 400)
    # outside the window: no redraw
    d = RowDecoder(params.with_seed(0), True)
    d.main_history = [1] + [2] * 10
    assert pick_main(logits, [d], c).item() == 1


def test_eos_off_never_offers_im_end():
    c = _candidates()
    logits = torch.tensor([[9.0, 0.0, 0.0, 0.0]])
    assert pick_main(logits, [RowDecoder(SamplingParams(temperature=0), True)], c).item() == 0
    assert pick_main(logits, [RowDecoder(SamplingParams(temperature=0), False)], c).item() == 1


def test_upstream_defaults_and_validation():
    s2, s1 = upstream_sampling("s2"), upstream_sampling("s1")
    assert (s2.temperature, s2.top_p, s2.top_k, s2.ras_window) == (0.8, 0.8, 30, 10)
    assert (s1.repetition_penalty, s1.repetition_window) == (1.1, 16)
    for bad in (dict(temperature=-1), dict(top_p=0), dict(top_k=-2), dict(repetition_penalty=0)):
        with pytest.raises(ValueError):
            SamplingParams(**bad).validate()
