"""The GPU decode path on a CPU: the fused Triton kernel (actors/codec/triton_conv.py) in
Triton's interpreter against the eager layers, layer by layer and as a whole decoder (float32
to float rounding; bfloat16 within the bound the eager bf16 decode keeps), the upstream vector
through it, the batch cap's memory arithmetic, the backend choice, and the real decoder's
every kernel compiled for an H100/H200 (sm_90) without a GPU (slow)."""

from __future__ import annotations

import math
import os
import weakref

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from actors.codec import device as device_decode
from actors.codec import fused, load_codec, triton_conv
from actors.codec.config import CodecConfig
from actors.codec.gpu_bench import decoder_conv_flops
from actors.codec.model import DEFAULT_MAX_BATCH_SAMPLES
from actors.codec.tiny import random_codec
from helpers import VECTORS

pytest.importorskip("triton")

# float32: the kernel sums taps and channels in another order than oneDNN: a few float steps of
# the layer's largest value (as tests/codec/test_kernels.py's C++ kernel)
LAYER_RTOL = 2e-6
# the eager decode in bfloat16 against float32 on these random weights measured 0.020 (tiny
# codec, 23 frames); docs/engine.md states ~0.03 for bf16 audio against a float32 decode
BF16_AUDIO_ATOL = 0.03


