"""Deterministic random codecs: a tiny demo/test checkpoint, and real-size
random weights for benchmarks and GPU jobs (`write_random_codec`, `python -m
actors.codec make-random --size real --device cuda`: drawn on the device, ~9 s
of CPU time on one core saved for the real codec's 391 M values).

Checkpoints are written in the upstream layout (flat state dict, encoder and
decoder convs as `parametrizations.weight.original0/1`, quantizer projections
as legacy `weight_g/weight_v`) with a Hydra-style config.json, so they
exercise the same loading path as a real codec.pth.

The weights are scaled to keep activations near unit variance through every
stage, so decoding random codes gives audible, unsaturated signal (output std
around 0.1) instead of silence or a clipped tanh.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Union

import torch
from torch import nn

from ..modules import RMSNorm
from . import hydra_tree
from .config import CONFIG_FILE_NAME, CodecConfig
from .layers import (
    WEIGHT_NORM_LEGACY,
    WEIGHT_NORM_PARAMETRIZED,
    CausalConvTranspose1d,
    ConvNeXtBlock,
    Decoder,
    ResidualUnit,
    Snake1d,
)
from .loader import CHECKPOINT_FILE_NAME, codec_from_state_dict
from .model import Codec
from .transformer import LayerScale

# Per-module gains (weight row norms). Chosen by measuring activation spread
# on random codes: residual branches are damped so three of them in a row do
# not blow up the stage, and the last conv sets the output level before tanh.
RESIDUAL_BRANCH_GAIN = 0.35
FINAL_CONV_GAIN = 0.025
LAYER_SCALE_RANGE = (0.05, 0.25)
CONVNEXT_GAMMA_RANGE = (0.1, 0.3)
SNAKE_ALPHA_RANGE = (0.5, 1.5)
BIAS_STD = 0.02


def random_state_dict(
    config: CodecConfig, seed: int = 0, device: Union[str, torch.device] = "cpu"
) -> dict[str, torch.Tensor]:
    """Random float32 weights for `config` in upstream checkpoint layout, on `device`.

    Same config, seed and kind of device give bit-identical tensors on any
    machine: values come from one seeded generator of that device, drawn in a
    fixed key order (a CUDA generator draws other values than the CPU's).
    """
    generator = torch.Generator(device=device).manual_seed(seed)
    with torch.device("meta"):
        codec = Codec(config)
    gains = _weight_gains(codec)
    state: dict[str, torch.Tensor] = {}
    for module_name, module in codec.named_modules():
        prefix = f"{module_name}." if module_name else ""
        for param_name, param in module.named_parameters(recurse=False):
            key = prefix + param_name
            shape = tuple(param.shape)
            if param_name == "weight" and isinstance(module, (nn.Conv1d, nn.ConvTranspose1d)):
                storage = getattr(module, "weight_norm_storage", None)
                gain = gains.get(module_name, 1.0)
                if storage in (WEIGHT_NORM_PARAMETRIZED, WEIGHT_NORM_LEGACY):
                    g, v = _weight_norm_pair(shape, gain, generator)
                    if storage == WEIGHT_NORM_PARAMETRIZED:
                        state[prefix + "parametrizations.weight.original0"] = g
                        state[prefix + "parametrizations.weight.original1"] = v
                    else:
                        state[prefix + "weight_g"] = g
                        state[prefix + "weight_v"] = v
                    continue
                state[key] = _rows_with_norm(shape, gain, generator)
            else:
                state[key] = _random_parameter(module, param_name, shape, gains, module_name, generator)
    return _upstream_key_order(state)


def random_codec(
    config: CodecConfig,
    seed: int = 0,
    device: Union[str, torch.device] = "cpu",
    dtype: torch.dtype = torch.float32,
) -> Codec:
    """A Codec with random weights built in memory (no file), drawn on `device`."""
    return codec_from_state_dict(
        random_state_dict(config, seed, device),
        config,
        device=device,
        dtype=dtype,
        source=f"random codec (seed {seed})",
    )


def make_tiny(
    out_dir: Union[str, Path],
    seed: int = 0,
    semantic_codebook_size: int = 128,
    codebook_size: int = 128,
) -> Path:
    """Write a tiny random codec (codec.pth + config.json) to out_dir and
    return the checkpoint path. Same arguments give byte-identical files."""
    return write_random_codec(out_dir, CodecConfig.tiny(semantic_codebook_size, codebook_size), seed)


def write_random_codec(
    out_dir: Union[str, Path], config: CodecConfig, seed: int = 0, device: Union[str, torch.device] = "cpu"
) -> Path:
    """Write random weights for `config` (drawn on `device`) as codec.pth + config.json in
    out_dir, the layout load_codec reads; return the checkpoint path. The real codec's file is
    1.57 GB (float32, as upstream ships it)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    checkpoint = out_dir / CHECKPOINT_FILE_NAME
    state = {key: value.cpu() for key, value in random_state_dict(config, seed, device).items()}
    # torch.save names its zip members after the file stem, so writing to a
    # temporary name and renaming would change the bytes; write in place.
    torch.save(state, checkpoint)
    (out_dir / CONFIG_FILE_NAME).write_text(json.dumps(hydra_tree.to_tree(config), indent=2) + "\n")
    return checkpoint


def _weight_gains(codec: Codec) -> dict[str, float]:
    """Row-norm target for each conv/linear weight, keyed by module name."""
    gains: dict[str, float] = {}
    for name, module in codec.named_modules():
        if isinstance(module, ResidualUnit):
            gains[f"{name}.block.3.conv"] = RESIDUAL_BRANCH_GAIN
        elif isinstance(module, CausalConvTranspose1d):
            # Each output sample sums kernel/stride taps of every input
            # channel; this gain keeps the variance (weights are (in, out, k)
            # with the norm taken per input channel).
            conv = module.conv
            in_channels, out_channels, kernel = conv.weight.shape
            taps = kernel / conv.stride[0]
            gains[f"{name}.conv"] = math.sqrt(out_channels * kernel / (in_channels * taps))
    final = _final_conv_name(codec)
    gains[final] = FINAL_CONV_GAIN
    return gains


def _final_conv_name(codec: Codec) -> str:
    decoder: Decoder = codec.decoder
    return f"decoder.model.{len(decoder.model) - 2}.conv"


def _weight_norm_pair(shape: tuple, gain: float, generator: torch.Generator):
    # v deliberately far from unit norm, so a loader that skips g / ||v||
    # produces visibly wrong output.
    v = _normal(shape, generator) * 3.0
    g = gain * (0.8 + 0.4 * _uniform(((shape[0],) + (1,) * (len(shape) - 1)), (0.0, 1.0), generator))
    return g, v


def _rows_with_norm(shape: tuple, gain: float, generator: torch.Generator) -> torch.Tensor:
    weight = _normal(shape, generator)
    fan_in = math.prod(shape[1:])
    return weight * (gain / math.sqrt(fan_in))


def _uniform(shape: tuple, bounds: tuple, generator: torch.Generator) -> torch.Tensor:
    low, high = bounds
    return low + (high - low) * torch.rand(shape, generator=generator, device=generator.device)


def _normal(shape: tuple, generator: torch.Generator) -> torch.Tensor:
    return torch.randn(shape, generator=generator, device=generator.device)


def _random_parameter(
    module: nn.Module,
    param_name: str,
    shape: tuple,
    gains: dict,
    module_name: str,
    generator: torch.Generator,
) -> torch.Tensor:
    if isinstance(module, Snake1d):
        return _uniform(shape, SNAKE_ALPHA_RANGE, generator)
    if isinstance(module, LayerScale):
        return _uniform(shape, LAYER_SCALE_RANGE, generator)
    if isinstance(module, ConvNeXtBlock) and param_name == "gamma":
        return _uniform(shape, CONVNEXT_GAMMA_RANGE, generator)
    if isinstance(module, (RMSNorm, nn.LayerNorm)):
        if param_name == "weight":
            return 1.0 + 0.1 * _normal(shape, generator)
        return BIAS_STD * _normal(shape, generator)
    if isinstance(module, nn.Embedding):
        return _normal(shape, generator)
    if param_name == "bias":
        return BIAS_STD * _normal(shape, generator)
    if isinstance(module, nn.Linear):
        return _rows_with_norm(shape, gains.get(module_name, 1.0), generator)
    raise TypeError(f"no random init rule for {module_name}.{param_name} ({type(module).__name__})")


def _upstream_key_order(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Upstream lists a parametrized conv's bias before original0/original1
    (the parametrization is registered after the bias) and a legacy one's
    bias before weight_g/weight_v; mirror that so files look alike."""
    ordered: dict[str, torch.Tensor] = {}
    pending: list[tuple[str, torch.Tensor]] = []
    for key, value in state.items():
        if key.endswith((".original0", ".original1", ".weight_g", ".weight_v")):
            pending.append((key, value))
            continue
        ordered[key] = value
        if key.endswith(".bias") and pending:
            ordered.update(pending)
            pending = []
    ordered.update(pending)
    return ordered
