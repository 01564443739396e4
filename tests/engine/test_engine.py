"""The engine contracts (docs/architecture.md §4), each against a real tiny checkpoint."""

import gc

import numpy as np
import pytest
import torch

from actors.engine import (
    STOP_BUDGET,
    STOP_EOS,
    STOP_ERROR,
    Engine,
    EngineConfig,
    PromptBuilder,
    Request,
    SamplingParams,
    load_model,
    reference_generate,
)
from actors.engine.cache import CacheMismatchError
from helpers import TEST_DEVICE, vector_set

GREEDY = SamplingParams(temperature=0.0)


def prompt_for(lm, text: str, ref_frames: int = 0, seed: int = 0):
    rng = np.random.default_rng(seed)
    builder = PromptBuilder.for_model(lm)
    if ref_frames:
        codes = rng.integers(0, lm.config.codebook_size, (lm.config.num_codebooks, ref_frames))
        return builder.build(text, ref_text="Reference words.", ref_codes=codes)
    return builder.build(text)


TEXTS = [
    "Hello.",
    "A somewhat longer sentence to read aloud, with commas.",
    "Short one",
    "Numbers 1 2 3 4.",
    "Quite a long line of text that makes this prompt much longer than the others in the batch.",
    "Mid length text here.",
    "x",
    "Another row.",
]


def _logit_log():
    log = {}

    def observe(rid, frame, slow, fast):
        log[(rid, frame)] = (slow.clone(), fast.clone())

    return log, observe


@pytest.mark.parametrize("dtype, tol", [("float64", 1e-9), ("float32", 1e-4)])
@pytest.mark.parametrize("ref_frames", [0, 7])
def test_cached_equals_uncached_logits_then_codes(lm64, lm32, dtype, tol, ref_frames):
    lm = lm64 if dtype == "float64" else lm32
    p = prompt_for(lm, TEXTS[1], ref_frames=ref_frames)
    req = Request("row", p.tokens, 12, GREEDY, stop_on_eos=False)
    ref_log = {}
    ref = reference_generate(lm, req, observe=lambda f, s, fa: ref_log.__setitem__(f, (s.clone(), fa.clone())))
    log, observe = _logit_log()
    engine = Engine(lm, EngineConfig(max_rows=3, max_tokens=256, prefill_chunk=5))
    # two other rows share the batch, so the compared row's slot is not slot 0's alone
    others = [Request(f"o{i}", prompt_for(lm, TEXTS[i + 2]).tokens, 9 + i, GREEDY) for i in range(2)]
    result = engine.generate([others[0], req, others[1]], observe=observe)[1]
    assert len(ref_log) == 12
    for frame, (slow, fast) in ref_log.items():
        got_slow, got_fast = log[("row", frame)]
        assert (got_slow - slow).abs().max() <= tol, frame
        assert (got_fast - fast).abs().max() <= tol, frame
    assert np.array_equal(result.codes, ref.codes) and result.frames == 12


@pytest.mark.parametrize("chunk", [pytest.param(1, marks=pytest.mark.slow), 3, 16, 1000])  # 1: ~20 s
def test_chunked_prefill_equals_one_shot(lm64, lm32, chunk):
    for lm, tol in ((lm64, 1e-9), (lm32, 1e-4)):
        p = prompt_for(lm, TEXTS[4], ref_frames=5)
        req = Request("r", p.tokens, 4, GREEDY, stop_on_eos=False)
        logs = []
        for c in (chunk, 100000):
            log, observe = _logit_log()
            Engine(lm, EngineConfig(max_rows=1, max_tokens=256, prefill_chunk=c)).generate([req], observe=observe)
            logs.append(log)
        for key in logs[0]:
            assert (logs[0][key][0] - logs[1][key][0]).abs().max() <= tol
            assert (logs[0][key][1] - logs[1][key][1]).abs().max() <= tol


