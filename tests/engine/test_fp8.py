"""The FP8 options (actors/engine/kernels/fp8.py): the quantization's error bound, the W8A8
product's, and the logits of an engine with an FP8 K/V cache or FP8 products against the same
engine without, on the upstream vector models (float32, the fused path's references on the CPU).

Stated bounds (docs/engine.md, "Lower precision"): an e4m3 value is within 2^-4 of its input
(relative; 3 mantissa bits, saturated at 448); the first frame's slow logits, whose inputs are
the same prompt, within 8% of the largest logit with FP8 K/V and within 25% with W8A8 products (measured: 6.3% and
20.5% on the S1 set, 3.2% and 15.5% on the S2 set).
The vector models are tiny and random: their greedy decisions are ~0.02 apart, so either option
changes their codes within a few frames; greedy agreement on real weights is the GPU check's
A/B (scripts/gpu_check.py, step fp8)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from actors.engine import Engine, EngineConfig, Request, SamplingParams, load_model
from actors.engine.kernels.fp8 import FP8, FP8_MAX, Fp8Linear, dequantize, quantize_rows, to_fp8
from actors.engine.kernels.rope import qk_rope_write_reference, qk_rope_write_triton
from actors.engine.kernels.triton_shim import interpreting
from actors.modules import rope_rotation
from helpers import vector_set


def test_fp8_rows_round_within_their_bound():
    x = torch.randn(64, 256, generator=torch.Generator().manual_seed(0)) * torch.logspace(-3, 3, 64).unsqueeze(1)
    values, scale = quantize_rows(x)
    assert values.dtype == FP8 and scale.shape == (64, 1)
    back = dequantize(values, scale)
    smallest = scale * 2.0**-9  # e4m3's subnormal step, scaled
    assert ((back - x).abs() <= 2.0**-4 * x.abs() + smallest).all()
    assert torch.equal(to_fp8(torch.tensor([1e4, -1e4])).float(), torch.tensor([FP8_MAX, -FP8_MAX]))


def test_fp8_linear_within_its_bound():
    g = torch.Generator().manual_seed(1)
    linear = torch.nn.Linear(256, 96, bias=False)
    linear.weight.data = torch.randn(96, 256, generator=g) * 0.05
    x = torch.randn(8, 3, 256, generator=g)
    want, got = linear(x), Fp8Linear(linear)(x)
    assert got.shape == want.shape and got.dtype == want.dtype
    assert (got - want).norm() <= 0.06 * want.norm()


def _first_frame_logits(name: str, **extra) -> tuple[torch.Tensor, Engine]:
    root = vector_set(name)
    lm = load_model(root / "checkpoint", device="cpu", dtype="float32")
    prompt = np.load(root / "vectors/greedy_prompt.npy")
    budget = json.loads((root / "vectors/greedy_meta.json").read_text())["max_new_tokens"]
    engine = Engine(lm, EngineConfig(max_rows=1, max_tokens=prompt.shape[1] + budget, kernels="fused", **extra))
    seen = []
    engine.generate([Request("v", prompt, 2, SamplingParams(temperature=0))], observe=lambda *a: seen.append(a[2]))
    return seen[0].float(), engine


@pytest.mark.parametrize("name", ["dualar-s1-tiny", "dualar-s2-tiny"])
def test_fp8_options_keep_the_first_frame_logits_within_their_bounds(name):
    base, _ = _first_frame_logits(name)
    kv, engine = _first_frame_logits(name, kv_dtype="fp8")
    assert engine.cache.slow[0].k.dtype == FP8
    assert engine.kv_bytes()["slow"] * 4 == _first_frame_logits(name)[1].kv_bytes()["slow"]  # a quarter of f32
    assert 0 < (kv - base).abs().max() <= 0.08 * base.abs().max()
    w8, _ = _first_frame_logits(name, fp8_weights=True)
    assert 0 < (w8 - base).abs().max() <= 0.25 * base.abs().max()


def test_fp8_kv_needs_the_fused_path():
    with pytest.raises(ValueError, match="kv_dtype=fp8"):
        EngineConfig(kv_dtype="fp8").validate()


@pytest.mark.skipif(not interpreting(), reason="Triton is not installed (or TRITON_INTERPRET unset)")
def test_fp8_kv_write_kernel_matches_its_reference():
    g = torch.Generator().manual_seed(2)
    qkv = torch.randn(4, 8 * 32, generator=g) * 4
    slots, positions, table = torch.tensor([0, 1, 1, 0]), torch.tensor([0, 2, 3, 5]), rope_rotation(8, 32, 1e4)
    caches = [[torch.zeros(2, 2, 8, 32, dtype=FP8) for _ in range(2)] for _ in range(2)]
    qk_rope_write_reference(qkv, slots, positions, table, None, None, 0.0, *caches[0], 4, 2)
    qk_rope_write_triton(qkv, slots, positions, table, None, None, 0.0, *caches[1], 4, 2)
    for want, got in zip(*caches):  # the kernel rounds to e4m3 itself: torch's cast, bit for bit
        assert torch.equal(got.float(), want.float())
