"""The GPU memory plan's arithmetic (actors/synth/memory_plan.py): parts, slots, the share left
to the engine's own sizing, the refusal that names the parts; and the parts' sizes read from
real checkpoint files (safetensors headers) and configs, at the real model shapes."""

from __future__ import annotations

import json
import struct
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from actors.codec.config import CodecConfig
from actors.engine.architecture import parse_config
from actors.engine.slots import slot_bytes, slots_that_fit
from actors.engine.tiny import SIZES, config_dict
from actors.errors import ConfigError
from actors.synth import memory_plan as M
from actors.synth.presets import engine_settings
from actors.synth.settings import ActorSettings

GiB = M.GiB
ECAPA_VECTORS = Path(__file__).resolve().parents[1] / "vectors" / "upstream-wavlm-ecapa"
H200 = 143771 * M.MiB  # what an H200 reports (nvidia-smi: 143,771 MiB)


def architecture(size: str):
    fmt = "s2" if size == "s2-pro" else "s1"
    return parse_config(config_dict(fmt, SIZES[size], 4096), size)


def gpu_plan(size: str, total: int = H200, **parts) -> M.MemoryPlan:
    """The plan of `size` with engine=gpu's settings (bf16 model and codec)."""
    mc, engine = architecture(size), engine_settings("gpu")
    settings = ActorSettings(engine=engine)
    defaults = {
        "weights": mc.parameter_count * 2,
        "codec": 391_398_385 * 2,  # the real codec's parameters (CodecConfig.real())
        "codec_batches": M.decode_budget(settings, CodecConfig.real(), torch.device("cuda"), torch.bfloat16)
        + M.codec_batch_bytes(M.codec_call_samples(settings, 2048), 2),
        "checks": 0,
        "workspace": M.WORKSPACE_BYTES,
    }
    return M.MemoryPlan(
        total=total,
        in_use=600 * M.MiB,  # the CUDA context
        parts={**defaults, **parts},
        slot_bytes=slot_bytes(mc, engine.engine_config(), 2),
        max_rows=engine.max_rows,
        fraction=engine.memory_fraction,
    )


def test_the_real_shapes_on_an_h200():
    s1, s2 = gpu_plan("s1-mini").check(), gpu_plan("s2-pro").check()
    assert s1.slots == 256  # every slot engine=gpu asks for
    assert 200 <= s2.slots < 256  # S2-Pro's slots: its 4.5B parameters and wider K/V leave fewer
    # S1-mini 0.70B parameters, S2-Pro 4.56B, in bf16
    assert 8 * GiB < s2.parts["weights"] < 9 * GiB and 1.2 * GiB < s1.parts["weights"] < 1.4 * GiB
    # every byte accounted for within the budget
    for plan in (s1, s2):
        assert plan.fixed + plan.slots * plan.slot_bytes <= plan.budget == int(0.85 * H200)
    assert s2.fixed + (s2.slots + 1) * s2.slot_bytes > s2.budget  # and no slot more fits
    described = s2.describe()
    assert described["slots"] == s2.slots and described["parts_gib"]["workspace"] == 2.0


def test_the_engines_own_sizing_leaves_the_parts_loaded_after_it():
    # the engine sizes slots from the memory free once the weights and codec are on the device;
    # told engine_fraction(), it leaves the codec's batches, the checks and the workspace free
    plan = gpu_plan("s2-pro", checks=3 * GiB)
    free_when_built = plan.total - plan.in_use - plan.parts["weights"] - plan.parts["codec"]
    engine_slots = slots_that_fit(free_when_built, plan.total, plan.engine_fraction(), plan.slot_bytes)
    assert min(engine_slots, plan.max_rows) == plan.slots
    without_checks = gpu_plan("s2-pro")
    assert without_checks.slots > plan.slots  # the checks' 3 GiB cost slots
    assert gpu_plan("s2-pro", checks=3 * GiB, codec_batches=0).engine_fraction() > plan.engine_fraction()


