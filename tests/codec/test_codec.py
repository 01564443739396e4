"""The codec against upstream-made vectors (tests/vectors/codec-tiny), plus
batching, causality, checkpoint loading, the tiny checkpoint and the CLI."""

from __future__ import annotations

import contextlib
import json
import math
import subprocess
import sys
import warnings

import numpy as np
import pytest
import soundfile
import torch

from actors.codec import (
    Codec,
    CodecCheckpointError,
    CodecConfig,
    codec_from_state_dict,
    hydra_tree,
    layers,
    load_codec,
    transformer,
)
from actors.codec.model import _length_groups
from actors.codec.tiny import make_tiny, random_codec, random_state_dict
from helpers import REPO, VECTORS, random_codes

TINY = VECTORS / "codec-tiny"

needs_vectors = pytest.mark.skipif(not (TINY / "codec.pth").is_file(), reason=f"codec vectors not found at {TINY}")

# Upstream-made outputs vs ours in float32 (tests/vectors/codec-tiny/manifest.json tolerances).
ATOL = 1e-4
# The same model run two ways here (batched vs alone, chunked vs whole):
# only summation order may differ.
SAME_MODEL_ATOL = 1e-5


pytestmark = pytest.mark.usefixtures("one_thread")  # every test here (conftest.py)


@pytest.fixture(scope="module")
def tiny_config() -> CodecConfig:
    return hydra_tree.read_file(TINY / "config.json")


@pytest.fixture(scope="module")
def upstream_state() -> dict:
    return torch.load(TINY / "codec.pth", map_location="cpu", weights_only=True)


def vector(name: str) -> np.ndarray:
    return np.load(TINY / f"{name}.npy")


@contextlib.contextmanager
def captured(codec: Codec):
    """Record the tensors upstream's vectors were hooked from."""
    store: dict[str, np.ndarray] = {}
    handles = []

    def keep_output(name):
        def hook(module, inputs, output):
            store[name] = output.detach().float().numpy().copy()

        return hook

    def keep_input(name):
        def hook(module, inputs):
            store[name] = inputs[0].detach().float().numpy().copy()

        return hook

    targets = {
        "encoder_transformer_out": codec.encoder.block[4].block[5],
        "encoder_out": codec.encoder,
        "q_downsample_out": codec.quantizer.downsample,
        "q_pre_module_out": codec.quantizer.pre_module,
        "q_post_module_out": codec.quantizer.post_module,
        "q_upsample_out": codec.quantizer.upsample,
    }
    for name, module in targets.items():
        handles.append(module.register_forward_hook(keep_output(name)))
    handles.append(codec.quantizer.post_module.register_forward_pre_hook(keep_input("q_post_module_in")))
    try:
        yield store
    finally:
        for handle in handles:
            handle.remove()


def assert_close(actual, expected, atol=ATOL, what=""):
    actual = np.asarray(actual, dtype=np.float64)
    expected = np.asarray(expected, dtype=np.float64)
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    worst = float(np.max(np.abs(actual - expected))) if actual.size else 0.0
    assert worst <= atol, f"{what}: max |diff| {worst:.3g} > {atol:g}"


# ---------------------------------------------------------------- vectors


@needs_vectors
def test_codec_reports_its_sizes(codec):
    assert codec.sample_rate == 44100
    assert codec.frame_length == 2048
    assert codec.num_codebooks == 10
    assert codec.codebook_sizes == [256] + [128] * 9


@needs_vectors
def test_encode_matches_upstream_vector_a(codec):
    audio = torch.from_numpy(vector("a_encode_input_audio"))
    with captured(codec) as store:
        codes, frame_lengths = codec.encode(audio.view(1, 1, -1), torch.tensor([audio.numel()]))
    assert codes.dtype == torch.int64
    np.testing.assert_array_equal(codes.numpy(), vector("a_encode_indices"))
    np.testing.assert_array_equal(frame_lengths.numpy(), vector("a_encode_index_lengths"))
    assert_close(
        store["encoder_transformer_out"], vector("a_encode_encoder_transformer_out"), what="encoder transformer"
    )
    assert_close(store["encoder_out"], vector("a_encode_encoder_out"), what="encoder")
    assert_close(store["q_downsample_out"], vector("a_encode_q_downsample_out"), what="downsample")
    assert_close(store["q_pre_module_out"], vector("a_encode_q_pre_module_out"), what="pre_module")


