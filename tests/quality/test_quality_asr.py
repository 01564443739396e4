"""The ASR plumbing on a tiny Whisper with random weights, built and saved here (transformers
makes one offline): loading from a local directory, batching, long clips in 30 s windows, the
transcript columns. Accuracy is not in question: the weights are random."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from actors.errors import ConfigError
from actors.quality.settings import QualitySettings
from tests.helpers import REPO

SR = 44100


def _byte_symbols() -> list[str]:
    # GPT-2's byte-to-unicode table, which Whisper's byte-level BPE reads its vocab.json in
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    codes, extra = printable[:], 0
    for b in range(256):
        if b not in printable:
            codes.append(256 + extra)
            extra += 1
    return [chr(c) for c in codes]


@pytest.fixture(scope="module")
def tiny_whisper(tmp_path_factory):
    pytest.importorskip("transformers")
    import torch
    from transformers import (
        GenerationConfig,
        WhisperConfig,
        WhisperFeatureExtractor,
        WhisperForConditionalGeneration,
        WhisperProcessor,
        WhisperTokenizer,
    )

    folder = tmp_path_factory.mktemp("whisper")
    (folder / "vocab.json").write_text(json.dumps({s: i for i, s in enumerate(_byte_symbols())}))
    (folder / "merges.txt").write_text("#version: 0.2\n")
    end = "<|endoftext|>"
    tokenizer = WhisperTokenizer(
        str(folder / "vocab.json"),
        str(folder / "merges.txt"),
        unk_token=end,
        bos_token=end,
        eos_token=end,
        pad_token=end,
    )
    specials = ["<|startoftranscript|>", "<|en|>", "<|transcribe|>", "<|translate|>", "<|notimestamps|>"]
    tokenizer.add_special_tokens({"additional_special_tokens": specials})
    ids = {s: tokenizer.convert_tokens_to_ids(s) for s in [end, *specials]}
    WhisperProcessor(feature_extractor=WhisperFeatureExtractor(feature_size=80), tokenizer=tokenizer).save_pretrained(
        folder
    )
    config = WhisperConfig(
        vocab_size=len(tokenizer),
        num_mel_bins=80,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        d_model=16,
        encoder_ffn_dim=32,
        decoder_ffn_dim=32,
        max_target_positions=448,
        decoder_start_token_id=ids["<|startoftranscript|>"],
        eos_token_id=ids[end],
        pad_token_id=ids[end],
        bos_token_id=ids[end],
    )
    torch.manual_seed(0)
    model = WhisperForConditionalGeneration(config)
    model.generation_config = GenerationConfig(
        max_length=10,  # a few tokens per window: the plumbing, not the text, is under test
        decoder_start_token_id=ids["<|startoftranscript|>"],
        bos_token_id=ids[end],
        eos_token_id=ids[end],
        pad_token_id=ids[end],
        no_timestamps_token_id=ids["<|notimestamps|>"],
        is_multilingual=True,
        lang_to_id={"<|en|>": ids["<|en|>"]},
        task_to_id={"transcribe": ids["<|transcribe|>"], "translate": ids["<|translate|>"]},
        # random weights: keep them off the special tokens so the transcripts hold text
        suppress_tokens=[ids[s] for s in specials],
        begin_suppress_tokens=[ids[end]],
    )
    model.save_pretrained(folder)
    return str(folder)


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


def test_a_long_clip_is_heard_in_30_s_windows(tiny_whisper):
    from actors.quality.asr import WHISPER_RATE, WhisperASR

    asr = WhisperASR(tiny_whisper, batch_rows=4)
    long = (np.random.default_rng(1).standard_normal(35 * WHISPER_RATE) * 0.1).astype(np.float32)
    first, rest = asr.transcribe([long[: 30 * WHISPER_RATE], long[30 * WHISPER_RATE :]], WHISPER_RATE)
    assert asr.transcribe([long], WHISPER_RATE) == [" ".join(t for t in (first.strip(), rest.strip()) if t)]


def test_the_columns_score_each_row_against_its_text(tiny_whisper):
    from actors.quality.asr import load_asr
    from actors.quality.text import char_error_rate, word_error_rate

    asr = load_asr(QualitySettings(asr="whisper", asr_model=tiny_whisper, asr_batch_rows=2), device="cpu")
    texts = ["hello there", "a longer sentence to say", "one"]
    scored = asr.score(clips(), SR, texts)
    assert [s.asr_text for s in scored] == asr.transcribe(clips(), SR)
    for text, s in zip(texts, scored):
        assert s.wer == word_error_rate(text, s.asr_text) and s.cer == char_error_rate(text, s.asr_text)
        assert s.wer > 0  # random weights do not say the text


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
    from actors.quality.text import word_error_rate
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
        assert row[S.WER] == word_error_rate(text, row[S.ASR_TEXT])
    # the rows are transcribed from their own audio: as the backend hears the decoded FLAC
    heard = actor.gate.asr.transcribe([decode_flac(r) for r in out], out[0][S.SAMPLE_RATE])
    assert [r[S.ASR_TEXT] for r in out] == heard


def decode_flac(row: dict) -> np.ndarray:
    import io

    import soundfile as sf

    from actors import schema as S

    return sf.read(io.BytesIO(row["audio"][S.AUDIO_BYTES]), dtype="float32")[0]
