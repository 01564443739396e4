"""Ctrl-C as a terminal sends it (SIGINT to the whole foreground process group) to a `chorus run`
that started its own Ray: exit status 130, one line saying how many rows were written, the
lease given back, every Ray process of the run gone within seconds, and the same command run
again resumes: every id once, all ok. Real Ray, real files."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter

import pytest

from helpers import REPO, demo_copies, noisy_lines, run_lines

CHORUS = [sys.executable, "-c", "import sys; from pipeline.cli import console; sys.exit(console())"]


def session_processes(session: int) -> list[str]:
    """The live processes of a session (the driver's, and what it started)."""
    done = subprocess.run(["ps", "-s", str(session), "-o", "pid=,stat=,comm="], capture_output=True, text=True)
    return [line for line in done.stdout.splitlines() if line.split()[1:2] != ["Z"]]


@pytest.mark.slow
def test_ctrl_c_stops_in_order_and_the_rerun_resumes(tmp_path, small_settings, read_rows):
    ids = demo_copies(tmp_path / "in", 4)  # 120 rows: ~1 min of work on 2 vCPUs
    out = tmp_path / "out"
    command = [
        *CHORUS,
        "run",
        "data=parquet",
        f"data.path={tmp_path / 'in' / 'demo.parquet'}",
        f"output.dir={out}",
        "cluster.address=local",
        *small_settings,
    ]
    env = dict(os.environ, PYTHONPATH=str(REPO))
    env.pop("RAY_ADDRESS", None)
    driver = subprocess.Popen(
        command,
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    deadline = time.monotonic() + 240
    while len(list((out / "data").glob("part-*.parquet"))) < 2 and time.monotonic() < deadline:
        assert driver.poll() is None, driver.communicate()
        time.sleep(0.2)
    os.killpg(driver.pid, signal.SIGINT)  # what a terminal does: the whole process group
    stopped = time.monotonic()
    _, err = driver.communicate(timeout=60)
    assert driver.returncode == 130, err
    last = run_lines(err)[-1]
    assert last.startswith("interrupted after ") and last.endswith(" rows; rerun the same command to resume"), err
    assert noisy_lines(err, "Traceback", " E ") == []  # no traceback, no Ray C++ error line
    while session_processes(driver.pid) and time.monotonic() - stopped < 15:
        time.sleep(0.5)
    assert session_processes(driver.pid) == [], "Ray's processes outlived the driver"
    assert not (out / "_chorus.lock").exists()  # the lease given back
    written = {row["id"] for row in read_rows(out)}
    assert 0 < len(written) < len(ids)

    rerun = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stderr
    assert f"{len(ids) - len(written)} to synthesize" in rerun.stderr
    rows = read_rows(out)
    assert Counter(row["id"] for row in rows) == Counter(ids)  # every id once
    assert {row["status"] for row in rows} == {"ok"}