@pytest.fixture(scope="module", autouse=True)
def interpreted():
    """The kernel runs in Triton's interpreter here (read at its first use in this mode)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TRITON_INTERPRET", "1")
        yield


def snake(x: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
    a = alpha.view(1, -1, 1)
    return x + torch.sin(a * x) ** 2 / (a + 1e-9)


def assert_layer_close(got: torch.Tensor, expected: torch.Tensor) -> None:
    scale = float(expected.abs().max())
    assert scale > 0.1
    torch.testing.assert_close(got, expected, rtol=0, atol=LAYER_RTOL * scale)


def _randn(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


SMALL_TILES = triton_conv.Tiles(block_co=16, block_t=16, block_ci=16)  # many programs in every direction


@pytest.mark.parametrize(
    "dilation, tiles",
    [(1, None), (3, None), (9, None), pytest.param(9, SMALL_TILES, marks=pytest.mark.slow)],
    ids=["1", "3", "9", "9-small-tiles"],
)
def test_a_causal_conv_with_its_snakes_and_residual_equals_the_eager_layers(dilation, tiles):
    channels_in, channels_out, length = 24, 40, 75  # not multiples of the blocks: masks at every edge
    conv = torch.nn.Conv1d(channels_in, channels_out, 7, dilation=dilation)
    x, residual = _randn(2, channels_in, length, seed=1), _randn(2, channels_out, length, seed=2)
    alpha_in, alpha_out = 0.5 + torch.rand(channels_in), 0.5 + torch.rand(channels_out)
    with torch.no_grad():
        expected = conv(F.pad(snake(x, alpha_in), (6 * dilation, 0))) + residual
        packed = triton_conv.pack_conv(conv, torch.float32)
        y, s = triton_conv.causal_conv(x, packed, in_snake=triton_conv.SnakeParams.of(alpha_in), residual=residual,
                                       out_snake=triton_conv.SnakeParams.of(alpha_out), tiles=tiles)  # fmt: skip
        in_place = residual.clone()
        triton_conv.causal_conv(x, packed, in_snake=triton_conv.SnakeParams.of(alpha_in), residual=in_place,
                                out=in_place, tiles=tiles)  # fmt: skip
        tanh, _ = triton_conv.causal_conv(x, packed, tanh=True, tiles=tiles)
    assert_layer_close(y, expected)
    assert_layer_close(s, snake(expected, alpha_out))
    assert torch.equal(in_place, y), "written over its residual, the layer gives the same numbers"
    with torch.no_grad():
        plain = conv(F.pad(x, (6 * dilation, 0)))
    torch.testing.assert_close(tanh, torch.tanh(plain), rtol=0, atol=2e-6)


@pytest.mark.parametrize("stride", [2, 4, 8])
def test_a_transposed_conv_is_two_causal_taps_over_packed_channels(stride):
    conv = torch.nn.ConvTranspose1d(20, 12, 2 * stride, stride=stride)
    x, alpha = _randn(3, 20, 19, seed=stride), 0.5 + torch.rand(20)
    with torch.no_grad():
        expected = conv(snake(x, alpha))[..., : 19 * stride]  # upstream trims the last k - s samples
        packed = triton_conv.pack_transposed(conv, torch.float32)
        for tiles in (None, SMALL_TILES):
            y, _ = triton_conv.causal_conv(x, packed, in_snake=triton_conv.SnakeParams.of(alpha), tiles=tiles)
            assert y.shape == (3, 12, 19 * stride)
            assert_layer_close(y, expected)


def test_bfloat16_layers_round_like_a_gpu_and_stay_within_bf16_of_float32():
    conv = torch.nn.Conv1d(32, 32, 7, dilation=3)
    x, alpha = _randn(2, 32, 200, seed=4), 0.5 + torch.rand(32)
    with torch.no_grad():
        expected = conv(F.pad(snake(x, alpha), (18, 0)))
        packed = triton_conv.pack_conv(conv, torch.bfloat16)
        y, s = triton_conv.causal_conv(x.bfloat16(), packed, out_snake=triton_conv.SnakeParams.of(alpha))
        plain, _ = triton_conv.causal_conv(x.bfloat16(), packed)
    assert y is None or y.dtype == torch.bfloat16
    # every output is the float32 sum of bf16 products, rounded once to nearest even
    with torch.no_grad():
        wide = F.conv1d(F.pad(x.bfloat16().float(), (18, 0)), packed.weight.float().permute(1, 2, 0), conv.bias,
                        dilation=3)  # fmt: skip
    torch.testing.assert_close(plain.float(), wide.bfloat16().float(), rtol=0, atol=float(wide.abs().max()) * 2**-8)
    error = (plain.float() - conv(F.pad(x, (18, 0))).detach()).abs().max()
    assert 0 < float(error) < 0.05 * float(expected.abs().max())
    assert s.dtype == torch.bfloat16


def _codes(codec, rows: int, frames: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.cat([torch.randint(0, size, (rows, 1, frames), generator=generator) for size in codec.codebook_sizes],
                     dim=1)  # fmt: skip


@pytest.fixture(scope="module")
def codes_and_reference():
    config = CodecConfig.tiny()
    reference = random_codec(config, seed=3)
    codes = _codes(reference, 2, 3, seed=8)
    return config, codes, reference.decode(codes)


@pytest.mark.parametrize("backend", ["triton", "triton-prologue"])
def test_the_fused_decoder_equals_the_eager_one_in_float32(codes_and_reference, backend):
    config, codes, expected = codes_and_reference
    codec = random_codec(config, seed=3)
    path = codec.configure_decode(backend)
    assert path.backend == backend and path.graphs is None
    got = codec.decode(codes)
    assert got.shape == expected.shape and float(expected.abs().max()) > 0.05
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)


def test_a_long_row_decodes_through_the_fused_kernel_in_pieces(codes_and_reference):
    config, codes, expected = codes_and_reference  # 3 frames
    codec = random_codec(config, seed=3)
    codec.configure_decode("triton")
    two_frames = 2 * codec.frame_length  # under the decoder's reach: pieces of twice the reach
    (row,) = codec.decode_batch([codes[0].numpy()], max_batch_samples=two_frames)
    torch.testing.assert_close(torch.from_numpy(row), expected[0, 0], rtol=0, atol=1e-5)
    long_row = _codes(codec, 1, 9, seed=4)  # 36 latent steps: two pieces of up to 20 new steps
    (pieces,) = codec.decode_batch([long_row[0].numpy()], max_batch_samples=two_frames)
    torch.testing.assert_close(torch.from_numpy(pieces), random_codec(config, seed=3).decode(long_row)[0, 0],
                               rtol=0, atol=1e-5)  # fmt: skip


def test_the_fused_decoder_in_bfloat16_stays_within_the_eager_bf16_bound(codes_and_reference):
    config, codes, expected = codes_and_reference
    codec = random_codec(config, seed=3, dtype=torch.bfloat16)
    eager = codec.decode(codes).float()
    codec.configure_decode("triton")
    fused_audio = codec.decode(codes).float()
    assert fused_audio.shape == expected.shape
    eager_error, fused_error = (eager - expected).abs().max(), (fused_audio - expected).abs().max()
    assert 0 < float(fused_error) < BF16_AUDIO_ATOL, (float(fused_error), float(eager_error))
    assert float(fused_error) < 1.5 * float(eager_error) + 2e-3


@pytest.mark.slow  # 22 frames in the interpreter: ~10 s
def test_the_upstream_vector_decodes_through_the_fused_kernel_within_its_tolerance():
    tiny = VECTORS / "codec-tiny"
    codec = load_codec(tiny)
    codec.configure_decode("triton")
    audio = codec.decode(torch.from_numpy(np.load(tiny / "a_encode_indices.npy")))
    expected = np.load(tiny / "b_from_indices_audio.npy")
    assert audio.shape == expected.shape
    assert float(np.abs(audio.numpy() - expected).max()) <= 1e-4  # test_codec.py's ATOL for float32


@pytest.mark.parametrize(
    "placement, backend",
    [("epilogue", "triton"), pytest.param("prologue", "triton-prologue", marks=pytest.mark.slow)],
)
def test_the_live_activations_of_a_fused_decode_stay_within_the_computed_count(monkeypatch, placement, backend):
    """Every tensor the fused path allocates, tracked while alive: its peak per output sample is
    at most decode_values_per_sample (+ the audio), the cap's arithmetic, and close to it."""
    config = CodecConfig.tiny()
    codec = random_codec(config, seed=3)
    live, peak = [0], [0]
    allocate = triton_conv.causal_conv

    def release(count: int) -> None:
        live[0] -= count

    def tracked(x, conv, **kwargs):
        outputs = allocate(x, conv, **kwargs)
        for tensor, given in zip(outputs, (kwargs.get("out"), kwargs.get("snake_out"))):
            if tensor is not None and given is None:  # a new tensor (a given one is counted already)
                live[0] += tensor.numel()
                weakref.finalize(tensor, release, tensor.numel())
        peak[0] = max(peak[0], live[0])
        return outputs

    monkeypatch.setattr(fused, "causal_conv", tracked)
    codec.configure_decode(backend)
    with torch.inference_mode():
        codec.device_decode.fused(codec.quantizer.decode(_codes(codec, 2, 3, seed=1)))
    per_sample = peak[0] / (2 * 3 * codec.frame_length)
    counted = fused.decode_values_per_sample(config, placement) + 1  # + the audio
    assert 0.6 * counted < per_sample <= counted, "the count bounds the live activations, tightly"


