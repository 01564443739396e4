"""scripts/gpu_job.py, the job a lent GPU runs end to end (rows in, FLAC and Parquet parts out,
the figures), in its CPU quick mode: in a process where Ray, Hydra and OmegaConf cannot be
imported, as on the lent image; the parts it writes read back, every ok row's FLAC decoding to
the length its row states. CI also runs the quick mode in the GPU check's reduced venv (.ci/run)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys

import pyarrow.parquet as pq
import pytest
import soundfile as sf

from actors import schema as S
from helpers import REPO

SCRIPT = REPO / "scripts" / "gpu_job.sh"
# imported first by every Python the run starts (the steps' and the listen pool's processes):
# Ray, Hydra and OmegaConf are absent there, as on the lent GPU image
ABSENT = """
import sys

class Absent:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("ray", "hydra", "omegaconf"):
            raise ImportError(f"{name} is not installed here (as on the lent GPU image)")

sys.meta_path.insert(0, Absent())
"""


def run_job(tmp_path, *args: str, timeout: float = 600) -> tuple[subprocess.CompletedProcess, dict]:
    blocker = tmp_path / "absent"
    blocker.mkdir(exist_ok=True)
    (blocker / "sitecustomize.py").write_text(ABSENT)
    env = dict(os.environ, PYTHONPATH=str(blocker), CHORUS_PYTHON=sys.executable)
    out, work = tmp_path / "out", tmp_path / "work"
    proc = subprocess.run(
        ["bash", str(SCRIPT), "--out", str(out), "--work", str(work), *args], cwd=REPO, env=env, capture_output=True, text=True,
        timeout=timeout,
    )  # fmt: skip
    report = json.loads((out / "gpu_job.json").read_text()) if (out / "gpu_job.json").is_file() else {}
    return proc, report


@pytest.mark.slow  # ~40 s: two model loads' worth of work on a 2-core machine
def test_the_quick_mode_writes_flac_rows_that_read_back_without_ray_or_hydra(tmp_path):
    proc, report = run_job(tmp_path, "--device", "cpu", "--quick", "--rows", "12")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    steps = report["steps"]
    assert list(steps) == ["rows", "codec", "s1-mini"]  # s2-pro: GPU only
    assert all(step["status"] == "ok" for step in steps.values())
    result = steps["s1-mini"]["result"]
    run, alone = result["end_to_end"], result["engine_alone"]
    assert run["rows"] == {"ok": 12} and alone["rows"] == 12
    assert run["frames"] == alone["frames"] > 0  # the same rows, the same codes: the same work
    assert run["audio_s_per_s"] > 0 and result["vs_engine_alone"] == pytest.approx(
        run["audio_s_per_s"] / alone["audio_s_per_s"], rel=1e-3
    )
    assert result["listen_processes"] == 2 and run["host_s_per_audio_s"] > 0 and run["decode_s_per_audio_s"] > 0
    assert result["memory_plan"] is None and run["gpu_busy"] is None  # a CPU run: no device to plan
    assert result["read_back"] == {"parts": 2, "rows": 12, "flac_read": 12, "problems": [], "ok": True}
    # the parts, read here: the output schema, and FLAC of each row's stated length
    parts = sorted((tmp_path / "work" / "parts-s1-mini").glob("part-*.parquet"))
    assert len(parts) == 2
    for part in parts:
        table = pq.read_table(part)
        assert table.schema.remove_metadata() == S.OUTPUT_SCHEMA.remove_metadata()
        for row in table.to_pylist():
            wave, rate = sf.read(io.BytesIO(row[S.AUDIO][S.AUDIO_BYTES]), dtype="float32")
            assert rate == row[S.SAMPLE_RATE] == 44100 and len(wave) == row[S.N_FRAMES] * 2048 > 0
            assert row[S.DEVICE] == "cpu" and row[S.MODEL] == "random-s1-mini"
            # the checks ran in the listen pool: loudness is measured on every row of 400 ms or more
            assert (row[S.LOUDNESS_LUFS] is not None) == (row[S.AUDIO_SECONDS] >= 0.4), row
    assert "ImportError" not in (tmp_path / "out" / "gpu_job.log").read_text()
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["gpu_job.json", "gpu_job.log"]


def test_a_run_past_its_deadline_records_its_steps_as_skipped(tmp_path):
    proc, report = run_job(tmp_path, "--device", "cpu", "--quick", "--deadline-s", "5", timeout=60)
    assert proc.returncode == 1 and "failed: rows, codec, s1-mini" in proc.stdout
    assert {name: step["status"] for name, step in report["steps"].items()} == dict.fromkeys(
        ["rows", "codec", "s1-mini"], "skipped"
    )


def test_an_unknown_model_is_refused_by_name(tmp_path):
    proc, _ = run_job(tmp_path, "--models", "s1-mini,s3-huge", timeout=60)
    assert proc.returncode != 0 and "unknown model(s) ['s3-huge']; known: s1-mini, s2-pro" in proc.stderr