@needs_vectors
def test_encode_long_clip_matches_vector_d(codec):
    # 6 s: the encoder's 512-frame window and the quantizer's 8-frame window
    # both cut in.
    audio = torch.from_numpy(vector("d_encode_long_input_audio"))
    with captured(codec) as store:
        codes, frame_lengths = codec.encode(audio.view(1, 1, -1), torch.tensor([audio.numel()]))
    np.testing.assert_array_equal(codes.numpy(), vector("d_encode_long_indices"))
    np.testing.assert_array_equal(frame_lengths.numpy(), vector("d_encode_long_index_lengths"))
    assert_close(store["encoder_out"], vector("d_encode_long_encoder_out"), what="encoder")


@needs_vectors
def test_decode_matches_vector_b(codec):
    with captured(codec) as store:
        audio = codec.decode(torch.from_numpy(vector("a_encode_indices")))
    assert audio.shape == (1, 1, 22 * 2048)
    assert_close(audio, vector("b_from_indices_audio"), what="audio")
    assert_close(store["q_post_module_in"], vector("b_from_indices_q_post_module_in"), what="post in")
    assert_close(store["q_post_module_out"], vector("b_from_indices_q_post_module_out"), what="post out")
    assert_close(store["q_upsample_out"], vector("b_from_indices_q_upsample_out"), what="upsample")


@needs_vectors
def test_decode_clamps_out_of_range_codes_and_leaves_input_alone(codec):
    handmade = torch.from_numpy(vector("c_handmade_indices"))
    untouched = handmade.clone()
    with captured(codec) as store:
        audio = codec.decode(handmade)
    torch.testing.assert_close(handmade, untouched, rtol=0, atol=0)
    assert_close(audio, vector("c_from_indices_audio"), what="audio")
    assert_close(store["q_upsample_out"], vector("c_from_indices_q_upsample_out"), what="upsample")
    # Clamping is all that happens to out-of-range codes: decoding upstream's
    # clamped tensor gives the very same audio.
    clamped_audio = codec.decode(torch.from_numpy(vector("c_handmade_indices_clamped")))
    torch.testing.assert_close(audio, clamped_audio, rtol=0, atol=0)
    # Upstream has no lower clamp (a negative index would crash); ours maps
    # negatives to code 0.
    negative = torch.from_numpy(vector("c_handmade_indices_clamped")).clone()
    zeroed = negative.clone()
    negative[0, 3, 5], zeroed[0, 3, 5] = -7, 0
    negative[1, 0, 0], zeroed[1, 0, 0] = -1, 0
    torch.testing.assert_close(codec.decode(negative), codec.decode(zeroed), rtol=0, atol=0)


# ------------------------------------------------------- lengths and batches


@needs_vectors
def test_clips_of_any_length_give_ceil_frames(codec):
    audio = vector("a_encode_input_audio")
    lengths = [1, 1000, 2047, 2048, 2049, 5000, 44100]
    codes = codec.encode_batch([audio[:n] for n in lengths])
    assert [c.shape for c in codes] == [(10, math.ceil(n / 2048)) for n in lengths]
    assert all(c.dtype == np.int64 for c in codes)
    # The full clip batched with shorter ones still gives upstream's codes.
    np.testing.assert_array_equal(codes[-1], vector("a_encode_indices")[0])
    # Shorter than one frame: one frame of codes, one frame of audio.
    (wave,) = codec.decode_batch([codes[1]])
    assert wave.shape == (2048,) and wave.dtype == np.float32
    # An empty clip gives no frames and no samples.
    (no_codes,) = codec.encode_batch([np.zeros(0, dtype=np.float32)])
    assert no_codes.shape == (10, 0)
    (no_wave,) = codec.decode_batch([no_codes])
    assert no_wave.shape == (0,)


@needs_vectors
def test_tensor_encode_reports_frame_lengths_per_row(codec):
    audio = torch.from_numpy(vector("a_encode_input_audio"))
    batch = torch.zeros(2, 1, 44100)
    batch[0, 0] = audio
    batch[1, 0, :3000] = audio[:3000]
    codes, frame_lengths = codec.encode(batch, torch.tensor([44100, 3000]))
    assert codes.shape == (2, 10, 22)
    assert frame_lengths.tolist() == [22, 2]
    np.testing.assert_array_equal(codes[0].numpy(), vector("a_encode_indices")[0])