def test_a_plan_that_cannot_fit_names_its_parts():
    small = gpu_plan("s2-pro", total=16 * GiB)  # the parts fill 0.85 of 16 GiB
    assert small.slots == 0
    with pytest.raises(ConfigError) as e:
        small.check()
    message = str(e.value)
    assert (
        f"weights {small.parts['weights'] / GiB:.2f}," in message
        and "engine.max_tokens" in message
        and "memory_fraction=0.85" in message
    )
    # without memory_fraction every one of max_rows slots must fit the whole device
    fixed = replace(gpu_plan("s1-mini", total=80 * GiB), fraction=None)
    assert fixed.slots < fixed.max_rows
    with pytest.raises(ConfigError, match="the whole device"):
        fixed.check()
    assert replace(fixed, max_rows=fixed.slots).check().slots == fixed.slots
    assert fixed.engine_fraction() is None


def test_a_decode_call_is_planned_at_its_longest():
    settings = ActorSettings(engine=engine_settings("gpu"))  # 16 rows, model.budget.max_frames 1024, bucket 16
    row = 1024 * 2048
    assert M.codec_call_samples(settings, 2048) == max(row, min(16 * row, 2**21))
    assert M.codec_call_samples(settings, 2048, max_batch_samples=16 * row) == 16 * row  # a memory-sized cap
    odd = ActorSettings(engine=replace(engine_settings("gpu"), codec_batch_rows=2))
    odd.model.budget.max_frames = 1000
    assert M.codec_call_samples(odd, 2048, max_batch_samples=10**9) == 2 * 1008 * 2048  # padded to the bucket
    assert M.codec_batch_bytes(1000, 2) == 1000 * (M.CODEC_VALUES_PER_SAMPLE * 2 + 4)
    # on a GPU a decode call is 16 rows up to 2^23 samples, at the fused bf16 path's ~772 bytes
    # a sample (the real codec): ~6.5 GB, told to the codec at load
    budget = M.decode_budget(settings, CodecConfig.real(), torch.device("cuda"), torch.bfloat16)
    assert 2**23 * 772 < budget < 2**23 * 773
    assert M.decode_budget(settings, CodecConfig.real(), torch.device("cuda"), torch.bfloat16, 1000) < 773_000


def write_safetensors(path, tensors: dict) -> None:
    header = {name: {"dtype": "F16", "shape": shape, "data_offsets": [0, 0]} for name, shape in tensors.items()}
    header["__metadata__"] = {"format": "pt"}
    blob = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(blob)) + blob)


