"""Weights on disk -> a model in memory, for every layout of the family:

* `model.pth` (torch state dict, read with weights_only=True and memory-mapped; a leading
  `model.` is stripped),
* `model.safetensors`,
* sharded `model-0000N-of-0000M.safetensors` + `model.safetensors.index.json`,

with the S2-Pro key names mapped back (`text_model.model.X` -> `X`,
`audio_decoder.codebook_embeddings.*` -> `codebook_embeddings.*`, other `audio_decoder.Y`
-> `fast_Y`) and separate wq/wk/wv concatenated into wqkv. The model is built on the meta
device and each tensor is copied straight into its target dtype/device, so memory never
holds a second full copy of the weights."""

from __future__ import annotations

import json
import logging
import pickle
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .architecture import CheckpointError

log = logging.getLogger(f"chorus.{__name__}")  # one namespace: configuring "chorus" reaches every module

PTH_FILE = "model.pth"
SAFETENSORS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"

# S2-Pro stores the slow stack under one prefix and the fast stack (with the codebook
# embeddings) under another; chorus's module names are S1's. The one place that spells them.
S2_SLOW_PREFIX = "text_model.model."
S2_FAST_PREFIX = "audio_decoder."
_FAST = "fast_"  # chorus's (and S1's) prefix for the fast stack's modules
_CODEBOOK_EMBEDDINGS = "codebook_embeddings."  # stored with the fast stack in S2, shared in chorus
_SPLIT_QKV = re.compile(r"^(.*\.attention)\.(wq|wk|wv)\.(weight|bias)$")


@dataclass
class LoadReport:
    files: list[str]
    unexpected: list[str] = field(default_factory=list)


def weight_files(checkpoint_dir: Path) -> list[Path]:
    d = Path(checkpoint_dir)
    index = d / INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise CheckpointError(f"{index}: not a safetensors index with a 'weight_map' ({e})") from None
        shards = sorted(set(weight_map.values()))
        missing = [s for s in shards if not (d / s).is_file()]
        if missing:
            raise CheckpointError(f"{index}: shard file(s) {missing} are missing from {d}")
        return [d / s for s in shards]
    for name in (SAFETENSORS_FILE, PTH_FILE):
        if (d / name).is_file():
            return [d / name]
    raise CheckpointError(
        f"{d}: no weights found (expected {PTH_FILE}, {SAFETENSORS_FILE}, or {INDEX_FILE} with shards)"
    )


def _read_pth(path: Path) -> dict:
    try:
        try:
            data = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError as e:
            if "mmap" not in str(e).lower():
                raise
            data = torch.load(path, map_location="cpu", weights_only=True)  # legacy (non-zip) format
    except pickle.UnpicklingError as e:
        raise CheckpointError(
            f"{path}: refused to load: it is not a weights-only state dict (it holds pickled "
            f"objects other than tensors, which could run code). Re-save it with "
            f"torch.save(model.state_dict()). Detail: {str(e).splitlines()[0]}"
        ) from None
    except (RuntimeError, EOFError, OSError, ValueError) as e:
        raise CheckpointError(f"{path}: cannot read the file; it is truncated or corrupt ({e})") from None
    if isinstance(data, dict) and "state_dict" in data and isinstance(data["state_dict"], dict):
        data = data["state_dict"]
    if not isinstance(data, dict) or not all(isinstance(v, torch.Tensor) for v in data.values()):
        raise CheckpointError(f"{path}: expected a flat state dict of tensors")
    return data


def _iter_raw(files: list[Path]) -> Iterator[tuple[str, Callable[[], torch.Tensor], str]]:
    """(name, lazy tensor getter, file) for every stored tensor."""
    for path in files:
        if path.suffix == ".pth":
            data = _read_pth(path)
            for name in list(data):
                yield name, (lambda t=data[name]: t), str(path)
        else:
            from safetensors import safe_open

            try:
                handle = safe_open(str(path), framework="pt", device="cpu")
                names = list(handle.keys())
            except Exception as e:  # SafetensorError is not exported as a stable type
                raise CheckpointError(f"{path}: cannot read the file; it is truncated or corrupt ({e})") from None
            for name in names:

                def get(h=handle, n=name, p=path):
                    try:
                        return h.get_tensor(n)
                    except Exception as e:
                        raise CheckpointError(f"{p}: cannot read tensor '{n}' ({e})") from None

                yield name, get, str(path)