@needs_vectors
def test_batched_decode_equals_decoding_each_alone(codec):
    rows = [
        vector("a_encode_indices")[0],
        vector("c_handmade_indices_clamped")[0],
        vector("c_handmade_indices_clamped")[1][:, :5],
        random_codes(codec.codebook_sizes, 1, seed=3),
        random_codes(codec.codebook_sizes, 9, seed=4),
    ]
    # unbounded padding: every row shares one padded batch (on CPU the default would decode
    # rows this different in length apart)
    together = codec.decode_batch(rows, max_padding=None)
    for row, wave in zip(rows, together):
        (alone,) = codec.decode_batch([row])
        assert wave.shape == (row.shape[1] * 2048,)
        assert_close(wave, alone, atol=SAME_MODEL_ATOL, what=f"{row.shape[1]}-frame row")
    assert_close(together[0], vector("b_from_indices_audio")[0, 0], what="vector b row")


@needs_vectors
def test_batched_encode_equals_encoding_each_alone(codec):
    long_clip = vector("d_encode_long_input_audio")
    clips = [long_clip[:90000], vector("a_encode_input_audio"), long_clip[5000:9000], long_clip[:2048]]
    together = codec.encode_batch(clips, max_padding=None)
    for clip, codes in zip(clips, together):
        (alone,) = codec.encode_batch([clip])
        np.testing.assert_array_equal(codes, alone)


def test_snake_is_upstreams_expression_on_either_sine():
    """CPU float32 without autograd takes numpy's sine, anything else torch's: both are
    x + sin(alpha x)^2 / (alpha + 1e-9) to within an ulp of the sine."""
    snake = layers.Snake1d(3)
    with torch.no_grad():
        snake.alpha.copy_(torch.tensor([0.5, 1.0, 1.7]).view(1, 3, 1))
    x = torch.randn(2, 3, 500, generator=torch.Generator().manual_seed(0)) * 3
    alpha = snake.alpha.detach()
    expected = x + (alpha + 1e-9).reciprocal() * torch.sin(alpha * x) ** 2
    with torch.inference_mode():
        by_numpy = snake(x)
    by_torch = snake(x)  # alpha requires grad here: torch's sine, and autograd works
    by_torch.sum().backward()
    assert snake.alpha.grad is not None
    for got in (by_numpy, by_torch.detach()):
        torch.testing.assert_close(got, expected, rtol=0, atol=2e-6)


def test_length_groups_bound_the_padding_they_add():
    lengths = [48, 45, 30, 10, 9, 9, 50]
    # longest first; a row joins a group while the group pads at most 15% over its own
    assert list(_length_groups(lengths, 8, 10**9, 1, 0.15)) == [[6, 0, 1], [2], [3, 4, 5]]
    assert list(_length_groups(lengths, 8, 10**9, 1, None)) == [[6, 0, 1, 2, 3, 4, 5]]
    assert list(_length_groups(lengths, 2, 10**9, 1, None)) == [[6, 0], [1, 2], [3, 4], [5]]
    for groups in (_length_groups(lengths, 8, 10**9, 1, 0.15), _length_groups(lengths, 3, 10**9, 1, 0.15)):
        for group in groups:
            own = sum(lengths[i] for i in group)
            assert len(group) * max(lengths[i] for i in group) <= 1.15 * own


def test_a_cpu_codec_decodes_rows_of_unlike_lengths_apart_and_alike_together(codec, monkeypatch):
    calls = []
    decode = codec.decode
    monkeypatch.setattr(codec, "decode", lambda codes: calls.append(tuple(codes.shape)) or decode(codes))
    rows = [random_codes(codec.codebook_sizes, n, seed=n) for n in (30, 4, 29, 28)]
    waves = codec.decode_batch(rows)
    assert sorted(calls) == [(1, codec.num_codebooks, 4), (3, codec.num_codebooks, 30)]
    assert [w.shape[0] for w in waves] == [n * 2048 for n in (30, 4, 29, 28)]


