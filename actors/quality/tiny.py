"""Tiny models in the formats the optional quality checks load (actors/quality/speaker.py,
mos.py), for tests and benchmarks: nothing of the real models can be downloaded here, so the
loading, batching, columns and caching are exercised on these; their scores mean nothing.

    python -m actors.quality.tiny OUT_DIR    # OUT_DIR/wavlm-sv/ and OUT_DIR/sig_bak_ovr.onnx
"""

from __future__ import annotations

import sys
from pathlib import Path

from actors.quality.mos import INPUT_NAME, WINDOW_SAMPLES


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
    (out / "wavlm-sv").mkdir(parents=True, exist_ok=True)
    build_tiny_wavlm(out / "wavlm-sv")
    build_tiny_dnsmos(out / "sig_bak_ovr.onnx")
    print(f"tiny check models in {out}: wavlm-sv/ (quality.speaker_model), sig_bak_ovr.onnx (quality.mos_model)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
