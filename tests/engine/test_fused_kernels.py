"""The fused kernels (actors/engine/kernels/) against their eager references, run on CPU tensors
in Triton's interpreter (TRITON_INTERPRET=1, set by tests/conftest.py; skipped where Triton is not
installed). float32: within a few ulps (the reductions sum in another order); bfloat16: equal,
where the rounding to bf16 absorbs that order. Then each reference against the eager model's own
ops, so the chain kernel -> reference -> model holds."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from actors.engine.kernels.norm import add_rms_norm_reference, add_rms_norm_triton
from actors.engine.kernels.rope import qk_rope_write_reference, qk_rope_write_triton
from actors.engine.kernels.sampler import (
    sample_code_reference,
    sample_code_triton,
    sample_main_reference,
    sample_main_triton,
)
from actors.engine.kernels.slot_attention import slot_attention_reference, slot_attention_triton
from actors.engine.kernels.swiglu import silu_mul_reference, silu_mul_triton
from actors.engine.kernels.triton_shim import interpreting
from actors.engine.sampling import seed_keys
from actors.modules import RMSNorm, apply_rope, rope_rotation

triton_kernels = pytest.mark.skipif(not interpreting(), reason="Triton is not installed (or TRITON_INTERPRET unset)")
DTYPES = [torch.float32, torch.bfloat16]


def close(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype) -> None:
    """float32: within 4 ulps of the value's size; bfloat16: bit for bit."""
    assert got.dtype == want.dtype and got.shape == want.shape
    if dtype == torch.bfloat16:
        assert torch.equal(got, want)
    else:
        bound = 4 * torch.finfo(torch.float32).eps * want.abs().max().clamp(min=1.0)
        assert (got - want).abs().max() <= bound


@triton_kernels
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_delta", [False, True])
def test_add_rms_norm_kernel_matches_its_reference(dtype, with_delta):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 5, 200, generator=g).to(dtype)
    delta = torch.randn(3, 5, 200, generator=g).to(dtype) if with_delta else None
    weight = (1 + 0.1 * torch.randn(200, generator=g)).to(dtype)
    h_ref, out_ref = add_rms_norm_reference(x, delta, weight, 1e-6)
    h, out = add_rms_norm_triton(x, delta, weight, 1e-6)
    assert torch.equal(h, h_ref)  # the residual add rounds as the eager add does
    close(out, out_ref, dtype)


def test_add_rms_norm_reference_is_the_model_norm():
    g = torch.Generator().manual_seed(1)
    norm = RMSNorm(64, 1e-6)
    norm.weight.data = torch.randn(64, generator=g)
    x, delta = torch.randn(4, 64, generator=g), torch.randn(4, 64, generator=g)
    h, out = add_rms_norm_reference(x, delta, norm.weight, norm.eps)
    assert torch.equal(h, x + delta) and torch.equal(out, norm(x + delta))


@triton_kernels
@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_mul_kernel_matches_its_reference(dtype):
    x = (4 * torch.randn(7, 2 * 300, generator=torch.Generator().manual_seed(2))).to(dtype)
    close(silu_mul_triton(x), silu_mul_reference(x), dtype)


def _qkv_case(dtype, head_dim, qk_norm, seed=3):
    g = torch.Generator().manual_seed(seed)
    h, kv = 4, 2
    qkv = torch.randn(6, (h + 2 * kv) * head_dim, generator=g).to(dtype)
    weights = [(1 + 0.1 * torch.randn(head_dim, generator=g)).to(dtype) for _ in range(2)] if qk_norm else [None, None]
    slots, positions = torch.tensor([0, 0, 1, 2, 2, 2]), torch.tensor([3, 4, 0, 5, 6, 7])
    caches = [torch.zeros(3, kv, 16, head_dim, dtype=dtype) for _ in range(2)]
    return qkv, slots, positions, rope_rotation(16, head_dim, 10000.0), weights, caches, h, kv


