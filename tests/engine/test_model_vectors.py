"""The upstream-made vectors reproduce: slow and fast logits within 1e-4 (float32), greedy
codes token for token, prompts token for token."""

import json

import numpy as np
import pytest
import torch

from actors.engine import Engine, EngineConfig, PromptBuilder, Request, SamplingParams, load_model
from helpers import DUALAR_SETS, TEST_DEVICE, run_module, vector_set

ATOL = 1e-4


@pytest.mark.parametrize("name", DUALAR_SETS)
def test_score_cli_reproduces_upstream_logits(name, tmp_path):
    v = vector_set(name)
    out = tmp_path / "score.npz"
    proc = run_module(
        "actors.engine",
        "score",
        "--checkpoint",
        str(v / "checkpoint"),
        "--tokens",
        str(v / "vectors/score_tokens.npy"),
        "--out",
        str(out),
        "--dtype",
        "float32",  # the vectors' guarantee is float32's (the CLI's default is auto)
    )
    assert proc.returncode == 0, proc.stderr
    got = np.load(out)
    slow, fast = np.load(v / "vectors/score_slow_logits.npy"), np.load(v / "vectors/score_fast_logits.npy")
    assert got["slow_logits"].dtype == np.float32 and got["slow_logits"].shape == slow.shape
    assert got["fast_logits"].shape == fast.shape
    assert np.abs(got["slow_logits"] - slow).max() <= ATOL
    assert np.abs(got["fast_logits"] - fast).max() <= ATOL


@pytest.mark.parametrize("name", DUALAR_SETS)
def test_greedy_codes_reproduce_through_engine_and_cli(name, tmp_path):
    v = vector_set(name)
    prompt = np.load(v / "vectors/greedy_prompt.npy")
    expected = np.load(v / "vectors/greedy_codes.npy")
    meta = json.loads((v / "vectors/greedy_meta.json").read_text())
    lm = load_model(v / "checkpoint", device=TEST_DEVICE, dtype="float32")
    engine = Engine(lm, EngineConfig(max_rows=2, max_tokens=prompt.shape[1] + 48, prefill_chunk=32))
    result = engine.generate([Request("g", prompt, meta["max_new_tokens"], SamplingParams(temperature=0))])[0]
    assert np.array_equal(result.codes, expected)
    assert result.stop_reason == ("eos" if meta["stopped_on_eos"] else "budget")
    out = tmp_path / "codes.npy"
    proc = run_module(
        "actors.engine",
        "generate",
        "--dtype",
        "float32",
        "--checkpoint",
        str(v / "checkpoint"),
        "--prompt-tokens",
        str(v / "vectors/greedy_prompt.npy"),
        "--max-frames",
        "48",
        "--temperature",
        "0",
        "--out",
        str(out),
    )
    assert proc.returncode == 0, proc.stderr
    assert np.array_equal(np.load(out), expected)


@pytest.mark.parametrize("name", DUALAR_SETS)
def test_prompt_builder_matches_upstream_prompt(name):
    v = vector_set(name)
    prompt = np.load(v / "vectors/greedy_prompt.npy")
    meta = json.loads((v / "vectors/greedy_meta.json").read_text())["prompt_text"]
    lm = load_model(v / "checkpoint", device=TEST_DEVICE, dtype="float32")
    c = lm.config
    semantic = (prompt[0] >= c.semantic_begin_id) & (prompt[0] <= c.semantic_end_id)
    ref_codes = prompt[1:, semantic]
    assert ref_codes.shape[1] == meta["ref_frames"]
    built = PromptBuilder.for_model(lm).build(meta["text"], ref_text=meta["ref_text"], ref_codes=ref_codes)
    assert built.tokens.dtype == np.int64
    assert np.array_equal(built.tokens, prompt)
    # the shared prefix ends after the reference (and the S2 user header), before the text
    assert semantic[: built.prefix_len].sum() == meta["ref_frames"]
    assert not semantic[built.prefix_len :].any()


