"""Loading every on-disk layout, and clear errors for broken checkpoints."""

import hashlib
import json
import shutil

import numpy as np
import pytest
import torch

from actors.engine import CheckpointError, load_model
from actors.engine.tiny import make_tiny
from actors.engine.tokenizer import load_tokenizer
from helpers import run_module, vector_set


@pytest.fixture(scope="module")
def s1_dir(tmp_path_factory):
    return make_tiny(tmp_path_factory.mktemp("s1") / "ckpt", fmt="s1", seed=3, n_layer=1)


@pytest.fixture(scope="module")
def s2_dir(tmp_path_factory):
    return make_tiny(tmp_path_factory.mktemp("s2") / "ckpt", fmt="s2", seed=4, n_layer=1)


def _copy(src, tmp_path):
    dst = tmp_path / "ckpt"
    shutil.copytree(src, dst)
    return dst


def _scores(ckpt, tokens):
    lm = load_model(ckpt, device="cpu", dtype="float32")
    return lm.model.score(torch.from_numpy(tokens))


def _tokens(lm_dir):
    lm = load_model(lm_dir, device="cpu", dtype="float32")
    c = lm.config
    rng = np.random.default_rng(0)
    t = np.zeros((1 + c.num_codebooks, 12), np.int64)
    t[0, :6] = rng.integers(0, 256, 6)
    t[0, 6:] = c.semantic_begin_id + rng.integers(0, c.codebook_size, 6)
    t[1:, 6:] = rng.integers(0, c.codebook_size, (c.num_codebooks, 6))
    return t


@pytest.mark.slow  # three CLI processes each: ~28 s
@pytest.mark.parametrize("fmt", ["s1", "s2"])
def test_make_tiny_round_trips_through_cli(fmt, tmp_path):
    out = tmp_path / fmt
    proc = run_module("actors.engine", "make-tiny", "--format", fmt, "--out", str(out), "--seed", "5")
    assert proc.returncode == 0, proc.stderr
    proc = run_module("actors.engine", "info", "--checkpoint", str(out), "--json", "--dtype", "float32")
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    assert info["family"] == fmt and info["unexpected_tensors"] == []
    lm = load_model(out, device="cpu", dtype="float32")
    assert info["parameters"] == lm.config.parameter_count == sum(p.numel() for p in lm.model.parameters())
    assert info["slow_kv_bytes_per_token"] == 2 * lm.config.n_layer * lm.config.n_local_heads * lm.config.head_dim * 4
    tokens = _tokens(out)
    np.save(tmp_path / "t.npy", tokens)
    proc = run_module(
        "actors.engine",
        "score",
        "--checkpoint",
        str(out),
        "--tokens",
        str(tmp_path / "t.npy"),
        "--out",
        str(tmp_path / "s.npz"),
        "--dtype",
        "float32",  # compared bit for bit with the float32 model loaded here
    )
    assert proc.returncode == 0, proc.stderr
    slow, fast = lm.model.score(torch.from_numpy(tokens))
    got = np.load(tmp_path / "s.npz")
    assert np.array_equal(got["slow_logits"], slow.numpy()) and np.array_equal(got["fast_logits"], fast.numpy())
    assert np.isfinite(got["slow_logits"]).all() and got["slow_logits"].std() > 0.01
    # deterministic: a second write is byte-identical
    again = make_tiny(tmp_path / "again", fmt=fmt, seed=5)
    for f in sorted(p.name for p in out.iterdir()):
        assert hashlib.sha256((out / f).read_bytes()).digest() == hashlib.sha256((again / f).read_bytes()).digest(), f


def test_s2_vectors_are_sharded_and_load_all_keys():
    v = vector_set("dualar-s2-tiny") / "checkpoint"
    lm = load_model(v, device="cpu", dtype="float32")
    assert len(lm.report.files) == 2 and lm.report.unexpected == []
    assert lm.config.family == "s2" and lm.config.norm_fastlayer_input and lm.config.head_dim == 24


