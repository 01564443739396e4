"""Speaker similarity plumbing on a tiny WavLM x-vector model with random weights, built and saved
here (no download): loading from a local directory, refusing a wrong one, unit-norm embeddings
that depend on the clip alone, resampling, the short-clip rule, cosine, the reference cache.
Whether the embeddings tell speakers apart is not in question: the weights are random."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import threading

import numpy as np
import pytest

from actors.audio import resample
from actors.errors import ConfigError
from actors.quality.speaker import (
    SPEAKER_BACKENDS,
    WAVLM_SAME_SPEAKER_THRESHOLD,
    ReferenceEmbeddings,
    SpeakerEmbedder,
    cosine,
    min_clip_samples,
)
from actors.quality.tiny import build_tiny_wavlm
from tests.helpers import REPO

MODEL_RATE = 16000
# wavlm-base-plus-sv's conv stack (kernels 10,3,3,3,3,2,2; strides 5,2,2,2,2,2,2) and TDNN
# (kernels 5,3,3,1,1; dilations 1,2,3,1,1), which the tiny model keeps: the TDNN eats
# 4 + 4 + 6 frames and the pooling needs 2 more, so 16 conv frames = 400 + 15 * 320 samples
MIN_SAMPLES = 5200


def _voice(seconds: float, rate: int, seed: int) -> np.ndarray:
    """A voiced-like test signal: a few harmonics of a random pitch, plus a little noise."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * rate)) / rate
    pitch = rng.uniform(90, 250)
    wave = sum(rng.uniform(0.05, 0.2) * np.sin(2 * np.pi * pitch * h * t + rng.uniform(0, 6)) for h in range(1, 6))
    return (wave + 0.01 * rng.standard_normal(t.size)).astype(np.float32)


@pytest.fixture(scope="module")
def tiny_wavlm(tmp_path_factory):
    pytest.importorskip("transformers")
    return build_tiny_wavlm(tmp_path_factory.mktemp("wavlm_sv"))


@pytest.fixture(scope="module")
def embedder(tiny_wavlm):
    import torch

    # a forward pass of the tiny model is ~9 ms on one thread and was ~370 ms on two threads of
    # a loaded 2-core machine (the threads wait on each other); restored for the tests after these
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield SpeakerEmbedder(str(tiny_wavlm))
    torch.set_num_threads(threads)


def test_importing_the_module_imports_neither_torch_nor_transformers():
    code = (
        "import sys\n"
        "import actors.quality.speaker\n"
        "assert 'transformers' not in sys.modules and 'torch' not in sys.modules, sorted(sys.modules)\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True)


def test_constants():
    assert SPEAKER_BACKENDS == ("wavlm", "wavlm_ecapa")
    assert WAVLM_SAME_SPEAKER_THRESHOLD == 0.86


def test_loads_from_the_directory(embedder, tiny_wavlm):
    assert embedder.sample_rate == MODEL_RATE
    assert embedder.dim == 16
    assert embedder.min_samples == MIN_SAMPLES == min_clip_samples(embedder.model.config)
    assert not embedder.model.training
    assert (
        embedder.model.config.xvector_output_dim
        == json.loads((tiny_wavlm / "config.json").read_text())["xvector_output_dim"]
    )


def test_a_directory_without_config_is_refused(tmp_path):
    missing = tmp_path / "no_model_here"
    with pytest.raises(ConfigError) as error:
        SpeakerEmbedder(str(missing))
    message = str(error.value)
    assert str(missing) in message and "no config.json" in message
    assert "huggingface-cli download microsoft/wavlm-base-plus-sv --local-dir DIR" in message


@pytest.mark.parametrize(
    "config_text, named",
    [
        (json.dumps({"model_type": "whisper", "architectures": ["WhisperForConditionalGeneration"]}), "'whisper'"),
        (json.dumps({"model_type": "wavlm", "architectures": ["WavLMForCTC"]}), "WavLMForCTC"),
        (json.dumps({"model_type": "wavlm"}), "no architectures"),
        ("[1, 2]", "None"),
        ("{not json", "not readable JSON"),
    ],
)
def test_a_directory_of_another_model_is_refused(tmp_path, config_text, named):
    (tmp_path / "config.json").write_text(config_text)
    with pytest.raises(ConfigError) as error:
        SpeakerEmbedder(str(tmp_path))
    message = str(error.value)
    assert str(tmp_path) in message and named in message
    assert "download" in message


def test_a_directory_with_config_but_no_weights_is_refused(tiny_wavlm, tmp_path):
    (tmp_path / "config.json").write_text((tiny_wavlm / "config.json").read_text())
    (tmp_path / "preprocessor_config.json").write_text((tiny_wavlm / "preprocessor_config.json").read_text())
    with pytest.raises(ConfigError) as error:
        SpeakerEmbedder(str(tmp_path))
    assert str(tmp_path) in str(error.value) and "microsoft/wavlm-base-plus-sv" in str(error.value)


def test_embeddings_are_unit_norm_float32_rows(embedder):
    clips = [_voice(1.0, MODEL_RATE, seed) for seed in range(3)]
    embeddings = embedder.embed(clips, MODEL_RATE)
    assert embeddings.shape == (3, 16) and embeddings.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(embeddings.astype(np.float64), axis=1), 1.0, atol=1e-6)
    # different clips, different embeddings (the rows are not one vector repeated)
    assert cosine(embeddings[0], embeddings[1]) < 0.99999
    assert embedder.embed([], MODEL_RATE).shape == (0, 16)


