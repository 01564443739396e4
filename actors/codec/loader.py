"""Loading codec.pth: key normalisation, weight-norm folding, shape checks."""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Optional, Union

import torch

from ..precision import choose_dtype
from . import hydra_tree
from .config import CONFIG_FILE_NAME, CodecConfig
from .layers import WEIGHT_NORM_LEGACY, WEIGHT_NORM_PARAMETRIZED
from .model import Codec

CHECKPOINT_FILE_NAME = "codec.pth"

_PARAMETRIZED_G = ".parametrizations.weight.original0"
_PARAMETRIZED_V = ".parametrizations.weight.original1"
_LEGACY_G = ".weight_g"
_LEGACY_V = ".weight_v"
_MAX_LISTED_KEYS = 12


class CodecCheckpointError(ValueError):
    """codec.pth does not fit the configured architecture."""


def load_codec(
    path: Union[str, Path],
    device: Union[str, torch.device] = "cpu",
    dtype: Union[str, torch.dtype] = torch.float32,
    config: Optional[CodecConfig] = None,
) -> Codec:
    """Load a codec from codec.pth or a directory holding it, in `dtype` (a torch dtype, a
    name, or `auto`: actors/precision.py's rule for `device`).

    The architecture comes from `config`, else from config.json beside the
    checkpoint (upstream Hydra layout), else the real S1/S2 codec.
    """
    checkpoint = Path(path)
    if checkpoint.is_dir():
        checkpoint = checkpoint / CHECKPOINT_FILE_NAME
    if not checkpoint.is_file():
        raise FileNotFoundError(f"codec checkpoint not found: {checkpoint}")
    if config is None:
        config_file = checkpoint.parent / CONFIG_FILE_NAME
        config = hydra_tree.read_file(config_file) if config_file.is_file() else CodecConfig.real()
    try:
        # No mmap: assigned parameters would stay mapped to the file, and
        # rewriting that file later (torch.save truncates) would crash us.
        raw = torch.load(checkpoint, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises several types for bad files
        raise CodecCheckpointError(f"cannot read codec checkpoint {checkpoint}: {exc}") from exc
    return codec_from_state_dict(raw, config, device=device, dtype=dtype, source=str(checkpoint))


def codec_from_state_dict(
    raw: Mapping[str, object],
    config: CodecConfig,
    *,
    device: Union[str, torch.device] = "cpu",
    dtype: Union[str, torch.dtype] = torch.float32,
    source: str = "state dict",
) -> Codec:
    """Build a Codec from an upstream-layout state dict (weight norm folded)."""
    with torch.device("meta"):
        codec = Codec(config)
    weights = fold_state_dict(unwrap_state_dict(raw, source), codec, source)
    codec.load_state_dict(weights, strict=True, assign=True)
    codec = codec.to(device=device, dtype=choose_dtype(dtype, device).dtype)
    codec.requires_grad_(False)
    return codec.eval()


def unwrap_state_dict(raw: object, source: str) -> dict[str, torch.Tensor]:
    """Accept a flat state dict, {'state_dict': ...}, and `generator.` keys."""
    if isinstance(raw, Mapping) and isinstance(raw.get("state_dict"), Mapping):
        raw = raw["state_dict"]
    if not isinstance(raw, Mapping):
        raise CodecCheckpointError(f"{source}: expected a state dict, found {type(raw).__name__}")
    state = {str(k): v for k, v in raw.items() if isinstance(v, torch.Tensor)}
    if any(k.startswith("generator.") for k in state):
        # A training checkpoint: keep the generator, drop discriminators etc.
        state = {k[len("generator.") :]: v for k, v in state.items() if k.startswith("generator.")}
    return state


def fold_state_dict(state: Mapping[str, torch.Tensor], codec: Codec, source: str) -> dict[str, torch.Tensor]:
    """Map checkpoint tensors onto the codec's keys, folding weight norm
    (W = g * v / ||v||, norm over all dims but 0) into plain weights.

    Raises CodecCheckpointError naming every missing tensor and every shape
    mismatch; warns about tensors the architecture does not use.
    """
    storage = {
        f"{name}.weight": module.weight_norm_storage
        for name, module in codec.named_modules()
        if hasattr(module, "weight_norm_storage")
    }
    fold = _Folding(state)
    for name, t in codec.state_dict().items():
        fold.take(name, tuple(t.shape), storage.get(name))
    problems = []
    if fold.missing:
        problems.append(f"{len(fold.missing)} missing tensor(s): " + _listed(fold.missing))
    if fold.mismatched:
        problems.append(f"{len(fold.mismatched)} tensor(s) with the wrong shape: " + _listed(fold.mismatched))
    if problems:
        raise CodecCheckpointError(
            f"{source} does not match the codec configuration "
            f"(check config.json beside codec.pth): " + " | ".join(problems)
        )
    unexpected = sorted(set(state) - fold.used)
    if unexpected:
        warnings.warn(
            f"{source}: ignoring {len(unexpected)} tensor(s) the codec does not use: " + _listed(unexpected, ", "),
            stacklevel=3,
        )
    return fold.folded


def _listed(items: list[str], sep: str = "; ") -> str:
    return sep.join(items[:_MAX_LISTED_KEYS]) + (" ..." if len(items) > _MAX_LISTED_KEYS else "")


class _Folding:
    """The codec's tensors taken from a checkpoint one key at a time: as stored, or folded
    from a weight-norm (g, v) pair in either storage style; what is missing or misshapen is
    collected, not raised, so one error can name all of it."""

    def __init__(self, state: Mapping[str, torch.Tensor]):
        self.state = state
        self.used: set[str] = set()
        self.folded: dict[str, torch.Tensor] = {}
        self.missing: list[str] = []
        self.mismatched: list[str] = []

    def _fits(self, key: str, tensor: torch.Tensor, shape: tuple) -> bool:
        if tuple(tensor.shape) != shape:
            self.mismatched.append(f"{key}: checkpoint shape {tuple(tensor.shape)}, expected {shape}")
            return False
        return True

    def _pair(self, prefix: str) -> Optional[tuple[str, str]]:
        for g_suffix, v_suffix in ((_PARAMETRIZED_G, _PARAMETRIZED_V), (_LEGACY_G, _LEGACY_V)):
            g_key, v_key = prefix + g_suffix, prefix + v_suffix
            if g_key in self.state or v_key in self.state:
                return g_key, v_key
        return None

    def take(self, name: str, shape: tuple, style: Optional[str]) -> None:
        if name in self.state:
            self.used.add(name)
            if self._fits(name, self.state[name], shape):
                self.folded[name] = self.state[name]
            return
        prefix = name[: -len(".weight")] if name.endswith(".weight") else None
        pair = self._pair(prefix) if prefix is not None else None
        if pair is None:
            if style == WEIGHT_NORM_PARAMETRIZED:
                self.missing.append(f"{prefix}{_PARAMETRIZED_V} (+ {_PARAMETRIZED_G[1:]}), weight {shape}")
            elif style == WEIGHT_NORM_LEGACY:
                self.missing.append(f"{prefix}{_LEGACY_V} (+ {_LEGACY_G[1:]}), weight {shape}")
            else:
                self.missing.append(f"{name} {shape}")
            return
        self.used.update(pair)
        absent = [key for key in pair if key not in self.state]
        if absent:
            self.missing.append(f"{absent[0]} (its partner {(set(pair) - set(absent)).pop()} is present)")
            return
        g_key, v_key = pair
        g, v = self.state[g_key], self.state[v_key]
        ok = self._fits(v_key, v, shape)
        ok = self._fits(g_key, g, (shape[0],) + (1,) * (len(shape) - 1)) and ok
        if ok:
            self.folded[name] = fold_weight_norm(g, v)


def fold_weight_norm(g: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """g * v / ||v|| with the norm over every dim except 0 (weight_norm dim=0).
    A ConvTranspose1d weight is (in, out, k), so its g is (in, 1, 1): the
    same formula applies."""
    v32 = v.float()
    norm = v32.flatten(1).norm(dim=1).view(-1, *([1] * (v.dim() - 1)))
    return (v32 * (g.float() / norm)).to(v.dtype)
