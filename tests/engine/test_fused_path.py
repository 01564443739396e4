"""The engine on the fused path (engine.kernels=fused: actors/engine/kernels/), on the CPU: the
upstream float32 vectors' greedy codes exactly (through the kernels' references, and through the
Triton kernels themselves in Triton's interpreter), rows independent of their batch-mates with
prefill packed across widths, and the decode step's kernel count against its documented budget."""

from __future__ import annotations

import json

import numpy as np
import pytest

from actors.engine import Engine, EngineConfig, Request, SamplingParams, load_model
from actors.engine.kernels.counting import STEP_KERNEL_BUDGET, count_step_kernels, counting_model
from actors.engine.kernels.triton_shim import interpreting, triton_on_cpu
from actors.engine.types import upstream_sampling
from helpers import DUALAR_SETS, vector_set


def _greedy_vectors(name: str, kernels: str):
    root = vector_set(name)
    lm = load_model(root / "checkpoint", device="cpu", dtype="float32")
    prompt = np.load(root / "vectors/greedy_prompt.npy")
    budget = json.loads((root / "vectors/greedy_meta.json").read_text())["max_new_tokens"]
    engine = Engine(lm, EngineConfig(max_rows=1, max_tokens=prompt.shape[1] + budget, kernels=kernels))
    assert engine.runner.fused
    result = engine.generate([Request("v", prompt, budget, SamplingParams(temperature=0))])[0]
    return result.codes, np.load(root / "vectors/greedy_codes.npy")


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if "s2" in n else n for n in DUALAR_SETS])
def test_fused_path_reproduces_the_upstream_greedy_codes(name):
    codes, expected = _greedy_vectors(name, "fused")
    assert np.array_equal(codes, expected)


@pytest.mark.slow
@pytest.mark.skipif(not interpreting(), reason="Triton is not installed (or TRITON_INTERPRET unset)")
@pytest.mark.parametrize("name", DUALAR_SETS)
def test_triton_kernels_reproduce_the_upstream_greedy_codes(name):
    """Every fused op runs its Triton kernel (interpreted on the CPU): ~1-3 min a set."""
    with triton_on_cpu():
        codes, expected = _greedy_vectors(name, "fused")
    assert np.array_equal(codes, expected)


def _rows(lm, widths):
    sampling = upstream_sampling(lm.config.family)
    out = []
    for i, width in enumerate(widths):
        prompt = np.zeros((1 + lm.config.num_codebooks, width), np.int64)
        prompt[0] = (np.arange(width) * 7 + i) % 90 + 32
        out.append(Request(f"r{i}", prompt, 6, sampling.with_seed(i), stop_on_eos=False))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_fused_rows_do_not_depend_on_their_batch(ckpt, dtype):
    """Rows of four widths prefilled in one packed call and decoded together get the codes each
    gets alone (sampled: every draw goes through the sampling kernels' references)."""
    lm = load_model(ckpt, device="cpu", dtype=dtype)
    requests = _rows(lm, [5, 17, 9, 30])
    together = Engine(lm, EngineConfig(max_rows=4, max_tokens=64, kernels="fused", prefill_chunk=16))
    got = together.generate(requests)
    assert together.runner.packed.calls >= 2  # packed rounds of mixed widths (16 + 1 + 9 + 16, ...)
    single = Engine(lm, EngineConfig(max_rows=1, max_tokens=64, kernels="fused", prefill_chunk=16))
    for request, result in zip(requests, got):
        assert np.array_equal(single.generate([request])[0].codes, result.codes)
    assert len({r.codes.tobytes() for r in got}) == len(got)


@pytest.mark.parametrize(
    "shape", [s if s == "s1-mini" else pytest.param(s, marks=pytest.mark.slow) for s in STEP_KERNEL_BUDGET]
)
def test_decode_step_kernel_count_within_budget(shape):
    """The fused decode step of the real layer and codebook counts (tiny widths: the count does not
    depend on them) launches at most the documented number of kernels (docs/engine.md)."""
    lm = counting_model(shape)
    engine = Engine(lm, EngineConfig(max_rows=4, max_tokens=1024, kernels="fused"))
    for request in _rows(lm, [6, 6, 6, 6]):
        engine.add(request)
    engine.step()  # prefill and the first frame
    counted = count_step_kernels(engine)
    assert counted["kernels"] <= STEP_KERNEL_BUDGET[shape], counted["by_op"]
    assert counted["by_op"]["chorus::slot_attention"] > 0


@pytest.mark.slow
def test_the_eager_engine_runs_none_of_the_fused_ops():
    """engine.kernels=eager (the default) keeps the model's own modules: no chorus:: fused op in
    its step, and the step launches well over twice the fused one's kernels."""
    lm = counting_model("s1-mini")
    counts = {}
    for kernels in ("eager", "fused"):
        engine = Engine(lm, EngineConfig(max_rows=2, max_tokens=256, kernels=kernels))
        for request in _rows(lm, [6, 6]):
            engine.add(request)
        engine.step()
        counts[kernels] = count_step_kernels(engine)
    eager_ops = counts["eager"]["by_op"]
    assert not any(
        op.startswith("chorus::") and op not in ("chorus::attend_visible", "chorus::attend_reached") for op in eager_ops
    )
    assert counts["eager"]["kernels"] > 2 * counts["fused"]["kernels"]
