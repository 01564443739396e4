"""Finding 10: the "pickled code is refused" guarantee must not depend on the torch version.
torch < 2.6 had weights_only=True loading that could be bypassed; the requirement is now
torch>=2.6, and a checkpoint whose pickle would run code is refused without running it, by
both the model and the codec loader."""

from __future__ import annotations

import os
import pickle
import re
from pathlib import Path

import pytest
import torch

from actors.codec.loader import CodecCheckpointError, load_codec
from actors.engine import CheckpointError, load_model
from actors.engine.tiny import make_tiny
from tests.helpers import REPO


class RunsCode:
    """Unpickling this calls os.system: what a hostile checkpoint does."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _version(text: str) -> tuple[int, int]:
    major, minor = re.match(r"(\d+)\.(\d+)", text).groups()
    return int(major), int(minor)


def test_torch_requirement_is_at_least_2_6():
    (minimum,) = re.findall(r'^\s*"torch>=([\d.]+)"', (REPO / "pyproject.toml").read_text(), re.M)
    assert _version(minimum) >= (2, 6), minimum
    assert _version(torch.__version__) >= (2, 6)


def test_a_checkpoint_whose_pickle_runs_code_is_refused_unrun(tmp_path):
    ckpt = make_tiny(tmp_path / "ckpt", fmt="s1", seed=3, n_layer=1)
    marker = tmp_path / "code-ran"
    weights = torch.load(ckpt / "model.pth", weights_only=True)
    weights["payload"] = RunsCode(marker)
    torch.save(weights, ckpt / "model.pth")
    with pytest.raises(CheckpointError, match="not a weights-only state dict"):
        load_model(ckpt, device="cpu", dtype="float32")
    assert not marker.exists()
    # the same payload as a legacy (non-zip) pickle file
    with open(ckpt / "model.pth", "wb") as f:
        torch.save(weights, f, _use_new_zipfile_serialization=False)
    with pytest.raises(CheckpointError):
        load_model(ckpt, device="cpu", dtype="float32")
    assert not marker.exists()


def test_a_codec_whose_pickle_runs_code_is_refused_unrun(tmp_path):
    marker = tmp_path / "code-ran"
    path = tmp_path / "codec.pth"
    torch.save({"state_dict": {}, "payload": RunsCode(marker)}, path)
    with pytest.raises(CodecCheckpointError):
        load_codec(path)
    assert not marker.exists()
    # and a bare pickle (no torch container at all)
    path.write_bytes(pickle.dumps(RunsCode(marker)))
    with pytest.raises(CodecCheckpointError):
        load_codec(path)
    assert not marker.exists()
