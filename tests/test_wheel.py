"""The chorus-tts wheel as a user installs it: built from the checkout's files, installed into a
fresh virtual environment (its dependencies those of this test environment, seen through a
.pth file: no download, the pinned torch reused), it runs the demo with `chorus run` and exports
it with `chorus export`, each from a directory that is not the checkout."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

from tests.helpers import REPO, noisy_lines

# what the wheel is built from: the distribution's own files (no .venv, outputs, tests)
SOURCES = ("actors", "pipeline", "conf", "data", "setup.py", "pyproject.toml", "README.md")


def build_wheel(into: Path) -> Path:
    tree = into / "tree"
    tree.mkdir(parents=True)
    for name in SOURCES:
        source = REPO / name
        if source.is_dir():
            shutil.copytree(source, tree / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            shutil.copy2(source, tree / name)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(into), str(tree)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    return next(into.glob("chorus_tts-*.whl"))


def fresh_venv(path: Path) -> Path:
    """A venv whose own site-packages come first, then this environment's (the pinned torch,
    Ray, ...) -- not the checkout, which the test environment reaches through its editable
    install's finder, a .pth that a path added this way does not run."""
    venv.EnvBuilder(with_pip=False).create(path)
    python = path / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    Path(site, "test-environment.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return python


@pytest.mark.slow
def test_the_wheel_runs_the_demo_and_exports_it_from_anywhere(tmp_path):
    wheel = build_wheel(tmp_path / "dist")
    python = fresh_venv(tmp_path / "venv")
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "-q", str(wheel)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    chorus = tmp_path / "venv" / "bin" / "chorus"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "RAY_ADDRESS")}
    env["CHORUS_CACHE"] = str(tmp_path / "cache")
    where = subprocess.run(
        [str(python), "-c", "import pipeline, pipeline.config as c; print(pipeline.__file__, c.CONF_DIR, c.DEMO_DIR)"],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert all(str(tmp_path / "venv") in path for path in where), where  # the wheel's, not the checkout's

    def chorus_in(folder: Path, *args: str, timeout: int) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(chorus), *args], cwd=folder, env=env, capture_output=True, text=True, timeout=timeout
        )

    ran = chorus_in(elsewhere, "run", "cluster.address=local", "output.progress_bar=off", timeout=600)
    assert ran.returncode == 0, ran.stderr
    (output,) = (elsewhere / "outputs").iterdir()  # outputs/demo-<hash of where the demo input is>
    assert output.name.startswith("demo-") and f"output written to {output}" in ran.stdout
    summary = json.loads((output / "summary.json").read_text())
    assert summary["rows_total"] == 30 and summary["rows_ok"] == 30
    assert noisy_lines(ran.stderr, "WARNING", " E ", "Traceback") == []  # a quiet run

    other = tmp_path / "other"
    other.mkdir()
    exported = chorus_in(other, "export", str(output), "export.dir=files", timeout=300)
    assert exported.returncode == 0, exported.stderr
    assert len(list((other / "files").rglob("*.flac"))) == 30