def test_stored_parameters_from_headers_and_file_sizes(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    write_safetensors(model / "model-00001.safetensors", {"a": [10, 20], "b": [5]})
    write_safetensors(model / "model-00002.safetensors", {"c": [3, 4, 5]})
    assert M.stored_parameters(model) == 200 + 5 + 60
    onnx = tmp_path / "sig_bak_ovr.onnx"
    onnx.write_bytes(b"\0" * 4000)
    assert M.stored_parameters(onnx) == 1000  # float32 assumed


def test_the_check_models_sizes_from_their_configs(tmp_path):
    whisper, wavlm = tmp_path / "whisper", tmp_path / "wavlm"
    for folder, config, tensors in (
        (whisper, {"d_model": 8, "max_source_positions": 10, "decoder_layers": 2, "max_target_positions": 6,
                   "encoder_ffn_dim": 32}, {"w": [100]}),
        (wavlm, {"num_attention_heads": 2, "hidden_size": 4}, {"w": [50]}),
    ):  # fmt: skip
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(config))
        write_safetensors(folder / "model.safetensors", tensors)
    per_window = 2 * 2 * (10 + 6) * 8 + 10 * (32 + 4 * 8)
    assert M.whisper_bytes(whisper, 3) == 2 * (100 + 3 * per_window)
    frames = 2 * M.WAVLM_FRAMES_PER_S + 1
    assert M.wavlm_bytes(wavlm, 2.0) == 2 * (50 + 2 * 2 * frames * frames + 8 * frames * 4)
    quality = ActorSettings().quality
    assert M.check_model_bytes(quality, 2.0) == 0  # none set
    both = replace(quality, asr="whisper", asr_model=str(whisper), asr_batch_rows=3, speaker="wavlm",
                   speaker_model=str(wavlm))  # fmt: skip
    assert M.check_model_bytes(both, 2.0) == M.whisper_bytes(whisper, 3) + M.wavlm_bytes(wavlm, 2.0)
    onnx = tmp_path / "sig_bak_ovr.onnx"
    onnx.write_bytes(b"\0" * 4000)
    every = replace(both, mos="dnsmos", mos_model=str(onnx))
    assert M.check_model_bytes(every, 2.0) == M.check_model_bytes(both, 2.0) + 4000
    # Seed-TTS-eval's speaker model: its published file, float32, at WavLM-Large's shape
    ecapa = replace(quality, speaker="wavlm_ecapa", speaker_model=str(ECAPA_VECTORS))
    stored = (ECAPA_VECTORS / M.WAVLM_ECAPA_FILE).stat().st_size // 4
    frames = 2 * M.WAVLM_FRAMES_PER_S + 1
    pass_bytes = 2 * 16 * frames * frames + 8 * frames * 1024 + 25 * frames * 1024
    assert M.check_model_bytes(ecapa, 2.0) == 4 * (stored + pass_bytes)


def test_the_plan_of_real_files_before_anything_loads(monkeypatch, tmp_path):
    # no GPU here: the device's free and total memory are handed in; the parts come from the
    # demo's checkpoint and codec files as device_plan reads them on a GPU
    from actors.codec.config import CONFIG_FILE_NAME
    from actors.codec.hydra_tree import read_file
    from actors.engine.architecture import load_config
    from actors.synth.demo_models import demo_assets

    checkpoint, codec = demo_assets(tmp_path)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (70 * GiB, 80 * GiB))
    settings = ActorSettings(engine=engine_settings("gpu"))
    bf16 = (torch.bfloat16, torch.bfloat16)
    plan = M.device_plan(settings, checkpoint, codec, torch.device("cuda"), bf16, None)
    mc = load_config(checkpoint)
    assert plan.parts["weights"] == mc.parameter_count * 2
    assert plan.parts["codec"] == (codec / "codec.pth").stat().st_size // 4 * 2
    assert plan.parts["checks"] == 0 and plan.in_use == 10 * GiB and plan.total == 80 * GiB
    assert plan.slot_bytes == slot_bytes(mc, settings.engine.engine_config(), 2) and plan.slots == 256
    config = read_file(codec / CONFIG_FILE_NAME)  # the demo codec's shape (512-sample frames)
    encode = M.codec_batch_bytes(M.codec_call_samples(settings, 512), 2)
    decode = M.decode_budget(settings, config, torch.device("cuda"), torch.bfloat16)
    assert plan.decode_budget == decode and plan.parts["codec_batches"] == decode + encode
    smaller = M.device_plan(settings, checkpoint, codec, torch.device("cuda"), bf16, 1000)
    assert smaller.decode_budget == M.decode_budget(settings, config, torch.device("cuda"), torch.bfloat16, 1000)
    assert smaller.parts["codec_batches"] == smaller.decode_budget + encode  # a cap the caller states
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (GiB, 2 * GiB))
    with pytest.raises(ConfigError, match="workspace 2.00"):  # refused before any weights load
        M.device_plan(settings, checkpoint, codec, torch.device("cuda"), bf16, None)
    measured = plan.measured(slots=200, weights=GiB).measured(checks=GiB // 2)
    assert measured.describe()["measured"] == {"slots": 200, "weights": 1.0, "checks": 0.5}