@triton_kernels
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("qk_norm", [False, True])
@pytest.mark.parametrize("head_dim", [32, 24])  # 24: the S2 vectors' head size (not a power of two)
def test_qk_rope_write_kernel_matches_its_reference(dtype, qk_norm, head_dim):
    qkv, slots, positions, table, (qw, kw), caches, h, kv = _qkv_case(dtype, head_dim, qk_norm)
    ref_caches = [c.clone() for c in caches]
    q_ref = qk_rope_write_reference(qkv, slots, positions, table, qw, kw, 1e-6, *ref_caches, h, kv)
    q = qk_rope_write_triton(qkv, slots, positions, table, qw, kw, 1e-6, *caches, h, kv)
    close(q, q_ref, dtype)
    close(caches[0], ref_caches[0], dtype)
    assert torch.equal(caches[1], ref_caches[1])  # values are copied as they are


def test_qk_rope_write_reference_is_the_model_attention_prologue():
    """No q/k-norm: the reference's rotation and writes are the eager layer's, bit for bit."""
    qkv, slots, positions, table, _, caches, h, kv = _qkv_case(torch.float32, 32, False)
    q = qk_rope_write_reference(qkv, slots, positions, table, None, None, 0.0, *caches, h, kv)
    heads = qkv.view(6, h + 2 * kv, 32)
    rotated = apply_rope(heads[:, None, : h + kv], table[positions][:, None])[:, 0]
    assert torch.equal(q, rotated[:, :h])
    assert torch.equal(caches[0][slots, :, positions], rotated[:, h:])
    assert torch.equal(caches[1][slots, :, positions], heads[:, h + kv :])


