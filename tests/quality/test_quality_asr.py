"""The ASR plumbing on a tiny Whisper with random weights in the real on-disk format
(actors/quality/tiny.py: OpenAI's special and timestamp tokens, its generation config's shape):
loading from a local directory, batching, long clips by transformers' long-form decoding, the
language and the transcript columns. Accuracy is not in question: the weights are random."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from actors.errors import ConfigError
from actors.quality.settings import QualitySettings
from tests.helpers import REPO

SR = 44100


@pytest.fixture(scope="module")
def tiny_whisper(tmp_path_factory):
    pytest.importorskip("transformers")
    from actors.quality.tiny import build_tiny_whisper

    return str(build_tiny_whisper(tmp_path_factory.mktemp("whisper")))


def clips() -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [(rng.standard_normal(int(s * SR)) * 0.1).astype(np.float32) for s in (0.8, 2.5, 1.2)]


def test_transcripts_do_not_depend_on_the_batch(tiny_whisper):
    from actors.quality.asr import WhisperASR

    asr = WhisperASR(tiny_whisper, batch_rows=8, language="en")
    together = asr.transcribe(clips(), SR)
    alone = [asr.transcribe([clip], SR)[0] for clip in clips()]
    pairs = WhisperASR(tiny_whisper, batch_rows=2, language="en").transcribe(clips(), SR)
    assert len(together) == 3 and all(isinstance(t, str) for t in together)
    assert any(together), "random weights with the specials suppressed should still say something"
    assert together == alone == pairs


def long_clip(seconds: float = 35.0, seed: int = 1) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(int(seconds * 16000)) * 0.1).astype(np.float32)


def test_a_clip_over_30_s_is_decoded_long_form_by_the_library(tiny_whisper):
    """A 35 s row goes through transformers' sequential long-form generation (timestamps, the
    next window from the last one predicted), not cut at 30 s: its transcript is what that
    generation gives for the whole clip, and neither 30 s cut's texts joined."""
    import torch

    from actors.quality.asr import WHISPER_RATE, WhisperASR

    asr = WhisperASR(tiny_whisper, batch_rows=4, language="en")
    clip = long_clip()
    features = asr.processor.feature_extractor(
        clip, sampling_rate=WHISPER_RATE, return_tensors="pt", truncation=False, padding="longest"
    ).input_features
    assert features.shape[-1] == 3500  # 35 s of 10 ms frames: more than one window
    with torch.inference_mode():
        out = asr.model.generate(
            features, return_timestamps=True, language="en", task="transcribe", return_segments=True
        )
    library = asr.processor.batch_decode(out["sequences"], skip_special_tokens=True)[0].strip()
    # a segment the model placed across the 30 s mark: the second window began where the
    # first one's last timestamp was, not at a fixed cut
    assert any(seg["start"] < 30.0 < seg["end"] for seg in out["segments"][0])
    assert asr.transcribe([clip], WHISPER_RATE) == [library]
    cut = asr.transcribe([clip[: 30 * WHISPER_RATE], clip[30 * WHISPER_RATE :]], WHISPER_RATE)
    assert library != " ".join(cut)


@pytest.mark.slow
def test_long_clips_do_not_depend_on_their_batch(tiny_whisper):
    from actors.quality.asr import WHISPER_RATE, WhisperASR

    mixed = [long_clip(35.0, 1), clips()[0], long_clip(47.5, 2), clips()[1]]
    batched = WhisperASR(tiny_whisper, batch_rows=4, language="en").hear(mixed, WHISPER_RATE)
    alone = WhisperASR(tiny_whisper, batch_rows=1, language="en").hear(mixed, WHISPER_RATE)
    assert batched == alone and all(h.language == "en" for h in batched)


