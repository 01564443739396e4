"""scripts/gpu_check.py, the command a lent GPU gets: every step in its own process and time
limit, one JSON rewritten after each step, a failed or timed-out step costing only itself. CI
also runs the whole check on the CPU in a venv of the GPU image's packages (.ci/run)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from helpers import REPO

SCRIPT = REPO / "scripts" / "gpu_check.py"


def _check(tmp_path, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(tmp_path), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    return proc, json.loads((tmp_path / "gpu_check.json").read_text())


@pytest.mark.slow  # ~20 s; .ci/run runs the quick check itself
def test_the_cpu_run_writes_each_steps_figures(tmp_path):
    proc, report = _check(tmp_path, "--device", "cpu", "--quick", "--only", "ceilings,frame_check,keys")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    steps = report["steps"]
    assert list(steps) == ["ceilings", "frame_check", "keys"]
    assert all(step["status"] == "ok" for step in steps.values())
    assert steps["ceilings"]["result"]["ceilings"]["copy_bytes_per_s"] > 1e8
    audit = steps["frame_check"]["result"]["float32"]["audit"]
    assert audit["capturable"] and audit["steps_audited"] == 4
    assert [row["keys"] for row in steps["keys"]["result"]["tiny"]] == [32, 64]
    assert "== keys" in (tmp_path / "gpu_check.log").read_text()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks what a run without the device does")
def test_a_failing_step_costs_only_itself_and_the_run_reports_it(tmp_path):
    proc, report = _check(tmp_path, "--device", "cuda", "--only", "ceilings,parity")
    assert proc.returncode == 1
    assert [s["status"] for s in report["steps"].values()] == ["failed", "failed"]  # both ran
    assert "failed: ceilings, parity" in proc.stdout


def test_steps_the_deadline_leaves_no_time_for_are_recorded_as_skipped(tmp_path):
    proc, report = _check(tmp_path, "--device", "cpu", "--quick", "--deadline-s", "5", "--only", "ceilings,codec")
    assert proc.returncode == 1
    assert {name: s["status"] for name, s in report["steps"].items()} == {"ceilings": "skipped", "codec": "skipped"}
