"""Module helpers shared by the dual-AR model and the codec (both import torch)."""

from __future__ import annotations

import torch
from torch import nn


def uninitialised_embedding(rows: int, dim: int) -> nn.Embedding:
    """An embedding whose table is left uninitialised, for models that are built on the meta
    device and then filled from a checkpoint (or by a deterministic random writer).
    nn.Embedding's own random init would, on the meta device, import torch._dynamo: about
    1.4 s of every actor's start-up for each of the model and the codec."""
    return nn.Embedding(rows, dim, _weight=torch.empty(rows, dim))
