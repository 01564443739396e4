"""Checkpoint directory -> a ready model + tokenizer on the requested device and dtype."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from ..precision import choose_dtype
from .architecture import ModelArchitecture, load_config, with_semantic_ids
from .checkpoint import LoadReport, load_weights
from .model import DualARModel
from .tokenizer import Tokenizer, load_tokenizer


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def resolve_dtype(dtype: str | torch.dtype = "auto", device: torch.device | None = None) -> torch.dtype:
    """A dtype name or `auto` (precision.py's rule; device None = the CPU) -> torch's dtype."""
    return choose_dtype(dtype, device).dtype


@dataclass
class LoadedModel:
    config: ModelArchitecture
    model: DualARModel
    tokenizer: Tokenizer
    checkpoint_dir: Path
    device: torch.device
    dtype: torch.dtype
    report: LoadReport
    dtype_reason: str = "requested"  # why this dtype (precision.py: `auto`'s rule, or asked for)

    @property
    def name(self) -> str:
        return self.checkpoint_dir.name

    @property
    def im_end_id(self) -> int:
        from .tokenizer import IM_END

        return self.tokenizer.token_id(IM_END)


def build_empty_model(config: ModelArchitecture, device: torch.device, dtype: torch.dtype) -> DualARModel:
    """Parameters allocated once, uninitialised, directly in the target dtype/device."""
    with torch.device("meta"):
        model = DualARModel(config)
    # allocate with plain torch.empty: Module.to_empty goes through torch's Python reference
    # ops for meta tensors, which import sympy and the symbolic-shape machinery (~0.5 s)
    for module in model.modules():
        for name, meta in list(module.named_parameters(recurse=False)):
            setattr(
                module, name, nn.Parameter(torch.empty(meta.shape, dtype=dtype, device=device), requires_grad=False)
            )
    return model.eval()


def load_model(
    checkpoint_dir: str | Path,
    device: str | torch.device = "auto",
    dtype: str | torch.dtype = "auto",
    tokenizer: str = "auto",
) -> LoadedModel:
    checkpoint_dir = Path(checkpoint_dir)
    dev = resolve_device(device)
    choice = choose_dtype(dtype, dev)
    config = load_config(checkpoint_dir)
    tok = load_tokenizer(checkpoint_dir, prefer=tokenizer)
    config = with_semantic_ids(config, tok.semantic_begin_id, tok.semantic_end_id, tok.source)
    model = build_empty_model(config, dev, choice.dtype)
    report = load_weights(model, checkpoint_dir)
    return LoadedModel(
        config=config, model=model, tokenizer=tok, checkpoint_dir=checkpoint_dir, device=dev, dtype=choice.dtype,
        report=report, dtype_reason=choice.reason,
    )  # fmt: skip


def with_dtype(loaded: LoadedModel, dtype: str | torch.dtype) -> LoadedModel:
    choice = choose_dtype(dtype, loaded.device)
    return dataclasses.replace(
        loaded, model=loaded.model.to(choice.dtype), dtype=choice.dtype, dtype_reason=choice.reason
    )