def test_the_same_clip_gives_the_same_embedding(embedder):
    clip = _voice(1.0, MODEL_RATE, seed=7)
    np.testing.assert_array_equal(embedder.embed([clip], MODEL_RATE), embedder.embed([clip.copy()], MODEL_RATE))


def test_an_embedding_does_not_depend_on_its_batch_mates(embedder):
    clip = _voice(0.5, MODEL_RATE, seed=1)
    alone = embedder.embed([clip], MODEL_RATE)[0]
    mates = [_voice(3.0, MODEL_RATE, seed=2), clip, _voice(1.3, MODEL_RATE, seed=3)]
    np.testing.assert_array_equal(embedder.embed(mates, MODEL_RATE)[1], alone)


@pytest.mark.filterwarnings("ignore:Support for mismatched key_padding_mask:UserWarning")
def test_padding_into_one_batch_would_change_the_embedding(embedder):
    """Why embed() runs one clip per pass: the same clip zero-padded next to a longer one, with
    its attention mask, comes out of WavLMForXVector with another embedding."""
    import torch

    clip, longer = _voice(0.5, MODEL_RATE, seed=1), _voice(3.0, MODEL_RATE, seed=2)
    features = embedder.feature_extractor(
        [clip, longer], sampling_rate=MODEL_RATE, padding=True, return_attention_mask=True, return_tensors="pt"
    )
    with torch.inference_mode():
        batched = embedder.model(features.input_values, attention_mask=features.attention_mask).embeddings[0]
    batched = batched.numpy() / np.linalg.norm(batched.numpy())
    alone = embedder.embed([clip], MODEL_RATE)[0]
    # 0.14 here when written (cosine 0.981); the speaker.py docstring has the figures
    assert np.abs(batched - alone).max() > 1e-2


def test_a_clip_is_resampled_to_the_model_rate(embedder):
    clip_44k = _voice(1.0, 44100, seed=4)
    at_44k = embedder.embed([clip_44k], 44100)[0]
    np.testing.assert_array_equal(at_44k, embedder.embed([resample(clip_44k, 44100, MODEL_RATE)], MODEL_RATE)[0])
    # the rate matters: the same samples read as 16 kHz are another (slower, longer) signal
    assert np.abs(embedder.embed([clip_44k], MODEL_RATE)[0] - at_44k).max() > 1e-3


def test_a_clip_shorter_than_the_model_can_embed_gets_nan(embedder):
    clip = _voice(1.0, MODEL_RATE, seed=5)
    embeddings = embedder.embed([np.zeros(0, np.float32), clip[: MIN_SAMPLES - 1], clip[:MIN_SAMPLES]], MODEL_RATE)
    assert np.isnan(embeddings[:2]).all()
    assert np.isfinite(embeddings[2]).all()
    assert math.isnan(cosine(embeddings[1], embeddings[2]))
    # the threshold is taken after resampling: 0.3 s at 44.1 kHz is 4800 samples at 16 kHz
    assert np.isnan(embedder.embed([_voice(0.3, 44100, seed=5)], 44100)).all()


