"""The decode step as a CUDA graph: what a CPU can prove (the step reads and writes only the
engine's long-lived tensors, asks the host for nothing, keeps its addresses; key buckets; slots
sized from memory), and on a GPU (CHORUS_TEST_DEVICE=cuda, scripts/gpu_check.sh) that graphed
steps are replayed and give the plain step's codes."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from actors.engine import Engine, EngineConfig, Request, SamplingParams
from actors.engine.audit import audit_steps
from actors.engine.cache import SlotKVCache
from actors.engine.graphs import kv_bucket, kv_buckets
from actors.engine.slots import slot_bytes, slot_kv_bytes, slots_that_fit, slow_kv_dtype
from helpers import TEST_DEVICE

CUDA = TEST_DEVICE.startswith("cuda")
SAMPLED = SamplingParams(temperature=0.9, top_p=0.85, top_k=20, ras_window=10, repetition_penalty=1.2)
GREEDY = SamplingParams(temperature=0)


def _rows(lm, n: int, frames: int, sampling=SAMPLED) -> list[Request]:
    rng = np.random.default_rng(3)
    out = []
    for i in range(n):
        prompt = np.zeros((1 + lm.config.num_codebooks, 5 + 3 * i), np.int64)
        prompt[0] = rng.integers(32, 127, prompt.shape[1])
        out.append(Request(f"g{i}", prompt, frames, sampling.with_seed(i), stop_on_eos=False))
    return out


def test_key_buckets_double_from_512_to_the_slot_and_a_batch_reads_the_smallest_that_holds_it():
    assert kv_buckets(3072) == [512, 1024, 2048, 3072]
    assert kv_buckets(4096) == [512, 1024, 2048, 4096]
    assert kv_buckets(300) == [300] and kv_buckets(512) == [512]
    assert kv_buckets(3072, [100, 5000]) == [100, 3072]  # configured ones stay within the slot
    buckets = kv_buckets(3072)
    assert [kv_bucket(n, buckets) for n in (1, 512, 513, 2049, 3072)] == [512, 512, 1024, 3072, 3072]


def test_slots_fit_the_share_of_memory_left_after_what_the_device_already_holds(lm32):
    gib = 2**30
    # 141 GiB card, 9 GiB taken (weights): 85% leaves 141*0.85 - 9 = 110.85 GiB
    assert slots_that_fit(free=132 * gib, total=141 * gib, fraction=0.85, per_slot=gib // 2) == 221
    assert slots_that_fit(free=10 * gib, total=141 * gib, fraction=0.85, per_slot=gib) == 0
    mc = lm32.config
    config = EngineConfig(max_rows=4, max_tokens=256, prefill_chunk=64)
    kv = 256 * mc.slow_kv_bytes_per_token(4) + mc.fast_kv_bytes_per_frame(4)
    assert slot_bytes(mc, config, 4) > kv == slot_kv_bytes(mc, config, 4)  # the K/V and the activations' allowance
    for kv_dtype in ("auto", "fp8"):  # what a slot is counted is what the cache allocates for it
        sized = replace(config, kv_dtype=kv_dtype)
        cache = SlotKVCache(
            mc, 4, 256, torch.device("cpu"), torch.float32, model_id=0, kv_dtype=slow_kv_dtype(sized, torch.float32)
        )
        assert cache.allocated_bytes() == 4 * slot_kv_bytes(mc, sized, 4), kv_dtype
    fp8 = slot_kv_bytes(mc, replace(config, kv_dtype="fp8"), 2)
    assert fp8 == 256 * mc.slow_kv_bytes_per_token(2) // 2 + mc.fast_kv_bytes_per_frame(2)  # half of bf16's slow K/V
    # off the GPU the setting changes nothing: exactly max_rows slots
    engine = Engine(lm32, EngineConfig(max_rows=3, max_tokens=64, memory_fraction=0.5))
    assert engine.config.max_rows == 3 or CUDA
    with pytest.raises(ValueError, match="memory_fraction must lie in"):
        EngineConfig(memory_fraction=1.5).validate()


@pytest.mark.parametrize(
    "static,kernels",
    [(True, "eager"), (False, "eager"), pytest.param(True, "fused", marks=pytest.mark.slow)],
    ids=["static", "dynamic", "fused"],
)
@pytest.mark.parametrize("sampling", [SAMPLED, GREEDY], ids=["sampled", "greedy"])
def test_the_decode_step_reads_and_writes_only_long_lived_tensors_and_never_the_host(lm32, static, kernels, sampling):
    """What a CUDA graph needs of the step, checked op by op on any device: no value read back
    (a capture refuses it), no tensor from outside that the engine does not keep for its whole
    life (a replay would read a stale address), nothing written but the cache, the sampling
    state and the step's buffers, and every registered tensor at the same address after. The
    fused path too (engine.kernels=fused: its ops are one dispatch each, their arguments
    checked like any op's)."""
    config = EngineConfig(max_rows=4, max_tokens=64, static_shapes=static, cpu_packed_linears=False, kernels=kernels)
    engine = Engine(lm32, config)
    for request in _rows(lm32, 3, 6, sampling):
        engine.add(request)
    report = audit_steps(engine, 5)
    assert report["steps_audited"] == 5  # every step decodes once (the first prefills too)
    assert report["capturable"], report
    assert report["host_reads"] == [] and report["foreign_reads"] == report["foreign_writes"] == 0
    assert report["addresses_stable"] and report["static_tensors_read"] > 20


def test_the_audit_catches_a_host_read_and_a_tensor_the_engine_does_not_keep(lm32):
    """The audit can fail: a step that reads a value back, or reads a tensor made outside it
    and not kept by the engine (as a table rebuilt per call would be), is reported."""
    engine = Engine(lm32, EngineConfig(max_rows=2, max_tokens=64, cpu_packed_linears=False))
    runner = engine.runner
    plain = runner._frame
    stray = torch.zeros(1, dtype=torch.int64, device=runner.device)

    def leaky(tokens, *rest):
        int(tokens.sum())  # a host read
        return plain(tokens + stray, *rest)  # an unregistered input

    runner._frame = leaky
    for request in _rows(lm32, 2, 4):
        engine.add(request)
    report = audit_steps(engine, 3)
    assert not report["capturable"]
    assert any("_local_scalar_dense" in op for op in report["host_reads"])
    assert report["foreign_reads"] >= 1 and "unregistered tensor (1,)" in " ".join(report["foreign_examples"])


@pytest.mark.skipif(
    CUDA,
    reason="cuBLAS sums a row by the call's row count (H200, bf16: S2-Pro's linears from 32 rows, "
    "S1-mini's from 129; docs/performance.md): rows exact in any batch is the CPU engine's guarantee",
)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_rows_prefilled_and_decoded_together_get_the_codes_they_get_alone(ckpt, dtype):
    """Prompts of one length are prefilled in one call (12 rows x 40 columns: past the 32 rows
    oneDNN keeps exact, packing.py) and decoded together; each row's codes must be those it gets
    alone."""
    from actors.engine import load_model

    lm = load_model(ckpt, device=TEST_DEVICE, dtype=dtype)
    rng = np.random.default_rng(5)
    rows = []
    for i in range(12):
        prompt = np.zeros((1 + lm.config.num_codebooks, 40), np.int64)
        prompt[0] = rng.integers(32, 127, 40)
        rows.append(Request(f"p{i}", prompt, 8, SAMPLED.with_seed(i), stop_on_eos=False))
    together = Engine(lm, EngineConfig(max_rows=16, max_tokens=64)).generate(rows)
    single = Engine(lm, EngineConfig(max_rows=1, max_tokens=64))
    for row, got in zip(rows, together):
        np.testing.assert_array_equal(got.codes, single.generate([row])[0].codes, err_msg=row.request_id)


@pytest.mark.skipif(not CUDA, reason="CUDA graphs need a GPU (scripts/gpu_check.sh runs this on one)")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_graphed_steps_replay_and_give_the_plain_steps_codes(ckpt, dtype):
    from actors.engine import load_model

    lm = load_model(ckpt, device=TEST_DEVICE, dtype=dtype)
    rows = _rows(lm, 5, 12)
    plain = Engine(lm, EngineConfig(max_rows=8, max_tokens=64, static_shapes=True)).generate(rows)
    engine = Engine(lm, EngineConfig(max_rows=8, max_tokens=64, cuda_graphs=True))
    warm = engine.warm_up(SAMPLED)
    captured = engine.graph_stats()["captures"]
    assert warm > 0 and captured == len(engine.runner.kv_buckets) * 4  # buckets 1, 2, 4, 8
    graphed = engine.generate(rows)
    assert all(np.array_equal(a.codes, b.codes) for a, b in zip(plain, graphed))
    stats = engine.graph_stats()
    assert stats["captures"] == captured  # every shape met was captured at warm-up
    assert stats["replays"] >= 11  # every decode step after the first replays a graph


@pytest.mark.skipif(not CUDA, reason="key buckets serve the GPU's static frame")
def test_a_graphed_batch_reads_the_key_bucket_of_its_longest_row(ckpt):
    from actors.engine import load_model

    lm = load_model(ckpt, device=TEST_DEVICE, dtype="float32")
    engine = Engine(lm, EngineConfig(max_rows=2, max_tokens=700, kv_buckets=[64, 256], cuda_graphs=True))
    assert engine.runner.kv_buckets == [64, 256, 700]
    assert [engine.runner.keys_read(n) for n in (1, 64, 65, 300)] == [64, 64, 256, 700]
    rows = _rows(lm, 2, 80)  # grows past 64 keys into the next bucket
    plain = Engine(lm, EngineConfig(max_rows=2, max_tokens=700, kv_buckets=[64, 256], static_shapes=True))
    assert all(np.array_equal(a.codes, b.codes) for a, b in zip(plain.generate(rows), engine.generate(rows)))
    assert {key[1] for key in engine.runner.graphs.graphs} == {64, 256}