@needs_vectors
def test_appended_frames_never_change_earlier_audio(codec):
    base = vector("a_encode_indices")[0]
    full = codec.decode_batch([base])[0]
    for keep in (1, 7, 21):
        prefix = codec.decode_batch([base[:, :keep]])[0]
        assert_close(prefix, full[: keep * 2048], atol=SAME_MODEL_ATOL, what=f"first {keep} frames")
    # Different continuations of the same prefix: the prefix audio is fixed.
    other = base.copy()
    other[:, 10:] = random_codes(codec.codebook_sizes, 12, seed=5)
    changed = codec.decode_batch([other])[0]
    assert_close(changed[: 10 * 2048], full[: 10 * 2048], atol=SAME_MODEL_ATOL, what="prefix")
    assert np.max(np.abs(changed[10 * 2048 :] - full[10 * 2048 :])) > 1e-3


@needs_vectors
def test_appended_audio_never_changes_earlier_codes(codec):
    clip = vector("d_encode_long_input_audio")
    (full,) = codec.encode_batch([clip])
    for frames in (3, 40):
        (prefix,) = codec.encode_batch([clip[: frames * 2048]])
        np.testing.assert_array_equal(prefix, full[:, :frames])


@needs_vectors
def test_time_chunked_layers_equal_whole_clip(codec, monkeypatch):
    # Force many small, oddly sized chunks (some shorter than a conv's left
    # context, some splitting the batch by rows) through every chunked path.
    codes = torch.from_numpy(
        np.concatenate(
            [
                vector("a_encode_indices")[:, :, :16],
                vector("c_handmade_indices_clamped"),
            ]
        )
    )
    whole = codec.decode(codes)
    monkeypatch.setattr(layers, "CHUNK_ELEMENTS", 1500)
    monkeypatch.setattr(layers, "MIN_CHUNK_SAMPLES", 50)
    assert layers.chunk_shape(3, 32) == (1, 50) and layers.chunk_shape(3, 4) == (3, 125)
    chunked = codec.decode(codes)
    assert_close(chunked, whole, atol=SAME_MODEL_ATOL, what="chunked decode")
    audio = torch.from_numpy(vector("a_encode_input_audio"))
    batch = torch.stack([audio, audio.flip(0) * 0.5]).unsqueeze(1)
    chunked_codes, _ = codec.encode(batch)
    np.testing.assert_array_equal(chunked_codes[:1].numpy(), vector("a_encode_indices"))
    monkeypatch.undo()
    whole_codes, _ = codec.encode(batch)
    np.testing.assert_array_equal(chunked_codes.numpy(), whole_codes.numpy())


@needs_vectors
def test_block_attention_equals_one_call(codec, monkeypatch):
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 70, 8, generator=generator) for _ in range(3))
    for window in (8, 512, None):
        whole = transformer.windowed_attention(q, k, v, window, block=1000)
        for block in (16, 33):
            blocked = transformer.windowed_attention(q, k, v, window, block=block)
            torch.testing.assert_close(blocked, whole, rtol=0, atol=1e-6)
    # Through the model: the 520-frame encoder transformer attends in blocks.
    monkeypatch.setattr(transformer, "ATTENTION_BLOCK", 100)
    audio = torch.from_numpy(vector("d_encode_long_input_audio"))
    with captured(codec) as store:
        codes, _ = codec.encode(audio.view(1, 1, -1))
    np.testing.assert_array_equal(codes.numpy(), vector("d_encode_long_indices"))
    assert_close(store["encoder_out"], vector("d_encode_long_encoder_out"), what="encoder")


def test_window_mask_limits_what_each_query_sees():
    mask = transformer.window_mask(0, 6, 0, 6, 3, torch.device("cpu"))
    for i in range(6):
        for j in range(6):
            assert bool(mask[i, j]) == (i - 3 < j <= i), (i, j)


# ------------------------------------------------------------- checkpoints


def _to_legacy(state: dict) -> dict:
    converted = {}
    for key, value in state.items():
        converted[
            key.replace(".parametrizations.weight.original0", ".weight_g").replace(
                ".parametrizations.weight.original1", ".weight_v"
            )
        ] = value
    return converted


def _to_parametrized(state: dict) -> dict:
    converted = {}
    for key, value in state.items():
        converted[
            key.replace(".weight_g", ".parametrizations.weight.original0").replace(
                ".weight_v", ".parametrizations.weight.original1"
            )
        ] = value
    return converted