def test_single_safetensors_file_and_model_prefix_and_split_qkv(s1_dir, s2_dir, tmp_path):
    """The same weights stored as one model.safetensors with S2 names, and as model.pth with a
    `model.` prefix and split wq/wk/wv, load to the same model."""
    from safetensors.torch import load_file, save_file

    tokens = _tokens(s2_dir)
    ref = _scores(s2_dir, tokens)
    one = _copy(s2_dir, tmp_path / "a")
    merged = {}
    for shard in sorted(one.glob("model-*.safetensors")):
        merged.update(load_file(str(shard)))
        shard.unlink()
    (one / "model.safetensors.index.json").unlink()
    save_file(merged, str(one / "model.safetensors"))
    for a, b in zip(ref, _scores(one, tokens)):
        assert torch.equal(a, b)

    tokens = _tokens(s1_dir)
    ref = _scores(s1_dir, tokens)
    pth = _copy(s1_dir, tmp_path / "b")
    sd = torch.load(pth / "model.pth", weights_only=True)
    lm = load_model(s1_dir, device="cpu", dtype="float32")
    c = lm.config
    out = {}
    for k, t in sd.items():
        if k.endswith("attention.wqkv.weight"):
            base = k[: -len("wqkv.weight")]
            heads = c.n_head if k.startswith("layers") else c.fast_n_head
            kv = c.n_local_heads if k.startswith("layers") else c.fast_n_local_heads
            hd = c.head_dim if k.startswith("layers") else c.fast_head_dim
            q, kk, v = t.split([heads * hd, kv * hd, kv * hd])
            (
                out["model." + base + "wq.weight"],
                out["model." + base + "wk.weight"],
                out["model." + base + "wv.weight"],
            ) = q, kk, v
        else:
            out["model." + k] = t
    torch.save(out, pth / "model.pth")
    for a, b in zip(ref, _scores(pth, tokens)):
        assert torch.equal(a, b)


def test_missing_tensor_names_the_key(s1_dir, tmp_path):
    d = _copy(s1_dir, tmp_path)
    sd = torch.load(d / "model.pth", weights_only=True)
    del sd["layers.0.attention.wo.weight"]
    torch.save(sd, d / "model.pth")
    with pytest.raises(CheckpointError, match=r"missing tensor.*'layers\.0\.attention\.wo\.weight' \(128, 128\)"):
        load_model(d, device="cpu", dtype="float32")


def test_wrong_shape_names_key_and_both_shapes(s2_dir, tmp_path):
    from safetensors.torch import load_file, save_file

    d = _copy(s2_dir, tmp_path)
    shard = sorted(d.glob("model-*.safetensors"))[0]
    sd = load_file(str(shard))
    key = next(k for k in sd if k.endswith("embeddings.weight") and k.startswith("text_model"))
    sd[key] = sd[key][:-1]
    save_file(sd, str(shard))
    with pytest.raises(CheckpointError) as e:
        load_model(d, device="cpu", dtype="float32")
    msg = str(e.value)
    assert "'embeddings.weight'" in msg and "(400, 128)" in msg and "(401, 128)" in msg


def test_unexpected_tensors_are_reported(s1_dir, tmp_path):
    d = _copy(s1_dir, tmp_path)
    sd = torch.load(d / "model.pth", weights_only=True)
    sd["audio_projector.weight"] = torch.zeros(2, 2)
    torch.save(sd, d / "model.pth")
    lm = load_model(d, device="cpu", dtype="float32")
    assert lm.report.unexpected == ["audio_projector.weight"]
    proc = run_module("actors.engine", "info", "--checkpoint", str(d))
    assert proc.returncode == 0 and "audio_projector.weight" in proc.stdout