def test_the_real_decoder_holds_288_values_per_sample_at_its_widest_step():
    real = CodecConfig.real()
    # stage 4: 96 channels at the audio rate; stage 3: 192 at half of it -- 96 a sample each
    assert fused.decode_values_per_sample(real, "epilogue") == 3 * 96
    assert fused.decode_values_per_sample(real, "prologue") == 2 * 96
    assert fused.decode_values_per_sample(real, "eager") == 5 * 96
    per_sample = device_decode.bytes_per_sample(real, torch.bfloat16, "triton")
    assert per_sample == pytest.approx((289 * 2 + device_decode.ATTENTION_BYTES_PER_SAMPLE + 4) * 1.25)
    with pytest.raises(ValueError, match="path must be one of"):
        fused.decode_values_per_sample(real, "fast")


def test_the_batch_cap_is_the_budget_over_bytes_per_sample_in_whole_frames():
    assert device_decode.samples_for_budget(10 * 2**30, 750.0, 2048) == (10 * 2**30 // (750 * 2048)) * 2048
    assert device_decode.samples_for_budget(100, 750.0, 2048) == 2048, "one frame at least"
    codec = random_codec(CodecConfig.tiny(), seed=3)
    path = codec.configure_decode("eager", memory_budget=2**30)
    expected = device_decode.samples_for_budget(2**30, path.bytes_per_sample, 2048)
    assert path.max_batch_samples() == expected > DEFAULT_MAX_BATCH_SAMPLES
    assert codec.max_batch_samples() == DEFAULT_MAX_BATCH_SAMPLES, "a CPU codec keeps the cache-sized cap"
    # 20 GB for a real-size bf16 fused decode (772 bytes a sample): ~587 s of audio in one call,
    # against 47.6 s under the CPU's cap
    real = device_decode.bytes_per_sample(CodecConfig.real(), torch.bfloat16, "triton")
    assert 580 < device_decode.samples_for_budget(20e9, real, 2048) / 44100 < 595


def test_the_backend_is_chosen_by_device_and_dtype_and_named_ones_are_checked(monkeypatch):
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert device_decode.resolve_backend("auto", cuda, torch.bfloat16) == "triton"
    assert device_decode.resolve_backend("auto", cuda, torch.float32) == "eager", "float32 stays the eager layers'"
    assert device_decode.resolve_backend("auto", cpu, torch.bfloat16) == "eager"
    with pytest.raises(ValueError, match="must be one of"):
        device_decode.resolve_backend("cudnn", cuda, torch.bfloat16)
    monkeypatch.delenv("TRITON_INTERPRET")
    with pytest.raises(ValueError, match="cpu is not CUDA"):
        device_decode.resolve_backend("triton", cpu, torch.bfloat16)
    monkeypatch.setattr(triton_conv, "installed", lambda: False)
    assert device_decode.resolve_backend("auto", cuda, torch.bfloat16) == "eager"
    codec = random_codec(CodecConfig.tiny(), seed=3)
    with pytest.raises(ValueError, match="CUDA graphs need a CUDA device"):
        codec.configure_decode("eager", graphs=True)
    assert codec.device_decode is None and codec.stream is None, "a CPU codec runs layers.py unless configured"


def test_the_decoders_convolutions_cost_139_gflop_per_audio_second():
    """The figure hooks on the real-size codec measured (docs/performance.md)."""
    assert decoder_conv_flops(CodecConfig.real()) / 1e9 == pytest.approx(138.4, abs=0.5)


@pytest.mark.slow
def test_every_kernel_of_the_real_decoder_compiles_for_sm90(monkeypatch):
    """What the lent GPU would compile, compiled here (triton's own ptxas, no GPU): each launch
    the real-size bf16 decoder makes, both Snake placements, recorded on meta tensors."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    monkeypatch.delenv("TRITON_INTERPRET")
    compiled = triton_conv.kernel_module()  # decorated for the compiler, beside the interpreter's
    launches = {}

    class Recorder:
        def __getitem__(self, grid):
            def record(*args, **constants):
                pointers = [f"*{str(a.dtype).removeprefix('torch.').replace('bfloat16', 'bf16').replace('float32', 'fp32')}"
                            for a in args[:-1]]  # fmt: skip
                constants = {k: v for k, v in constants.items() if k not in ("num_warps", "num_stages")}
                launches[tuple(sorted(constants.items())) + tuple(pointers)] = (pointers, constants)

            return record

    monkeypatch.setattr(triton_conv, "kernel", lambda: Recorder())
    with torch.device("meta"):
        from actors.codec.layers import Decoder

        decoder = Decoder(CodecConfig.real())
    for placement in ("epilogue", "prologue"):
        fused.FusedDecoder(decoder, torch.bfloat16, placement)(torch.empty(2, 1024, 64, device="meta"))
    assert len(launches) > 20
    kernel = compiled.causal_conv_kernel
    assert not compiled.INTERPRETED
    for pointers, constants in launches.values():
        signature = dict(zip(kernel.arg_names, pointers + ["i32"]))
        signature.update({name: "constexpr" for name in constants})
        constexprs = {(kernel.arg_names.index(name),): value for name, value in constants.items()}
        source = ASTSource(fn=kernel, signature=signature, constexprs=constexprs)
        compiled = triton.compile(source, target=GPUTarget("cuda", 90, 64), options={"num_warps": 8, "num_stages": 3})
        assert "cubin" in compiled.asm and math.isfinite(compiled.metadata.shared)


@pytest.mark.slow  # ~5 s; .ci/run runs the GPU check (its codec step) anyway
def test_the_quick_gpu_bench_runs_every_step_on_cpu(tmp_path):
    from actors.codec.gpu_bench import GpuBenchOptions, run_gpu_bench

    result = run_gpu_bench(GpuBenchOptions.quick(out=tmp_path), log=lambda _: None)
    written = (tmp_path / "codec_gpu_bench.json").read_text()
    assert '"decode_batch"' in written and os.environ.get("TRITON_INTERPRET") == "1"
    assert result["accuracy"]["triton"]["max_abs"] < 1e-5 and result["accuracy"]["eager"]["max_abs"] == 0
    points = [p for p in result["grid"] if "audio_s_per_s" in p]
    assert {p["backend"] for p in points} == {"triton", "eager"} and all(p["audio_s_per_s"] > 0 for p in points)
    assert result["decode_batch"]["max_batch_samples"] == DEFAULT_MAX_BATCH_SAMPLES
    assert result["meta"]["conv_gflop_per_audio_s"] > 0