@needs_vectors
def test_both_weight_norm_storages_load_the_same_model(upstream_state, tiny_config, codec):
    assert any(k.endswith("weight_g") for k in upstream_state)
    assert any(k.endswith("original0") for k in upstream_state)
    legacy = codec_from_state_dict(_to_legacy(upstream_state), tiny_config)
    parametrized = codec_from_state_dict(_to_parametrized(upstream_state), tiny_config)
    reference = codec.state_dict()
    for model in (legacy, parametrized):
        state = model.state_dict()
        assert state.keys() == reference.keys()
        for key in reference:
            torch.testing.assert_close(state[key], reference[key], rtol=0, atol=0, msg=key)
    # Folding really applied g / ||v||: row norms of the weight equal g, and
    # for the transposed conv g is per input channel.
    transposed = reference["decoder.model.1.block.1.conv.weight"]
    g = upstream_state["decoder.model.1.block.1.conv.parametrizations.weight.original0"]
    torch.testing.assert_close(transposed.flatten(1).norm(dim=1), g.flatten(), rtol=1e-5, atol=1e-6)


@needs_vectors
def test_wrapped_and_prefixed_checkpoints_load(upstream_state, tiny_config, codec, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(hydra_tree.to_tree(tiny_config)))
    reference = codec.state_dict()
    layouts = {
        "wrapped": {"state_dict": upstream_state},
        "prefixed": {
            **{f"generator.{k}": v for k, v in upstream_state.items()},
            "discriminator.conv.weight": torch.zeros(3),
        },
    }
    for name, layout in layouts.items():
        folder = tmp_path / name
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(hydra_tree.to_tree(tiny_config)))
        torch.save(layout, folder / "codec.pth")
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # nothing unexpected may be left over
            loaded = load_codec(folder)
        for key, value in loaded.state_dict().items():
            torch.testing.assert_close(value, reference[key], rtol=0, atol=0, msg=f"{name}: {key}")


@needs_vectors
def test_missing_tensors_are_named(upstream_state, tiny_config):
    v_key = "decoder.model.1.block.1.conv.parametrizations.weight.original1"
    broken = {k: v for k, v in upstream_state.items() if k != v_key}
    with pytest.raises(CodecCheckpointError, match=v_key.replace(".", r"\.")):
        codec_from_state_dict(broken, tiny_config)
    gamma_key = "quantizer.downsample.0.1.gamma"
    broken = {k: v for k, v in upstream_state.items() if k != gamma_key}
    with pytest.raises(CodecCheckpointError) as error:
        codec_from_state_dict(broken, tiny_config)
    assert gamma_key in str(error.value) and "missing" in str(error.value)


@needs_vectors
def test_wrong_shapes_are_named_with_both_shapes(upstream_state, tiny_config):
    key = "quantizer.semantic_quantizer.quantizers.0.codebook.weight"
    broken = dict(upstream_state)
    broken[key] = torch.zeros(255, 8)
    with pytest.raises(CodecCheckpointError) as error:
        codec_from_state_dict(broken, tiny_config)
    message = str(error.value)
    assert key in message and "(255, 8)" in message and "(256, 8)" in message
    # A checkpoint of another size than its config says: every bad tensor is reported.
    with pytest.raises(CodecCheckpointError, match="wrong shape"):
        codec_from_state_dict(upstream_state, CodecConfig.tiny(semantic_codebook_size=128))


@needs_vectors
def test_unexpected_tensors_are_reported(upstream_state, tiny_config):
    extra = dict(upstream_state)
    extra["decoder.model.9.conv.weight"] = torch.zeros(1)
    with pytest.warns(UserWarning, match=r"decoder\.model\.9\.conv\.weight"):
        codec_from_state_dict(extra, tiny_config)


def test_unreadable_checkpoint_gives_a_clear_error(tmp_path):
    (tmp_path / "codec.pth").write_bytes(b"not a torch file")
    with pytest.raises(CodecCheckpointError, match="cannot read codec checkpoint"):
        load_codec(tmp_path, config=CodecConfig.tiny())
    with pytest.raises(FileNotFoundError, match="codec checkpoint not found"):
        load_codec(tmp_path / "nowhere")


# ------------------------------------------------------------------ config


