"""Shared test helpers (plain functions; fixtures live in the test modules/conftest)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
VECTORS = Path(__file__).resolve().parent / "vectors"  # vendored: see tests/vectors/PROVENANCE.md
DUALAR_SETS = ["dualar-s1-tiny", "dualar-s2-tiny"]


def vector_set(name: str) -> Path:
    path = VECTORS / name
    if not path.is_dir():
        raise FileNotFoundError(
            f"reference vectors not found at {path} (the vendored reference vectors are part of the repository)"
        )
    return path


def run_module(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run `python -m <args>` from the repo root, as a user would."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout
    )


# The device engine tests load their models on: scripts/gpu_check.sh sets it to "cuda".
TEST_DEVICE = os.environ.get("CHORUS_TEST_DEVICE", "cpu")