def test_positions_are_global_and_prompt_is_fed_once(lm32):
    """Contract 1 + 9: chunk i after t cached tokens uses positions t..t+r-1; the step log
    shows each prompt column fed exactly once and one column per decode step."""
    engine = Engine(lm32, EngineConfig(max_rows=2, max_tokens=256, prefill_chunk=7, record_steps=True))
    reqs = [Request(f"r{i}", prompt_for(lm32, TEXTS[i]).tokens, 5, GREEDY, stop_on_eos=False) for i in range(3)]
    engine.generate(reqs)
    prefill = [s for s in engine.steps if s.kind == "prefill"]
    fed = sum(s.input_len for s in prefill)
    # prefill writes every prompt column but the last; the row's first decode frame feeds it
    assert fed == sum(r.prompt.shape[1] - 1 for r in reqs)
    for s in engine.steps:
        assert all(after - before == s.input_len for before, after in zip(s.cache_before, s.cache_after))
    # every prefill chunk starts where the slot's cache ended
    for s in prefill:
        assert s.cache_before[0] % 7 == 0
    decode = [s for s in engine.steps if s.kind == "decode"]
    assert all(s.input_len == 1 for s in decode)
    # 5 frames per row, one decode step each: the first feeds the prompt's last column, the
    # others the frame sampled before (the fifth frame is never fed: the row stops)
    assert sum(len(s.slots) for s in decode) == 3 * 5
    first_decode = next(i for i, s in enumerate(engine.steps) if s.kind == "decode")
    assert engine.steps[first_decode].cache_before == tuple(r.prompt.shape[1] - 1 for r in reqs[:2])


def test_window_overflow_is_a_per_request_error(lm32):
    engine = Engine(lm32, EngineConfig(max_rows=2, max_tokens=128))
    ok = Request("ok", prompt_for(lm32, "Hi.").tokens, 5, GREEDY)
    long = Request("long", prompt_for(lm32, "word " * 12).tokens, 10, GREEDY)
    results = engine.generate([long, ok])
    assert results[0].stop_reason == STOP_ERROR and "exceeds the per-row budget" in results[0].error
    assert "no sliding window" in results[0].error and results[0].frames == 0
    assert results[1].ok and results[1].frames > 0
    # the model context bounds too, not only the engine's capacity
    big = Engine(lm32, EngineConfig(max_rows=1, max_tokens=4096))
    r = big.generate([Request("ctx", prompt_for(lm32, "Hi.").tokens, 600, GREEDY)])[0]
    assert r.stop_reason == STOP_ERROR and "max_seq_len 512" in r.error


def test_bad_requests_error_without_killing_the_batch(lm32):
    engine = Engine(lm32, EngineConfig(max_rows=2, max_tokens=128))
    good = prompt_for(lm32, "Fine.").tokens
    bad_codes = good.copy()
    bad_codes[1, 0] = 10_000
    reqs = [
        Request("shape", good[:2], 3, GREEDY),
        Request("codes", bad_codes, 3, GREEDY),
        Request("neg", good, -1, GREEDY),
        Request("samp", good, 3, SamplingParams(top_p=0.0)),
        Request("good", good, 3, GREEDY),
    ]
    res = engine.generate(reqs)
    assert [r.stop_reason for r in res] == [STOP_ERROR] * 4 + [STOP_BUDGET]
    assert "shape" in res[0].error and "codes must lie" in res[1].error
    assert "max_frames" in res[2].error and "top_p" in res[3].error


@pytest.mark.slow  # ~30 s: every stop rule through full generations
def test_stop_semantics(lm32, ckpt):
    engine = Engine(lm32, EngineConfig(max_rows=4, max_tokens=256))
    p = prompt_for(lm32, TEXTS[0]).tokens
    zero, budget = engine.generate([Request("z", p, 0, GREEDY), Request("b", p, 6, GREEDY, stop_on_eos=False)])
    assert zero.stop_reason == STOP_BUDGET and zero.frames == 0 and zero.codes.shape == (4, 0)
    assert budget.stop_reason == STOP_BUDGET and budget.frames == 6
    # find a seed whose sampled run ends on <|im_end|>, then check EOS-off runs the budget
    hot = SamplingParams(temperature=1.5, top_p=1.0, top_k=0)
    runs = engine.generate([Request(f"s{s}", p, 40, hot.with_seed(s)) for s in range(24)])
    eos = [r for r in runs if r.stop_reason == STOP_EOS]
    assert eos, "no row sampled <|im_end|> in 24 seeds"
    seed = int(eos[0].request_id[1:])
    off = engine.generate([Request("off", p, 40, hot.with_seed(seed), stop_on_eos=False)])[0]
    assert off.stop_reason == STOP_BUDGET and off.frames == 40
    # rows that ran past the eos row in the same batch were not stopped by it
    assert any(r.frames > eos[0].frames for r in runs)


