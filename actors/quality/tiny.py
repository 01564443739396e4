"""Tiny models in the formats the optional quality checks load (actors/quality/asr.py,
speaker.py, mos.py), for tests and benchmarks: nothing of the real models can be downloaded
here, so the loading, batching, long-form decoding, columns and caching are exercised on these;
their scores mean nothing.

    python -m actors.quality.tiny OUT_DIR    # OUT_DIR/whisper/, wavlm-sv/, sig_bak_ovr.onnx
"""

from __future__ import annotations

import sys
from pathlib import Path

from actors.quality.mos import INPUT_NAME, WINDOW_SAMPLES

# Whisper's special tokens after <|endoftext|>, in the order of OpenAI's multilingual
# vocabulary (languages after <|startoftranscript|>), then 1,501 timestamps <|0.00|>..<|30.00|>
# right after <|notimestamps|>: the long-form decoder finds them as no_timestamps_token_id + 1
WHISPER_END = "<|endoftext|>"
WHISPER_TASKS = ("<|translate|>", "<|transcribe|>", "<|startoflm|>", "<|startofprev|>", "<|nospeech|>")
WHISPER_TIMESTAMPS = 1501


def _byte_symbols() -> list[str]:
    """GPT-2's byte-to-unicode table, the alphabet Whisper's byte-level BPE vocab.json is in."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    codes, extra = printable[:], 0
    for b in range(256):
        if b not in printable:
            codes.append(256 + extra)
            extra += 1
    return [chr(c) for c in codes]


def _tiny_whisper_tokenizer(folder: Path, languages: tuple):
    """Whisper's tokenizer files with the 256 byte symbols as the whole vocabulary (no merges)."""
    import json

    from transformers import AddedToken, WhisperTokenizer

    (folder / "vocab.json").write_text(json.dumps({s: i for i, s in enumerate(_byte_symbols())}))
    (folder / "merges.txt").write_text("#version: 0.2\n")
    end = WHISPER_END
    tokenizer = WhisperTokenizer(
        str(folder / "vocab.json"),
        str(folder / "merges.txt"),
        unk_token=end,
        bos_token=end,
        eos_token=end,
        pad_token=end,
    )
    specials = ["<|startoftranscript|>", *(f"<|{code}|>" for code in languages), *WHISPER_TASKS, "<|notimestamps|>"]
    tokenizer.add_special_tokens({"additional_special_tokens": specials})
    stamps = [AddedToken(f"<|{i * 0.02:.2f}|>", special=False, normalized=False) for i in range(WHISPER_TIMESTAMPS)]
    tokenizer.add_tokens(stamps)
    return tokenizer


def _tiny_whisper_generation(ids, languages: tuple, max_length: int):
    """OpenAI's generation config in shape: languages, tasks, timestamps."""
    from transformers import GenerationConfig

    end, start = ids(WHISPER_END), ids("<|startoftranscript|>")
    return GenerationConfig(
        max_length=max_length,
        decoder_start_token_id=start,
        bos_token_id=end,
        eos_token_id=end,
        pad_token_id=end,
        no_timestamps_token_id=ids("<|notimestamps|>"),
        prev_sot_token_id=ids("<|startofprev|>"),
        max_initial_timestamp_index=50,
        is_multilingual=True,
        lang_to_id={f"<|{code}|>": ids(f"<|{code}|>") for code in languages},
        task_to_id={"transcribe": ids("<|transcribe|>"), "translate": ids("<|translate|>")},
        # random weights: keep them off the special tokens so the transcripts hold text
        suppress_tokens=[ids(s) for s in WHISPER_TASKS],
        begin_suppress_tokens=[end],
    )


