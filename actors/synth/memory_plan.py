"""The memory plan of a GPU actor: what one device holds, part by part, worked out before anything
is loaded and checked against the device, so that an actor that cannot fit stops at once with a
message naming the parts, and one that fits never runs out of memory while it runs.

    budget = engine.memory_fraction x the device's memory (1.0 without it)
           = in use before the actor (the CUDA context, other processes)
           + weights (the model's parameters, in its dtype)
           + codec (its parameters, in the codec's dtype)
           + codec batches (the largest decode call's activations, and a reference's encode)
           + checks (ASR and speaker models in half precision, and their activations)
           + workspace (cuBLAS and cuDNN workspaces, the CUDA graphs' pools, the allocator's rounding)
           + slots x slot bytes (each slot's K/V and step activations: actors/engine/slots.py)

The slots are what is left; the engine still sizes them itself, from the memory free when it is
built (actors/engine/slots.py, sized_to_memory), told to leave the parts loaded after it
(`engine_fraction`). What loading measured afterwards (weights, codec, the engine's slots and
K/V) is set beside the plan (`MemoryPlan.measured`) and logged; scripts/gpu_job.py records both
and the device's peak. The arithmetic is here, torch-free; the sizes of the parts come from the
checkpoints' headers and configs (`part_sizes` below, and loading.py).
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Optional

from actors.errors import ConfigError
from actors.quality.settings import WAVLM_ECAPA_FILE, QualitySettings
from actors.synth.settings import ActorSettings

GiB = 1 << 30
MiB = 1 << 20
# cuBLAS / cuDNN workspaces (per stream), the CUDA graphs' memory pools, and the caching
# allocator's rounding and fragmentation (what the device showed beyond the parts is logged)
WORKSPACE_BYTES = 2 * GiB
# The real-size codec's encode holds at most ~194 values per input sample of a call (its
# tensors alive at once, traced per op on CPU: 388 bytes a sample in bf16 at 1-2 rows of 8-16
# frames, its last two blocks at 96 channels x the full rate); 256 leaves room for copies and
# the convolutions' workspaces. Plus the float32 wave. (A decode on the GPU is the codec's own
# figure: actors/codec/device.py's bytes_per_sample.)
CODEC_VALUES_PER_SAMPLE = 256
# The most output samples one decode call holds on a GPU: codec_batch_rows rows, capped here
# (2^23 samples = 190 s of audio, ~6.5 GB at the fused bf16 path's 772 bytes a sample): 16 rows
# of 10 s decode at the codec's full rate, and the rest of the memory stays the engine's slots
GPU_DECODE_SAMPLES = 2**23
WAVE_BYTES_PER_SAMPLE = 4
HALF = 2  # the check models' element size on a GPU (float16)
# WavLM (speaker check): one clip per pass, 50 frames per second of 16 kHz audio; its attention
# holds heads x frames^2 scores (and their softmax) in half precision
WAVLM_FRAMES_PER_S = 50
# Seed-TTS-eval's speaker model: WavLM-Large (16 heads, 1,024 wide, 24 layers)
WAVLM_LARGE_SHAPE = (16, 1024, 24)
PARTS = ("weights", "codec", "codec_batches", "checks", "workspace")
LOADED_BEFORE_ENGINE = ("weights", "codec")  # what the engine's own sizing already sees


@dataclass(frozen=True)
class MemoryPlan:
    """One device's plan (bytes). `fraction` None: the engine's max_rows slots, exactly, must
    fit in the whole device."""

    total: int
    in_use: int
    parts: dict
    slot_bytes: int
    max_rows: int
    fraction: Optional[float] = None
    measured_parts: dict = field(default_factory=dict)  # after loading: what the parts took
    decode_budget: Optional[int] = None  # of codec_batches, what one decode call may hold

    @property
    def budget(self) -> int:
        return int((1.0 if self.fraction is None else self.fraction) * self.total)

    @property
    def fixed(self) -> int:
        """Everything but the slots."""
        return self.in_use + sum(self.parts.values())

    @property
    def slots(self) -> int:
        """The slots the plan leaves room for, at most max_rows."""
        return max(0, min(self.max_rows, (self.budget - self.fixed) // self.slot_bytes))

    def check(self) -> MemoryPlan:
        """The plan itself when it fits: at least one slot, and with engine.memory_fraction unset
        all max_rows of them; ConfigError naming the parts otherwise."""
        wanted = 1 if self.fraction is not None else self.max_rows
        if self.slots >= wanted:
            return self
        share = "the whole device" if self.fraction is None else f"engine.memory_fraction={self.fraction}"
        raise ConfigError(
            f"the GPU's memory does not hold this actor: {_gib(self.budget)} GiB ({share} of {_gib(self.total)}) "
            f"against {_gib(self.fixed + wanted * self.slot_bytes)} GiB for {self.line(wanted)}; lower "
            "engine.max_tokens or engine.codec_batch_rows, turn off quality.asr / quality.speaker, set or raise "
            "engine.memory_fraction, or use a GPU with more memory"
        )

    def engine_fraction(self) -> Optional[float]:
        """The memory_fraction the engine sizes its slots with: the plan's, less the parts not on
        the device yet when the engine is built (they are loaded, or allocated, after it)."""
        if self.fraction is None:
            return None
        later = sum(v for k, v in self.parts.items() if k not in LOADED_BEFORE_ENGINE)
        return self.fraction - later / self.total

    def measured(self, **figures: int) -> MemoryPlan:
        """The plan with what loading measured added: the engine's `slots`, the parts' bytes."""
        return replace(self, measured_parts={**self.measured_parts, **figures})

    def line(self, slots: Optional[int] = None) -> str:
        slots = self.slots if slots is None else slots
        parts = ", ".join(f"{name} {_gib(value)}" for name, value in self.parts.items())
        return (
            f"in use {_gib(self.in_use)}, {parts}, {slots} slots x {self.slot_bytes / MiB:.0f} MiB = "
            f"{_gib(slots * self.slot_bytes)} (GiB)"
        )

    def describe(self) -> dict:
        """The plan as JSON-ready figures (GiB), and what loading measured."""
        planned = {name: round(value / GiB, 3) for name, value in self.parts.items()}
        return {
            "total_gib": round(self.total / GiB, 3),
            "budget_gib": round(self.budget / GiB, 3),
            "in_use_gib": round(self.in_use / GiB, 3),
            "parts_gib": planned,
            "slot_mib": round(self.slot_bytes / MiB, 1),
            "slots": self.slots,
            "kv_gib": round(self.slots * self.slot_bytes / GiB, 3),
            "measured": {k: v if k == "slots" else round(v / GiB, 3) for k, v in self.measured_parts.items()},
        }


def _gib(value: float) -> str:
    return f"{value / GiB:.2f}"


# ---- the parts' sizes, from files and configs (no torch) --------------------------------------
def stored_parameters(path: Path) -> int:
    """Values stored in a model file or folder: from the safetensors headers (exact), else a
    .bin / .pth / .onnx file's bytes / 4 (float32 assumed)."""
    path = Path(path)
    files = sorted(path.glob("*.safetensors")) if path.is_dir() else [path]
    if path.is_dir() and not files:
        files = sorted(p for p in path.iterdir() if p.suffix in (".bin", ".pth", ".pt", ".onnx"))
    total = 0
    for file in files:
        if file.suffix == ".safetensors":
            with open(file, "rb") as f:
                (size,) = struct.unpack("<Q", f.read(8))
                header = json.loads(f.read(size))
            total += sum(math.prod(t["shape"]) for k, t in header.items() if k != "__metadata__")
        else:
            total += file.stat().st_size // 4
    return total