@pytest.mark.parametrize(
    "mutate, pattern",
    [
        (lambda c: c.update(model_type="llama"), r"config\.json: field 'model_type' is 'llama'"),
        (lambda c: c.pop("n_layer"), r"config\.json: required field 'n_layer' is missing"),
        (lambda c: c.update(n_head="four"), r"field 'n_head' must be an integer"),
        (lambda c: c.update(n_local_heads=3), r"n_head \(4\) is not a multiple of n_local_heads \(3\)"),
    ],
)
def test_bad_config_fields(s1_dir, tmp_path, mutate, pattern):
    d = _copy(s1_dir, tmp_path)
    cfg = json.loads((d / "config.json").read_text())
    mutate(cfg)
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=pattern):
        load_model(d, device="cpu", dtype="float32")


def test_bad_nested_config_names_the_nested_field(s2_dir, tmp_path):
    d = _copy(s2_dir, tmp_path)
    cfg = json.loads((d / "config.json").read_text())
    del cfg["audio_decoder_config"]["num_codebooks"]
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=r"'audio_decoder_config\.num_codebooks' is missing"):
        load_model(d, device="cpu", dtype="float32")


@pytest.mark.parametrize("which", ["pth", "safetensors"])
def test_truncated_weights(s1_dir, s2_dir, tmp_path, which):
    d = _copy(s1_dir if which == "pth" else s2_dir, tmp_path)
    f = d / "model.pth" if which == "pth" else sorted(d.glob("model-*.safetensors"))[-1]
    data = f.read_bytes()
    f.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match=r"truncated or corrupt") as e:
        load_model(d, device="cpu", dtype="float32")
    assert f.name in str(e.value)


def test_pickle_that_is_not_weights_only_is_refused(s1_dir, tmp_path):
    d = _copy(s1_dir, tmp_path)
    sd = torch.load(d / "model.pth", weights_only=True)
    sd["extra"] = {"callable": shutil.copy}  # an arbitrary object: needs full unpickling
    torch.save(sd, d / "model.pth")
    with pytest.raises(CheckpointError, match=r"not a weights-only state dict"):
        load_model(d, device="cpu", dtype="float32")


def test_missing_weights_and_tokenizer(s1_dir, tmp_path):
    d = _copy(s1_dir, tmp_path)
    (d / "model.pth").unlink()
    with pytest.raises(CheckpointError, match=r"no weights found"):
        load_model(d, device="cpu", dtype="float32")
    d2 = _copy(s1_dir, tmp_path / "x")
    for name in ("tokenizer.json", "tokenizer.tiktoken"):
        (d2 / name).unlink()
    with pytest.raises(CheckpointError, match=r"no tokenizer found"):
        load_model(d2, device="cpu", dtype="float32")


def test_loads_into_bfloat16_without_an_extra_copy(s2_dir):
    lm = load_model(s2_dir, device="cpu", dtype="bfloat16")
    assert all(p.dtype == torch.bfloat16 for p in lm.model.parameters())
    ref = load_model(s2_dir, device="cpu", dtype="float32")
    # the stored values are bf16, so the bf16 model holds exactly the same numbers
    for (n, a), (_, b) in zip(lm.model.named_parameters(), ref.model.named_parameters()):
        assert torch.equal(a.float(), b), n


def test_tiktoken_and_hf_tokenizers_agree():
    d = vector_set("dualar-s1-tiny") / "checkpoint"
    tk, hf = load_tokenizer(d, "tiktoken"), load_tokenizer(d, "hf")
    assert tk.kind == "tiktoken" and hf.kind == "hf"
    for text in ["Ok, café.", "<|im_start|>user\nHi<|im_end|>", "<|speaker:0|>Hello! 123 ...", "日本語 ✓"]:
        assert tk.encode(text) == hf.encode(text)
    assert tk.token_id("<|im_end|>") == hf.token_id("<|im_end|>") == 261
    assert tk.encode("<|im_end|>") == [261]
    assert (tk.semantic_begin_id, tk.semantic_end_id) == (273, 400)
    assert tk.encode("<|speaker:0|>") == list(b"<|speaker:0|>")  # not a special token
    with pytest.raises(CheckpointError, match="not in the tokenizer"):
        tk.token_id("<|nope|>")