def s2_stored_name(name: str) -> str:
    """chorus module name -> the name S2-Pro stores it under (what the tiny writer writes)."""
    if name.startswith(_FAST):
        return S2_FAST_PREFIX + name[len(_FAST) :]
    if name.startswith(_CODEBOOK_EMBEDDINGS):
        return S2_FAST_PREFIX + name
    return S2_SLOW_PREFIX + name


def _canonical_names(names: list[str]) -> dict[str, str]:
    """stored name -> chorus/upstream module name (the inverse of s2_stored_name for S2)."""
    is_s2 = any(n.startswith((S2_SLOW_PREFIX, S2_FAST_PREFIX)) for n in names)
    out = {}
    for n in names:
        m = n
        if is_s2:
            if m.startswith(S2_SLOW_PREFIX):
                m = m[len(S2_SLOW_PREFIX) :]
            elif m.startswith(S2_FAST_PREFIX):
                rest = m[len(S2_FAST_PREFIX) :]
                m = rest if rest.startswith(_CODEBOOK_EMBEDDINGS) else _FAST + rest
        elif m.startswith("model."):
            m = m[len("model.") :]
        out[n] = m
    return out


def load_weights(model: torch.nn.Module, checkpoint_dir: Path) -> LoadReport:
    """Fill a model whose parameters are already allocated (any dtype/device) from disk."""
    files = weight_files(checkpoint_dir)
    raw = list(_iter_raw(files))
    names = _canonical_names([n for n, _, _ in raw])
    expected = dict(model.state_dict())
    report = LoadReport(files=[str(f) for f in files])
    loaded: set[str] = set()
    split_qkv: dict[str, dict[str, tuple[Callable, str]]] = {}

    def put(key: str, tensor: torch.Tensor, source: str) -> None:
        target = expected[key]
        if tuple(tensor.shape) != tuple(target.shape):
            raise CheckpointError(
                f"{source}: tensor '{key}' has shape {tuple(tensor.shape)}, but the config "
                f"({Path(checkpoint_dir) / 'config.json'}) implies {tuple(target.shape)}"
            )
        if not tensor.is_floating_point():
            raise CheckpointError(f"{source}: tensor '{key}' has dtype {tensor.dtype}, expected floating point")
        with torch.no_grad():
            target.copy_(tensor)
        loaded.add(key)

    for stored, get, source in raw:
        key = names[stored]
        m = _SPLIT_QKV.match(key)
        if m and f"{m.group(1)}.wqkv.{m.group(3)}" in expected:
            split_qkv.setdefault(f"{m.group(1)}.wqkv.{m.group(3)}", {})[m.group(2)] = (get, source)
            continue
        if key not in expected:
            report.unexpected.append(stored)
            continue
        if key in loaded:
            raise CheckpointError(f"{source}: tensor '{key}' appears twice in the checkpoint")
        put(key, get(), source)
    for key, parts in split_qkv.items():
        if set(parts) != {"wq", "wk", "wv"}:
            raise CheckpointError(
                f"{Path(checkpoint_dir)}: '{key}' is stored split but only {sorted(parts)} of wq/wk/wv are present"
            )
        put(key, torch.cat([parts[p][0]() for p in ("wq", "wk", "wv")]), parts["wq"][1])
    missing = [k for k in expected if k not in loaded]
    if missing:
        shown = ", ".join(f"'{k}' {tuple(expected[k].shape)}" for k in missing[:8])
        more = f" and {len(missing) - 8} more" if len(missing) > 8 else ""
        raise CheckpointError(
            f"{Path(checkpoint_dir)}: missing tensor(s) {shown}{more} (the weights do not match config.json)"
        )
    if report.unexpected:
        log.warning(
            "%s: %d unexpected tensor(s) not used by the model: %s",
            checkpoint_dir,
            len(report.unexpected),
            ", ".join(report.unexpected[:10]),
        )
    return report