def wavlm_ecapa_bytes(model_path: Path, clip_seconds: float) -> int:
    """Seed-TTS-eval's WavLM-Large ECAPA-TDNN (quality.speaker=wavlm_ecapa) in float32, as
    wavlm_ecapa.py runs it, and one clip's pass at WavLM-Large's shape (the published model's:
    its attention scores, the feed-forward's hidden states, and every layer's input kept for
    the head's weighted sum)."""
    path = Path(model_path)
    if path.is_dir():
        path = path / WAVLM_ECAPA_FILE
    frames = int(clip_seconds * WAVLM_FRAMES_PER_S) + 1
    heads, width, layers = WAVLM_LARGE_SHAPE
    attention = 2 * heads * frames * frames
    hidden = 8 * frames * width + (layers + 1) * frames * width
    return 4 * (stored_parameters(path) + attention + hidden)


def codec_batch_bytes(samples_per_call: int, element_size: int) -> int:
    """The activations of one decode call of `samples_per_call` output samples (all its rows)."""
    return samples_per_call * (CODEC_VALUES_PER_SAMPLE * element_size + WAVE_BYTES_PER_SAMPLE)


def whisper_bytes(model_dir: Path, batch_windows: int) -> int:
    """A Whisper model in half precision and what `batch_windows` 30 s windows add while it
    generates: the cross-attention's K/V over the encoder's frames and the decoder's own K/V in
    every decoder layer, and the encoder's widest activations, per window."""
    config = json.loads((Path(model_dir) / "config.json").read_text())
    width, frames = config["d_model"], config["max_source_positions"]
    kv = 2 * config["decoder_layers"] * (frames + config["max_target_positions"]) * width
    encoder = frames * (config["encoder_ffn_dim"] + 4 * width)
    return HALF * (stored_parameters(model_dir) + batch_windows * (kv + encoder))


def wavlm_bytes(model_dir: Path, clip_seconds: float) -> int:
    """A WavLM x-vector model in half precision and one clip's pass of `clip_seconds`: its
    attention scores (and softmax) in every head, and the hidden states (x4 in the feed-forward)."""
    config = json.loads((Path(model_dir) / "config.json").read_text())
    frames = int(clip_seconds * WAVLM_FRAMES_PER_S) + 1
    attention = 2 * config["num_attention_heads"] * frames * frames
    hidden = 8 * frames * config["hidden_size"]
    return HALF * (stored_parameters(model_dir) + attention + hidden)