def _upstream_layout_counts(config: CodecConfig) -> tuple[int, int]:
    """(tensors, values) of an upstream checkpoint for config: weight-normed
    convs store g (one value per row) and v instead of one weight."""
    with torch.device("meta"):
        model = Codec(config)
    tensors = values = 0
    for _name, module in model.named_modules():
        for param_name, param in module.named_parameters(recurse=False):
            storage = getattr(module, "weight_norm_storage", layers.PLAIN_WEIGHT)
            if param_name == "weight" and storage != layers.PLAIN_WEIGHT:
                tensors += 2
                values += param.numel() + param.shape[0]
            else:
                tensors += 1
                values += param.numel()
    return tensors, values


@needs_vectors
def test_config_json_parses_to_the_tiny_architecture(tiny_config, upstream_state):
    assert tiny_config == CodecConfig.tiny(semantic_codebook_size=256, codebook_size=128)
    assert tiny_config.pre_module.window_size == 8 and tiny_config.pre_module.head_dim == 16
    assert tiny_config.encoder_transformer(3).window_size == 512
    assert hydra_tree.from_tree(hydra_tree.to_tree(tiny_config)) == tiny_config
    tensors, values = _upstream_layout_counts(tiny_config)
    assert tensors == len(upstream_state) == 400
    assert values == sum(t.numel() for t in upstream_state.values()) == 652_462


def test_default_config_is_the_real_codec():
    real = CodecConfig.real()
    assert real.latent_width == 1024 and real.hop_length == 512 and real.frame_length == 2048
    assert real.codebook_sizes == [4096] + [1024] * 9
    assert real.encoder_transformer(3).n_head == 16 and real.encoder_transformer(2) is None
    assert real.post_module.window_size == 128 and real.post_module.n_layer == 8
    # CODEC.md: 535 tensors and 391,430,530 values in the real codec.pth.
    assert _upstream_layout_counts(real) == (535, 391_430_530)
    assert hydra_tree.from_tree(hydra_tree.to_tree(real)) == real


# -------------------------------------------------------------- tiny + CLI


def test_make_tiny_is_deterministic_and_sounds_like_something(tmp_path):
    first = make_tiny(tmp_path / "a", seed=0)
    second = make_tiny(tmp_path / "b", seed=0)
    other = make_tiny(tmp_path / "c", seed=1)
    assert first.read_bytes() == second.read_bytes()
    assert (tmp_path / "a" / "config.json").read_bytes() == (tmp_path / "b" / "config.json").read_bytes()
    assert first.read_bytes() != other.read_bytes()
    state = torch.load(first, weights_only=True)
    assert any(k.endswith(".parametrizations.weight.original1") for k in state)
    assert any(k.endswith(".weight_v") for k in state)
    codec = load_codec(tmp_path / "a")
    assert codec.codebook_sizes == [128] * 10
    (wave,) = codec.decode_batch([random_codes(codec.codebook_sizes, 40, seed=6)])
    assert 0.03 < float(wave.std()) < 0.3, wave.std()
    assert float(np.abs(wave).max()) < 0.95  # the tanh is not saturated
    assert float(np.abs(wave[:-1] - wave[1:]).mean()) > 1e-3  # not a constant


@needs_vectors
def test_random_checkpoints_use_the_upstream_key_layout(tiny_config, upstream_state):
    mine = random_state_dict(tiny_config, seed=0)
    assert list(mine) == list(upstream_state)  # same keys, same order
    for key, value in upstream_state.items():
        assert mine[key].shape == value.shape and mine[key].dtype == value.dtype, key


def test_random_codec_weights_depend_only_on_the_seed():
    config = CodecConfig.tiny(128, 128)
    a, b = random_codec(config, seed=3), random_codec(config, seed=3)
    for key, value in a.state_dict().items():
        torch.testing.assert_close(value, b.state_dict()[key], rtol=0, atol=0)


def test_make_random_writes_what_the_loader_reads_and_random_codec_builds(tmp_path):
    _cli("make-random", "--size", "tiny", "--out", str(tmp_path / "r"), "--seed", "4")
    loaded = load_codec(tmp_path / "r")
    built = random_codec(CodecConfig.tiny(128, 128), seed=4)
    codes = torch.from_numpy(random_codes(loaded.codebook_sizes, 5, seed=2, batch=2))
    assert torch.equal(loaded.decode(codes), built.decode(codes)), "the file holds the seed's weights"
    assert float(loaded.decode(codes).std()) > 0.03