def test_row_output_is_independent_of_batch_and_slot(lm64):
    """Contract 7 in float64: bit-identical codes alone, with 1 or 15 other rows of different
    lengths, entering first or through a freed slot."""
    sampling = SamplingParams(temperature=0.9, top_p=0.9, top_k=20, ras_window=10)
    target = Request(
        "target",
        prompt_for(lm64, TEXTS[1], ref_frames=6, seed=1).tokens,
        14,
        sampling.with_seed(1234),
        stop_on_eos=False,
    )
    others = [
        Request(
            f"o{i}",
            prompt_for(lm64, TEXTS[i % len(TEXTS)], ref_frames=i % 3, seed=i).tokens,
            3 + (i * 5) % 17,
            sampling.with_seed(i),
        )
        for i in range(15)
    ]
    alone = Engine(lm64, EngineConfig(max_rows=1, max_tokens=256)).generate([target])[0].codes
    with_one = Engine(lm64, EngineConfig(max_rows=2, max_tokens=256)).generate([others[0], target])[1].codes
    with_all = Engine(lm64, EngineConfig(max_rows=16, max_tokens=256)).generate([target] + others)[0].codes
    # 4 slots for 16 rows: the target waits and enters through a slot freed by a finished row
    late_engine = Engine(lm64, EngineConfig(max_rows=4, max_tokens=256, record_steps=True))
    late = late_engine.generate(others + [target])[-1].codes
    first_prefill = next(
        i
        for i, s in enumerate(late_engine.steps)
        if s.kind == "prefill" and s.cache_before == (0,) and i > 0 and late_engine.steps[i - 1].kind == "decode"
    )
    assert first_prefill > 0  # admissions did happen after decoding started
    # rows that outlive others are moved down: every decode step reads slots 0..n-1 (a view)
    decode_slots = [s.slots for s in late_engine.steps if s.kind == "decode"]
    assert all(slots == tuple(range(len(slots))) for slots in decode_slots)
    assert any(len(slots) < 4 for slots in decode_slots[:-1])  # rows did stop while others ran on
    assert alone.shape == (4, 14)
    for other in (with_one, with_all, late):
        assert np.array_equal(alone, other)
    # and the uncached reference agrees too
    assert np.array_equal(alone, reference_generate(lm64, target).codes)


def test_same_seed_same_codes_float32_across_batch_sizes(lm32):
    sampling = SamplingParams(temperature=0.8, top_p=0.8, top_k=30, ras_window=10)
    reqs = [
        Request(f"r{i}", prompt_for(lm32, TEXTS[i]).tokens, 10, sampling.with_seed(100 + i), stop_on_eos=False)
        for i in range(6)
    ]
    a = Engine(lm32, EngineConfig(max_rows=6, max_tokens=200)).generate(reqs)
    b = Engine(lm32, EngineConfig(max_rows=2, max_tokens=200)).generate(list(reversed(reqs)))[::-1]
    for x, y in zip(a, b):
        assert np.array_equal(x.codes, y.codes)
    # different seeds give different streams
    assert not np.array_equal(
        a[0].codes,
        Engine(lm32, EngineConfig(max_rows=1, max_tokens=200))
        .generate([Request("r0", reqs[0].prompt, 10, sampling.with_seed(7), stop_on_eos=False)])[0]
        .codes,
    )


def test_prefix_reuse_gives_identical_results(lm32):
    sampling = SamplingParams(temperature=0.8, seed=0)
    builder = PromptBuilder.for_model(lm32)
    codes = np.random.default_rng(5).integers(0, 64, (4, 9))
    reqs = []
    for i, text in enumerate(TEXTS[:6]):
        p = builder.build(text, ref_text="Same voice.", ref_codes=codes)
        reqs.append(
            Request(
                f"r{i}",
                p.tokens,
                8,
                sampling.with_seed(i),
                stop_on_eos=False,
                prefix_key="voice-a",
                prefix_len=p.prefix_len,
            )
        )
    engine = Engine(lm32, EngineConfig(max_rows=2, max_tokens=256, prefill_chunk=16))
    reused = engine.generate(reqs)
    assert engine.prefixes.hits == 5 and engine.prefixes.misses == 1
    assert [r.prefix_reused_tokens for r in reused] == [0] + [reqs[0].prefix_len] * 5
    plain = Engine(lm32, EngineConfig(max_rows=2, max_tokens=256, prefill_chunk=16, prefix_cache_entries=0))
    fresh = plain.generate(reqs)
    for a, b in zip(reused, fresh):
        assert np.array_equal(a.codes, b.codes)
    # a key reused for a different prefix is detected, never served stale K/V
    other = builder.build(TEXTS[0], ref_text="Other voice.", ref_codes=codes[:, :5])
    clash = Request(
        "clash", other.tokens, 8, sampling, stop_on_eos=False, prefix_key="voice-a", prefix_len=other.prefix_len
    )
    got = engine.generate([clash])[0]
    assert got.prefix_reused_tokens == 0
    assert np.array_equal(got.codes, plain.generate([clash])[0].codes)