@pytest.mark.filterwarnings("ignore:std.*degrees of freedom:UserWarning")
def test_the_short_clip_threshold_is_the_models_own(embedder):
    """One sample fewer than min_samples and the model itself has no finite embedding, so the
    NaN rule refuses no clip the model could have measured."""
    import torch

    clip = _voice(1.0, MODEL_RATE, seed=6)[: MIN_SAMPLES - 1]
    features = embedder.feature_extractor(clip, sampling_rate=MODEL_RATE, return_tensors="pt")
    with torch.inference_mode():
        embedding = embedder.model(features.input_values).embeddings
    assert not torch.isfinite(embedding).all()


def test_cosine_reference_values():
    assert cosine(np.array([1.0, 0.0]), np.array([0.0, 3.0])) == 0.0
    assert cosine(np.array([0.3, -0.4, 1.2]), np.array([0.3, -0.4, 1.2])) == pytest.approx(1.0, abs=1e-15)
    assert cosine(np.array([1.0, 2.0]), np.array([-2.0, -4.0])) == pytest.approx(-1.0, abs=1e-15)
    # 1*4 + 2*5 + 3*6 = 32 over sqrt(14) * sqrt(77)
    assert cosine(np.array([1, 2, 3]), np.array([4, 5, 6])) == pytest.approx(32 / math.sqrt(14 * 77), rel=1e-12)
    assert cosine(np.array([1, 2, 3], np.float32), 10 * np.array([4, 5, 6], np.float32)) == pytest.approx(
        0.9746318461970762, rel=1e-7
    )
    assert math.isnan(cosine(np.zeros(3), np.array([1.0, 2.0, 3.0])))
    assert math.isnan(cosine(np.array([np.nan, 1.0]), np.array([1.0, 1.0])))
    with pytest.raises(ValueError):
        cosine(np.ones(3), np.ones(4))


class _Clips:
    """Reference clips by key, counting loads."""

    def __init__(self):
        self.loads: list[str] = []

    def loader(self, key: str):
        def load():
            self.loads.append(key)
            return _voice(1.0, 24000, seed=sum(map(ord, key))), 24000

        return load


def test_a_reference_used_by_many_rows_is_embedded_once(embedder):
    cache, clips = ReferenceEmbeddings(embedder), _Clips()
    got = [cache.get("alice", clips.loader("alice")) for _ in range(5)]
    assert clips.loads == ["alice"]
    assert (cache.misses, cache.hits) == (1, 4)
    expected = embedder.embed([clips.loader("alice")()[0]], 24000)[0]
    for embedding in got:
        np.testing.assert_array_equal(embedding, expected)
    assert not got[0].flags.writeable


def test_the_least_recently_used_reference_is_dropped_at_capacity(embedder):
    cache, clips = ReferenceEmbeddings(embedder, capacity=2), _Clips()
    for key in ["a", "b", "a", "c"]:  # "a" was used after "b", so "c" drops "b"
        cache.get(key, clips.loader(key))
    assert len(cache) == 2 and "a" in cache and "c" in cache and "b" not in cache
    cache.get("a", clips.loader("a"))
    cache.get("b", clips.loader("b"))  # back in, dropping "c"
    assert clips.loads == ["a", "b", "c", "b"]
    assert (cache.misses, cache.hits) == (4, 2)
    assert "c" not in cache and len(cache) == 2


def test_threads_asking_for_one_new_reference_embed_it_once(embedder):
    cache, clips = ReferenceEmbeddings(embedder), _Clips()
    start = threading.Barrier(4)
    results = []

    def ask():
        start.wait()
        results.append(cache.get("shared", clips.loader("shared")))

    threads = [threading.Thread(target=ask) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert clips.loads == ["shared"] and (cache.misses, cache.hits) == (1, 3)
    assert all(r is results[0] for r in results)


def test_a_failed_load_caches_nothing(embedder):
    cache = ReferenceEmbeddings(embedder)

    def broken():
        raise OSError("clip gone")

    with pytest.raises(OSError):
        cache.get("gone", broken)
    assert "gone" not in cache and len(cache) == 0


def test_capacity_must_be_positive(embedder):
    with pytest.raises(ValueError, match="capacity"):
        ReferenceEmbeddings(embedder, capacity=0)
