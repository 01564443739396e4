"""Seed-TTS-eval's speaker-similarity model (actors/quality/wavlm_ecapa.py) on a tiny checkpoint in
the published `wavlm_large_finetune.pth` format, made by upstream's own code
(tests/vectors/upstream-wavlm-ecapa/README.md): loaded from a directory, its embeddings upstream's;
what is refused; the check as the actor runs it."""

from __future__ import annotations

import hashlib
import re
import shutil

import numpy as np
import pytest

from actors.errors import ConfigError
from actors.quality.settings import QualitySettings
from tests.helpers import REPO

VECTORS = REPO / "tests" / "vectors" / "upstream-wavlm-ecapa"
CLIPS = ("a", "b", "c")
RATE = 16000

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def embedder():
    from actors.quality.wavlm_ecapa import WavLMEcapaEmbedder

    return WavLMEcapaEmbedder(str(VECTORS))


def clip(name: str) -> np.ndarray:
    return np.load(VECTORS / f"clip_{name}.npy")


def upstream(name: str) -> np.ndarray:
    return np.load(VECTORS / f"embedding_{name}.npy")


def test_the_vendored_files_are_the_ones_made_upstream():
    table = dict(re.findall(r"\| `([^`]+)` \| `([0-9a-f]{64})` \|", (VECTORS / "README.md").read_text()))
    assert len(table) == 7
    for name, digest in table.items():
        assert hashlib.sha256((VECTORS / name).read_bytes()).hexdigest() == digest, name


@pytest.mark.parametrize("name", CLIPS)
def test_embeddings_are_upstreams(embedder, name):
    with torch.inference_mode():
        raw = embedder.head(embedder.hidden_states(torch.from_numpy(clip(name))[None]))[0].numpy()
    assert np.abs(raw - upstream(name)).max() < 5e-4  # values up to 14.5; measured 7.6e-5
    unit = upstream(name) / np.linalg.norm(upstream(name))
    (mine,) = embedder.embed([clip(name)], RATE)
    assert np.linalg.norm(mine) == pytest.approx(1.0, abs=1e-6)
    assert float(np.dot(mine, unit)) == pytest.approx(1.0, abs=1e-6)


def test_the_sizes_come_from_the_checkpoint(embedder):
    config = embedder.backbone.config
    assert (config.num_hidden_layers, config.hidden_size, config.num_attention_heads) == (3, 32, 4)
    assert (config.num_buckets, config.conv_dim[0], embedder.dim) == (32, 16, 8)
    assert embedder.head.feature_weight.shape[0] == 4  # three layers' inputs and the output
    assert embedder.min_samples == 720  # two frames of the 400-sample, 320-hop conv stack


def test_a_clip_alone_or_among_others_and_a_too_short_one(embedder):
    clips = [clip("a"), np.zeros(719, np.float32), clip("c"), clip("b")]
    together = embedder.embed(clips, RATE)
    assert np.isnan(together[1]).all()
    for row, name in ((0, "a"), (2, "c"), (3, "b")):
        assert np.array_equal(together[row], embedder.embed([clip(name)], RATE)[0])
    # resampled to 16 kHz first
    at_44k = embedder.embed([np.interp(np.arange(66150) / 44100 * RATE, np.arange(24000), clip("a"))], 44100)[0]
    assert float(np.dot(at_44k, embedder.embed([clip("a")], RATE)[0])) > 0.99


def test_a_backbone_in_its_own_file_beside_the_head(tmp_path, embedder):
    """Upstream loads the head non-strictly over s3prl's WavLM-Large: a checkpoint without the
    backbone takes it from wavlm_large.pt in the same directory."""
    from actors.quality.wavlm_ecapa import BACKBONE_PREFIX, CHECKPOINT, WavLMEcapaEmbedder

    state = torch.load(VECTORS / CHECKPOINT, weights_only=True)["model"]
    head = {k: v for k, v in state.items() if not k.startswith("feature_extract.")}
    backbone = {k[len(BACKBONE_PREFIX) :]: v for k, v in state.items() if k.startswith(BACKBONE_PREFIX)}
    torch.save({"model": head}, tmp_path / CHECKPOINT)
    with pytest.raises(ConfigError, match="holds no WavLM backbone .* wavlm_large.pt"):
        WavLMEcapaEmbedder(str(tmp_path))
    torch.save({"model": backbone}, tmp_path / "wavlm_large.pt")
    split = WavLMEcapaEmbedder(str(tmp_path))
    assert np.array_equal(split.embed([clip("b")], RATE), embedder.embed([clip("b")], RATE))


def test_what_is_refused_names_the_file(tmp_path):
    from actors.quality.wavlm_ecapa import CHECKPOINT, WavLMEcapaEmbedder

    with pytest.raises(ConfigError, match=f"{CHECKPOINT} not found; download"):
        WavLMEcapaEmbedder(str(tmp_path))
    state = torch.load(VECTORS / CHECKPOINT, weights_only=True)["model"]
    torch.save(
        {"model": {**state, "feature_extract.model.encoder.mystery.weight": torch.zeros(2)}}, tmp_path / CHECKPOINT
    )
    with pytest.raises(ConfigError, match="not UniSpeech's WavLM ECAPA-TDNN checkpoint .*mystery"):
        WavLMEcapaEmbedder(str(tmp_path))
    torch.save({"model": {k: v for k, v in state.items() if k != "linear.weight"}}, tmp_path / CHECKPOINT)
    with pytest.raises(ConfigError, match="not UniSpeech's WavLM ECAPA-TDNN checkpoint"):
        WavLMEcapaEmbedder(str(tmp_path))
    torch.save({"model": state, "args": ValueError("a pickled object")}, tmp_path / CHECKPOINT)
    with pytest.raises(ConfigError, match="cannot be read as tensors"):
        WavLMEcapaEmbedder(str(tmp_path))


def test_the_bound_is_the_backends_own_unless_set():
    assert QualitySettings(speaker="wavlm", speaker_model="/m").speaker_bound() == 0.86
    assert QualitySettings(speaker="wavlm_ecapa", speaker_model="/m").speaker_bound() is None
    chosen = QualitySettings(speaker="wavlm_ecapa", speaker_model="/m", min_speaker_similarity=0.5)
    assert chosen.speaker_bound() == 0.5
    with pytest.raises(ConfigError, match="has no published threshold: set quality.min_speaker_similarity"):
        QualitySettings(speaker="wavlm_ecapa", speaker_model="/m", reject=["no_audio", "speaker"]).validate()
    chosen.validate()


def test_the_check_as_the_actor_loads_it(tmp_path):
    from actors.quality.speaker import cosine
    from actors.synth.listening import load_speaker_check

    shutil.copy(VECTORS / "wavlm_large_finetune.pth", tmp_path)
    settings = QualitySettings(speaker="wavlm_ecapa", speaker_model=str(tmp_path))
    check = load_speaker_check(settings, "cpu", lambda ref: (clip("a"), RATE))

    class Ref:
        key = "voice-a"

    similarities = check.similarities([clip("a"), clip("b"), clip("c")], [Ref(), Ref(), None], RATE)
    assert similarities[0] == pytest.approx(1.0, abs=1e-6) and similarities[2] is None
    expected = cosine(upstream("b"), upstream("a"))
    assert similarities[1] == pytest.approx(expected, abs=1e-5)