def test_score_in_float64_agrees_with_float32_vectors():
    v = vector_set("dualar-s2-tiny")
    lm = load_model(v / "checkpoint", device=TEST_DEVICE, dtype="float64")
    slow, fast = lm.model.score(torch.from_numpy(np.load(v / "vectors/score_tokens.npy")).to(lm.device))
    assert slow.dtype == torch.float64
    # upstream's own float64 run differs from its float32 files by up to 1.2e-5
    assert np.abs(slow.cpu().numpy() - np.load(v / "vectors/score_slow_logits.npy")).max() <= 5e-5
    assert np.abs(fast.cpu().numpy() - np.load(v / "vectors/score_fast_logits.npy")).max() <= 5e-5


# bfloat16 keeps 8 significant bits: unit roundoff u = 2^-9. A block rounds its activations to
# bf16 at about 12 places (attention norm, q/k/v, RoPE, scores-to-output, wo, residual, ffn
# norm, w1, w3, silu*w3, w2, residual); embedding and final norm + head add 2. Each rounding
# perturbs the value by at most u of its magnitude, and the logits are linear in those
# perturbations to first order, so |logit error| <= (12 * layers + 2) * u * max|logit|, layers
# being those the logit passed through (slow layers for slow logits, slow + fast for fast ones).
BF16_UNIT_ROUNDOFF = 2.0**-9


@pytest.mark.parametrize("name", DUALAR_SETS)
def test_bfloat16_logits_within_the_rounding_bound(name):
    v = vector_set(name)
    lm = load_model(v / "checkpoint", device=TEST_DEVICE, dtype="bfloat16")
    c = lm.config
    slow, fast = lm.model.score(torch.from_numpy(np.load(v / "vectors/score_tokens.npy")).to(lm.device))
    assert slow.dtype == torch.bfloat16  # weights and activations really ran in bf16
    expected_slow = np.load(v / "vectors/score_slow_logits.npy")
    expected_fast = np.load(v / "vectors/score_fast_logits.npy")[:-1]  # the last column is all zeros
    slow_err = np.abs(slow.float().cpu().numpy() - expected_slow).max()
    fast_err = np.abs(fast.float().cpu().numpy()[:-1] - expected_fast).max()
    slow_bound = (12 * c.n_layer + 2) * BF16_UNIT_ROUNDOFF * np.abs(expected_slow).max()
    fast_bound = (12 * (c.n_layer + c.n_fast_layer) + 2) * BF16_UNIT_ROUNDOFF * np.abs(expected_fast).max()
    assert slow_err <= slow_bound, (slow_err, slow_bound)
    assert fast_err <= fast_bound, (fast_err, fast_bound)
    # and far from float32's agreement: bf16 really is a different precision (guards the test)
    assert slow_err > 1e-3


@pytest.mark.slow
@pytest.mark.parametrize("name", DUALAR_SETS)
def test_greedy_codes_reproduce_with_the_frame_compiled(name):
    """The compiled frame (engine.compile=on: on the CPU its packed linears and attentions as ops
    inductor leaves alone; on a GPU inside the engine's CUDA graphs) gives upstream's greedy
    codes, as the eager frame does."""
    v = vector_set(name)
    prompt = np.load(v / "vectors/greedy_prompt.npy")
    meta = json.loads((v / "vectors/greedy_meta.json").read_text())
    lm = load_model(v / "checkpoint", device=TEST_DEVICE, dtype="float32")
    config = EngineConfig(max_rows=2, max_tokens=prompt.shape[1] + 48, compile="on", cuda_graphs=True)
    engine = Engine(lm, config)
    assert engine.runner.compiled
    result = engine.generate([Request("g", prompt, meta["max_new_tokens"], SamplingParams(temperature=0))])[0]
    assert np.array_equal(result.codes, np.load(v / "vectors/greedy_codes.npy"))