def test_the_language_is_detected_when_not_given(tiny_whisper):
    import torch

    from actors.audio import resample
    from actors.quality.asr import WhisperASR

    asr = WhisperASR(tiny_whisper, batch_rows=8)
    heard = asr.hear(clips(), SR)
    assert all(h.language in ("en", "zh", "de") for h in heard)
    # the language detect_language gives, and the text generate gives when left to detect it itself
    # (OpenAI's prompt: start, language, transcribe, no timestamps)
    alone = asr.hear([clips()[0]], SR)[0]
    wave = resample(clips()[0], SR, 16000)
    features = asr.processor.feature_extractor(wave, sampling_rate=16000, return_tensors="pt").input_features
    with torch.inference_mode():
        tokens = asr.model.generate(features, task="transcribe")
    assert alone.text == asr.processor.batch_decode(tokens, skip_special_tokens=True)[0].strip()


def test_the_columns_score_each_row_against_its_text(tiny_whisper):
    from actors.quality.asr import load_asr
    from actors.quality.text import ENGLISH, char_error_rate, recipe_for, word_error_rate

    asr = load_asr(QualitySettings(asr="whisper", asr_model=tiny_whisper, asr_batch_rows=2), device="cpu")
    texts = ["hello there", "a longer sentence to say", "one"]
    scored = asr.score(clips(), SR, texts)
    assert [s.asr_text for s in scored] == asr.transcribe(clips(), SR)
    for text, s in zip(texts, scored):
        assert s.recipe == recipe_for(s.language)
        assert s.wer == word_error_rate(text, s.asr_text, s.recipe)
        assert s.cer == char_error_rate(text, s.asr_text, s.recipe)
        assert s.wer > 0  # random weights do not say the text
    english = load_asr(QualitySettings(asr="whisper", asr_model=tiny_whisper, asr_language="English"), "cpu")
    assert {(s.language, s.recipe) for s in english.score(clips(), SR, texts)} == {("en", ENGLISH)}


def test_a_missing_model_directory_names_the_key(tmp_path):
    pytest.importorskip("transformers")
    from actors.quality.asr import load_asr

    with pytest.raises(ConfigError, match="quality.asr_model: .* is not a Whisper model directory"):
        load_asr(QualitySettings(asr="whisper", asr_model=str(tmp_path)), device="cpu")


def test_without_asr_nothing_of_it_is_imported():
    code = (
        "import sys\n"
        "from actors.quality.asr import load_asr\n"
        "from actors.quality.settings import QualitySettings\n"
        "assert load_asr(QualitySettings(), 'cpu') is None\n"
        "assert 'transformers' not in sys.modules and 'torch' not in sys.modules, sorted(sys.modules)\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True)


def test_the_actor_transcribes_its_rows(tiny_whisper, small_settings):
    import pyarrow as pa

    from actors import schema as S
    from actors.quality.text import recipe_for, word_error_rate
    from actors.synth import SynthActor
    from pipeline.config import compose_typed
    from pipeline.run.actor_settings import actor_arguments

    overrides = ["quality.asr=whisper", f"quality.asr_model={tiny_whisper}", "quality.asr_batch_rows=2"]
    actor = SynthActor(**actor_arguments(compose_typed(small_settings + overrides), None, run_id="asr"))
    texts = ["First sentence.", "A second one.", "And a third."]
    table = pa.table({S.ID: ["a", "b", "c"], S.TEXT: texts, S.SEED: pa.array([1, 2, 3], pa.int64())})
    out = actor(table).to_pylist()
    assert [r[S.STATUS] for r in out] == [S.STATUS_OK] * 3
    for text, row in zip(texts, out):
        assert isinstance(row[S.ASR_TEXT], str) and row[S.CER] is not None
        assert row[S.WER_RECIPE] == recipe_for(row[S.ASR_LANGUAGE]) and row[S.ASR_LANGUAGE] in ("en", "zh", "de")
        assert row[S.WER] == word_error_rate(text, row[S.ASR_TEXT], row[S.WER_RECIPE])
    # the rows are transcribed from their own audio: as the backend hears the decoded FLAC
    heard = actor.gate.asr.transcribe([decode_flac(r) for r in out], out[0][S.SAMPLE_RATE])
    assert [r[S.ASR_TEXT] for r in out] == heard


def decode_flac(row: dict) -> np.ndarray:
    import io

    import soundfile as sf

    from actors import schema as S

    return sf.read(io.BytesIO(row["audio"][S.AUDIO_BYTES]), dtype="float32")[0]