@triton_kernels
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("capacity", [48, 600])  # one key range; four (split and merge)
def test_slot_attention_kernel_matches_its_reference(dtype, capacity):
    g = torch.Generator().manual_seed(4)
    k, v = (torch.randn(3, 2, capacity, 32, generator=g).to(dtype) for _ in range(2))
    q = torch.randn(5, 4, 32, generator=g).to(dtype)
    slots, positions = torch.tensor([0, 1, 1, 2, 0]), torch.tensor([0, 6, capacity - 1, capacity // 2 + 2, 39])
    got, want = slot_attention_triton(q, k, v, slots, positions), slot_attention_reference(q, k, v, slots, positions)
    if dtype == torch.bfloat16:  # float32 sums in another order, then one rounding: within an ulp
        assert ((got.float() - want.float()).abs() <= 2**-7 * want.float().abs().clamp(min=2**-10)).all()
    else:
        close(got, want, dtype)
    # a token's result is its own: alone or among others, bit for bit
    alone = torch.cat(
        [slot_attention_triton(q[i : i + 1], k, v, slots[i : i + 1], positions[i : i + 1]) for i in range(5)]
    )
    assert torch.equal(alone, got)


def test_slot_attention_reference_is_causal_attention_over_the_slot():
    g = torch.Generator().manual_seed(5)
    k, v = (torch.randn(2, 2, 8, 16, generator=g) for _ in range(2))
    q = torch.randn(3, 4, 16, generator=g)
    out = slot_attention_reference(q, k, v, torch.tensor([1, 1, 0]), torch.tensor([2, 7, 0]))
    expected = torch.nn.functional.scaled_dot_product_attention(q[1].view(2, 2, 16), k[1], v[1], enable_gqa=False).view(
        4, 16
    )
    assert torch.allclose(out[1], expected, atol=1e-6)
    assert torch.allclose(out[2], v[0, :, 0].repeat_interleave(2, 0), atol=1e-6)  # one key: its value


def _sampling_rows(b: int, v: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    keys = [seed_keys(7 * i + seed) for i in range(b)]
    return dict(
        temperature=torch.tensor([0.8, 0.0, 1.0, 0.7, 1.3, 0.9])[:b],
        top_p=torch.tensor([0.8, 0.9, 1.0, 0.5, 0.7, 0.95])[:b],
        top_k=torch.tensor([30, 0, 0, 1, 64, 5])[:b],
        penalty=torch.tensor([1.1, 1.0, 1.3, 1.1, 1.2, 2.0])[:b],
        window=torch.tensor([4, 8, 0, 2, 8, 1])[:b],
        history=torch.randint(-1, v, (b, 8), generator=g),
        key1=torch.tensor([a for a, _ in keys]),
        key2=torch.tensor([c for _, c in keys]),
        frame=torch.arange(b) * 3 + seed,
    )


@triton_kernels
@pytest.mark.parametrize(  # bf16 logits tie often: ties rank by id, as the stable sort
    "dtype,penalty",
    [(torch.float32, False), *(pytest.param(d, p, marks=pytest.mark.slow) for d, p in
                               [(torch.bfloat16, True), (torch.float32, True), (torch.bfloat16, False)])],
)  # fmt: skip
def test_sampling_kernels_draw_the_references_ids(dtype, penalty):
    b, v = 6, 96
    for trial in range(2):
        rows = _sampling_rows(b, v, trial)
        logits = (3 * torch.randn(b, v, generator=torch.Generator().manual_seed(10 + trial))).to(dtype)
        order = [rows[k] for k in ("temperature", "top_p", "top_k", "penalty", "window", "history")]
        keys = [rows["key1"], rows["key2"], rows["frame"]]
        code = sample_code_triton(logits, *order, *keys, 3, 90, penalty)
        assert torch.equal(code, sample_code_reference(logits, *order, *keys, 3, 90, penalty))
        assert (code < 90).all()  # the codebook's limit
        ras = [torch.tensor([1.0, 0.9, 1.1, 1.0, 0.7, 1.0]), torch.tensor([0.9, 0.9, 0.95, 1.0, 0.6, 0.9])]
        ras.append(torch.tensor([8, 0, 4, 3, 8, 2]))
        allow = torch.tensor([True, False, True, False, True, True])
        ids = torch.arange(v) * 3 + 100  # candidate token ids; codebook 0 = id - 130, clamped to 0..63
        main_args = (logits, *order[:3], *ras, *order[3:], allow, *keys, 5, penalty, True, ids, 130, 64)
        main, token, code = sample_main_triton(*main_args)
        for got, want in zip((main, token, code), sample_main_reference(*main_args)):
            assert torch.equal(got, want)
        assert torch.equal(token, ids[main]) and torch.equal(code, (token - 130).clamp(0, 63))
        assert not ((main == 5) & ~allow).any()  # no end-of-speech where EOS stopping is off
        # a row's draw is its own: the first three rows alone draw what they drew among six
        part = [t[:3] if isinstance(t, torch.Tensor) and t is not ids else t for t in main_args]
        assert torch.equal(sample_main_triton(*part)[0], main[:3])


def test_sampling_reference_is_the_engines_draw():
    """The reference (every id ranked) picks what decoding.pick_code picks (top-k ranked)."""
    from actors.engine.decoding import BatchFacts, SlotSampling, pick_code
    from actors.engine.types import SamplingParams

    b, v = 4, 64
    slots = SlotSampling(b, 4, 8, 65, v, "cpu")
    for i in range(b):
        slots.admit(i, SamplingParams(temperature=0.9, top_p=0.85, top_k=20, seed=i), True)
    params = [slots.params[i] for i in range(b)]
    state = slots.batch(slice(0, b), facts=BatchFacts.of(params, slots))
    logits = torch.randn(b, v, generator=torch.Generator().manual_seed(6))
    want = pick_code(logits, 2, state, None)
    got = sample_code_reference(
        logits, state.main.temperature, state.main.top_p, state.main.top_k, state.penalty, state.penalty_window,
        state.code_history[:, 2], state.key1, state.key2, state.frame, 3, v, False,
    )  # fmt: skip
    assert torch.equal(got, want)
    assert np.unique(got.numpy()).size > 1  # real draws, not one id everywhere