def codec_call_samples(settings: ActorSettings, frame_length: int, max_batch_samples: Optional[int] = None) -> int:
    """The most output samples one decode call of the finisher holds: codec_batch_rows rows of
    at most model.budget.max_frames frames (padded to the frame bucket), cut at `max_batch_samples` (None:
    the codec's decode_batch default), except that one row longer than that is a call alone."""
    from actors.codec.model import DEFAULT_MAX_BATCH_SAMPLES

    engine = settings.engine
    row = -(-settings.model.budget.max_frames // engine.codec_frame_bucket) * engine.codec_frame_bucket * frame_length
    cap = DEFAULT_MAX_BATCH_SAMPLES if max_batch_samples is None else max_batch_samples
    return max(row, min(engine.codec_batch_rows * row, cap))


def decode_budget(settings: ActorSettings, codec_config, device, dtype, samples: Optional[int] = None) -> int:
    """The device bytes one decode call of the finisher may hold on a GPU: `samples` output
    samples (None: codec_call_samples capped at GPU_DECODE_SAMPLES) at the codec's own bytes per
    sample for the path `auto` picks there. The codec is told this budget at load, so its calls
    stay inside the plan."""
    from actors.codec.device import bytes_per_sample, resolve_backend

    if samples is None:
        samples = codec_call_samples(settings, codec_config.frame_length, GPU_DECODE_SAMPLES)
    per_sample = bytes_per_sample(codec_config, dtype, resolve_backend("auto", device, dtype))
    return math.ceil(samples * per_sample)


def check_model_bytes(quality: QualitySettings, clip_seconds: float) -> int:
    """The check models the actor may load onto the GPU with their activations: ASR, the
    x-vector speaker model (float16) or Seed-TTS-eval's (float32), and DNSMOS's float32 file (on the GPU where onnxruntime has CUDA; a few MB)."""
    total = 0
    if quality.asr is not None:
        total += whisper_bytes(Path(quality.asr_model), quality.asr_batch_rows)
    if quality.speaker == "wavlm_ecapa":
        total += wavlm_ecapa_bytes(Path(quality.speaker_model), clip_seconds)
    elif quality.speaker is not None:
        total += wavlm_bytes(Path(quality.speaker_model), clip_seconds)
    if quality.mos is not None:
        total += 4 * stored_parameters(Path(quality.mos_model))
    return total


def device_plan(
    settings: ActorSettings, checkpoint: Path, codec_path: Path, device, dtypes: tuple, codec_samples: Optional[int]
) -> MemoryPlan:
    """The plan for `device` (CUDA) before anything is loaded: the model's and the codec's
    parameters from their configs and files, in `dtypes` (model, codec), the codec's calls of
    `codec_samples` (None: codec_call_samples), the check models from their folders, the slots
    from the engine's own slot_bytes; checked (ConfigError when it cannot fit)."""
    import torch

    from actors.codec.config import CONFIG_FILE_NAME, CodecConfig
    from actors.codec.hydra_tree import read_file
    from actors.codec.loader import CHECKPOINT_FILE_NAME
    from actors.engine.architecture import load_config
    from actors.engine.slots import slot_bytes

    mc = load_config(checkpoint)
    lm_size, codec_size = (torch.empty((), dtype=d).element_size() for d in dtypes)
    codec_file = codec_path / CHECKPOINT_FILE_NAME if codec_path.is_dir() else codec_path
    config_file = codec_file.parent / CONFIG_FILE_NAME  # where load_codec reads the codec's shape
    codec_config = read_file(config_file) if config_file.is_file() else CodecConfig.real()
    decode = decode_budget(settings, codec_config, device, dtypes[1], codec_samples)
    # a reference's encode is cut at the CPU's cap (encode_batch's default)
    encode = codec_batch_bytes(codec_call_samples(settings, codec_config.frame_length), codec_size)
    clip_seconds = settings.model.budget.max_frames * codec_config.frame_length / codec_config.sample_rate
    free, total = torch.cuda.mem_get_info(device)
    engine = settings.engine
    return MemoryPlan(
        total=total,
        in_use=total - free,
        parts={
            "weights": mc.parameter_count * lm_size,
            "codec": stored_parameters(codec_file) * codec_size,
            # a decode (the finisher) and a reference's encode (a block's caller) may run at once
            "codec_batches": decode + encode,
            "checks": check_model_bytes(settings.quality, clip_seconds),
            "workspace": WORKSPACE_BYTES,
        },
        slot_bytes=slot_bytes(mc, engine.engine_config(), lm_size),
        max_rows=engine.max_rows,
        fraction=engine.memory_fraction,
        decode_budget=decode,
    ).check()
