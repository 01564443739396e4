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


def decide_rows(
    path, distributed: bool = False, output=None, settings: str = "settings", retry_errors=False, retry_rejected=False
):
    """Every input row of the table at `path` with its planning decision (pipeline/planner.py)
    against the output directory `output` (if any), by the in-process or the distributed plan."""
    import pyarrow.fs as pafs

    from pipeline.inputs import RowHasher, scan_input
    from pipeline.output import OutputLayout
    from pipeline.planner import Retry
    from pipeline.planning import decide, output_key_files

    scan = scan_input(str(path), {})
    files = output_key_files(OutputLayout(str(output)).live_files()) if output is not None else []
    hasher = RowHasher(settings, None, scan.root)
    decided = decide(scan, hasher, files, pafs.LocalFileSystem(), Retry(retry_errors, retry_rejected), distributed)
    return decided.to_table()