@pytest.mark.slow  # > 7 s: the everyday subset stays under 5 minutes
def test_kv_memory_matches_formula_and_does_not_grow(lm32):
    c = lm32.config
    engine = Engine(lm32, EngineConfig(max_rows=3, max_tokens=160, prefix_cache_entries=2))
    kv = engine.kv_bytes()
    assert kv["slow"] == 2 * c.n_layer * 3 * 160 * c.n_local_heads * c.head_dim * 4
    assert kv["fast"] == 2 * c.n_fast_layer * 3 * c.num_codebooks * c.fast_n_local_heads * c.fast_head_dim * 4
    assert engine.cache.allocated_bytes() == kv["total"]
    pointers = [layer.k.data_ptr() for layer in engine.cache.slow + engine.cache.fast]
    builder = PromptBuilder.for_model(lm32)
    reqs = []
    for i in range(1000):
        p = builder.build(f"row {i}", ref_text="v", ref_codes=np.full((4, 2), i % 7))
        reqs.append(
            Request(
                f"r{i}", p.tokens, 1 + i % 3, SamplingParams(seed=i), prefix_key=f"k{i % 7}", prefix_len=p.prefix_len
            )
        )
    results = engine.generate(reqs)
    assert all(r.ok for r in results) and len(results) == 1000
    assert [layer.k.data_ptr() for layer in engine.cache.slow + engine.cache.fast] == pointers
    assert engine.cache.allocated_bytes() == kv["total"]
    assert len(engine.prefixes) <= 2 and engine.cache.free_slots() == 3


def test_cache_refuses_another_model_or_dtype(lm32, lm64):
    engine = Engine(lm32, EngineConfig(max_rows=1, max_tokens=32))
    with pytest.raises(CacheMismatchError):
        engine.cache.check_compatible(id(lm64.model), lm64.device, lm64.dtype)
    with pytest.raises(CacheMismatchError, match="float32"):
        engine.cache.check_compatible(id(lm32.model), lm32.device, torch.float64)


def test_static_shapes_mode_matches_dynamic(lm32):
    reqs = [
        Request(f"r{i}", prompt_for(lm32, TEXTS[i]).tokens, 6 + i, SamplingParams(seed=i), stop_on_eos=False)
        for i in range(5)
    ]
    dyn = Engine(lm32, EngineConfig(max_rows=3, max_tokens=128)).generate(reqs)
    stat = Engine(lm32, EngineConfig(max_rows=3, max_tokens=128, static_shapes=True)).generate(reqs)
    for a, b in zip(dyn, stat):
        assert np.array_equal(a.codes, b.codes)


def test_codebook_limits_bound_sampled_codes(lm32):
    p = prompt_for(lm32, TEXTS[2]).tokens
    hot = SamplingParams(temperature=2.0, top_p=1.0, top_k=0, seed=3)
    engine = Engine(lm32, EngineConfig(max_rows=1, max_tokens=128, codebook_limits=(64, 8, 8, 8)))
    codes = engine.generate([Request("r", p, 30, hot, stop_on_eos=False)])[0].codes
    assert codes[1:].max() < 8 and codes[0].max() >= 8


def test_s1_vectors_greedy_in_float64_too():
    v = vector_set("dualar-s1-tiny")
    lm = load_model(v / "checkpoint", device=TEST_DEVICE, dtype="float64")
    prompt = np.load(v / "vectors/greedy_prompt.npy")
    r = Engine(lm, EngineConfig(max_rows=1, max_tokens=128)).generate([Request("g", prompt, 48, GREEDY)])[0]
    assert np.array_equal(r.codes, np.load(v / "vectors/greedy_codes.npy"))
    del lm
    gc.collect()