def build_tiny_whisper(folder: Path, languages: tuple = ("en", "zh", "de"), max_length: int = 24) -> Path:
    """A tiny multilingual Whisper as `save_pretrained` writes it (config, weights, generation
    config, tokenizer with timestamp tokens, feature extractor), seeded random weights. Its
    generation config is OpenAI's in shape: languages, tasks, timestamps; `max_length` tokens
    per 30 s window (few: the decoding, not the text, is under test)."""
    import torch
    from transformers import (
        WhisperConfig,
        WhisperFeatureExtractor,
        WhisperForConditionalGeneration,
        WhisperProcessor,
    )

    tokenizer = _tiny_whisper_tokenizer(folder, languages)
    ids = tokenizer.convert_tokens_to_ids
    WhisperProcessor(feature_extractor=WhisperFeatureExtractor(feature_size=80), tokenizer=tokenizer).save_pretrained(
        folder
    )
    end, start = ids(WHISPER_END), ids("<|startoftranscript|>")
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
        decoder_start_token_id=start,
        eos_token_id=end,
        pad_token_id=end,
        bos_token_id=end,
    )
    torch.manual_seed(0)
    model = WhisperForConditionalGeneration(config)
    with torch.no_grad():
        # the timestamps are most of this vocabulary: at full scale random weights say nothing
        # else; halved, a window holds text and some timestamps, and long-form decoding seeks
        # by them (a window starting before 30 s and ending after it)
        model.model.decoder.embed_tokens.weight[ids("<|notimestamps|>") + 1 :] *= 0.5
    model.generation_config = _tiny_whisper_generation(ids, languages, max_length)
    model.save_pretrained(folder)
    return folder


def build_tiny_wavlm(folder: Path) -> Path:
    """A tiny WavLM x-vector model and its feature extractor, as `save_pretrained` writes them
    (wavlm-base-plus-sv's conv stack and TDNN kernels, small widths, seeded random weights)."""
    import torch
    from transformers import Wav2Vec2FeatureExtractor, WavLMConfig, WavLMForXVector

    torch.manual_seed(0)
    config = WavLMConfig(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        conv_dim=(16,) * 7,
        num_conv_pos_embeddings=16,
        num_conv_pos_embedding_groups=2,
        num_buckets=16,
        max_bucket_distance=64,
        tdnn_dim=(16, 16, 16, 16, 32),
        xvector_output_dim=16,
    )
    WavLMForXVector(config).save_pretrained(folder)
    Wav2Vec2FeatureExtractor(
        feature_size=1, sampling_rate=16000, padding_value=0.0, do_normalize=True, return_attention_mask=True
    ).save_pretrained(folder)
    return folder


def build_tiny_dnsmos(path, width=WINDOW_SAMPLES, batch="N", input_name=INPUT_NAME) -> str:
    """A tiny ONNX model with the published DNSMOS sig_bak_ovr.onnx's signature (input `input_1`
    float32 [N, 144160], output `Identity:0` float32 [N, 3]); its outputs are 1 + 4 * (first
    sample, last sample, mean) of each window, so a test can read what it saw."""
    import onnx
    from onnx import TensorProto, helper

    def ints(name, values):
        return helper.make_tensor(name, TensorProto.INT64, [len(values)], values)

    nodes = [
        helper.make_node("Slice", [input_name, "zero", "one", "axis1"], ["first"]),
        helper.make_node("Slice", [input_name, "minus_one", "end", "axis1"], ["last"]),
        helper.make_node("ReduceMean", [input_name], ["mean"], axes=[1], keepdims=1),
        helper.make_node("Concat", ["first", "last", "mean"], ["seen"], axis=1),
        helper.make_node("Mul", ["seen", "four"], ["scaled"]),
        helper.make_node("Add", ["scaled", "one_f"], ["Identity:0"]),
    ]
    constants = [
        ints("zero", [0]),
        ints("one", [1]),
        ints("minus_one", [-1]),
        ints("end", [2**62]),
        ints("axis1", [1]),
        helper.make_tensor("four", TensorProto.FLOAT, [], [4.0]),
        helper.make_tensor("one_f", TensorProto.FLOAT, [], [1.0]),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny_dnsmos",
        [helper.make_tensor_value_info(input_name, TensorProto.FLOAT, [batch, width])],
        [helper.make_tensor_value_info("Identity:0", TensorProto.FLOAT, [batch, 3])],
        initializer=constants,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8  # loadable by every onnxruntime >= 1.17
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return str(path)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    out = Path(argv[0])
    for name in ("whisper", "wavlm-sv"):
        (out / name).mkdir(parents=True, exist_ok=True)
    build_tiny_whisper(out / "whisper")
    build_tiny_wavlm(out / "wavlm-sv")
    build_tiny_dnsmos(out / "sig_bak_ovr.onnx")
    print(
        f"tiny check models in {out}: whisper/ (quality.asr_model), wavlm-sv/ (quality.speaker_model), "
        "sig_bak_ovr.onnx (quality.mos_model)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