@pytest.mark.slow  # 1.57 GB written and read back, ~1 min on 2 cores
def test_the_real_size_random_codec_has_upstreams_tensors_and_loads(tmp_path):
    from actors.codec.tiny import write_random_codec

    path = write_random_codec(tmp_path, CodecConfig.real(), seed=0)
    state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    # the real codec.pth's count (upstream's modded_dac_vq.yaml): 535 tensors, 391,430,530 values
    assert len(state) == 535 and sum(v.numel() for v in state.values()) == 391_430_530
    assert sum(k.endswith(".parametrizations.weight.original1") for k in state) == 60
    assert sum(k.endswith(".weight_v") for k in state) == 20
    del state
    codec = load_codec(tmp_path, dtype="bfloat16")
    assert codec.config == CodecConfig.real()
    (wave,) = codec.decode_batch([random_codes(codec.codebook_sizes, 2, seed=1)])
    assert wave.shape == (2 * 2048,) and 0.01 < float(wave.std()) < 0.5


def _cli(*args: str) -> subprocess.CompletedProcess:
    result = subprocess.run(
        [sys.executable, "-m", "actors.codec", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return result


@pytest.mark.slow  # CLI processes: ~9 s
def test_cli_round_trip_make_tiny_encode_decode(tmp_path):
    model_dir = tmp_path / "codec"
    _cli("make-tiny", "--out", str(model_dir), "--seed", "2")
    checkpoint = model_dir / "codec.pth"
    samples = 30000  # not a whole number of frames
    t = np.arange(samples) / 44100
    tone = (0.4 * np.sin(2 * np.pi * 330 * t)).astype(np.float32)
    soundfile.write(tmp_path / "in.wav", tone, 44100, subtype="PCM_16")
    _cli("encode", "--checkpoint", str(checkpoint), str(tmp_path / "in.wav"), str(tmp_path / "codes.npy"))
    codes = np.load(tmp_path / "codes.npy")
    assert codes.dtype == np.int64 and codes.shape == (10, math.ceil(samples / 2048))
    assert codes.min() >= 0 and codes.max() < 128
    library_codes = load_codec(model_dir).encode_batch([soundfile.read(tmp_path / "in.wav", dtype="float32")[0]])[0]
    np.testing.assert_array_equal(codes, library_codes)
    _cli("decode", "--checkpoint", str(checkpoint), str(tmp_path / "codes.npy"), str(tmp_path / "out.flac"))
    _cli("decode", "--checkpoint", str(model_dir), str(tmp_path / "codes.npy"), str(tmp_path / "out.wav"))
    flac, flac_rate = soundfile.read(tmp_path / "out.flac", dtype="float32")
    wav, wav_rate = soundfile.read(tmp_path / "out.wav", dtype="float32")
    assert flac_rate == wav_rate == 44100
    assert flac.shape == wav.shape == (codes.shape[1] * 2048,)
    assert soundfile.info(tmp_path / "out.flac").subtype == "PCM_16"
    assert soundfile.info(tmp_path / "out.wav").subtype == "FLOAT"
    assert_close(flac, wav, atol=1.0 / 2**15 + 1e-6, what="flac vs wav")
    assert float(wav.std()) > 0.01


@pytest.mark.slow  # CLI processes: ~8 s
def test_cli_bad_input_is_one_error_line(tmp_path):
    # the CLI style every chorus tool shares (actors/cli.py): `error: ...` on stderr, status 2
    model_dir = tmp_path / "codec"
    _cli("make-tiny", "--out", str(model_dir))
    np.save(tmp_path / "codes.npy", np.zeros((10, 3), dtype=np.int64))
    cases = [
        (
            ["decode", "--checkpoint", str(model_dir), str(tmp_path / "codes.npy"), str(tmp_path / "out.mp3")],
            ".wav or .flac",
        ),
        (
            [
                "decode",
                "--checkpoint",
                str(tmp_path / "none.pth"),
                str(tmp_path / "codes.npy"),
                str(tmp_path / "o.wav"),
            ],
            "not found",
        ),
        (["encode", "--checkpoint", str(model_dir), str(tmp_path / "codes.npy"), str(tmp_path / "c.npy")], "error: "),
    ]
    for args, message in cases:
        result = subprocess.run(
            [sys.executable, "-m", "actors.codec", *args], cwd=REPO, capture_output=True, text=True, timeout=120
        )
        assert result.returncode == 2, result.stderr
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], result.stderr
    assert not list(tmp_path.glob("*.mp3")) and not list(tmp_path.glob(".tmp-*"))
