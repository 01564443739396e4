"""The actors' Ray metrics (actors/ray_metrics.py): the figures of a block, and the values a
real Ray cluster exports to Prometheus after an actor records blocks."""

from __future__ import annotations

import re
import subprocess
import sys
import time
import urllib.request

import pytest

from actors import ray_metrics
from actors import schema as S
from helpers import REPO


def block(actor_name: str, number: int, ok: int, errors: int, occupancy: float, busy: float, rejected: int = 0):
    batch = {S.BATCH_ID: f"{actor_name}:{number}", S.BATCH_SLOT_OCCUPANCY: occupancy, S.BATCH_ENGINE_BUSY: busy}
    rows = [
        {S.ID: f"{number}-{k}", S.STATUS: S.STATUS_OK, S.N_FRAMES: 10 + k, S.AUDIO_SECONDS: 0.5, S.BATCH: batch}
        for k in range(ok)
    ]
    rows += [S.error_row(f"{number}-e{k}", "text is empty", **{S.BATCH: batch}) for k in range(errors)]
    rows += [  # every attempt failed quality.reject: counted apart from ok and error rows
        {
            S.ID: f"{number}-r{k}",
            S.STATUS: S.STATUS_REJECTED,
            S.N_FRAMES: 0,
            S.QUALITY_FLAGS: ["no_audio"],
            S.BATCH: batch,
        }
        for k in range(rejected)
    ]
    return S.output_table(rows)


def test_block_figures_count_ok_rows_only():
    figures = ray_metrics.block_figures(block("a", 1, ok=3, errors=2, occupancy=0.75, busy=0.5, rejected=1))
    assert figures == {
        "ok": 3,
        "rejected": 1,
        "error": 2,
        "frames": 10 + 11 + 12,
        "audio_seconds": 1.5,
        "slot_occupancy": 0.75,
        "engine_busy": 0.5,
    }
    refused = ray_metrics.block_figures(S.output_table([S.error_row("x", "id is null")]))
    assert refused["error"] == 1 and refused["slot_occupancy"] is None and refused["frames"] == 0


def test_recording_outside_a_ray_worker_is_harmless():
    # SynthActor also runs in plain processes (tests, the CLI): there the metrics go nowhere
    metrics = ray_metrics.ActorMetrics("no-ray")
    assert metrics.record_block(block("n", 1, ok=1, errors=0, occupancy=1.0, busy=1.0))["ok"] == 1


def test_without_ray_installed_the_figures_still_come_back():
    # the lent GPU image has no Ray (scripts/gpu_job.py runs the actor there): a process where
    # `import ray` fails records blocks without error and exports nothing
    code = f"""
import sys
sys.modules["ray"] = None  # import ray -> ImportError, as where it is not installed
sys.path[:0] = [{str(REPO / "tests")!r}, {str(REPO / "tests" / "synth")!r}]
from test_ray_metrics import block
from actors import ray_metrics
metrics = ray_metrics.ActorMetrics("no-ray-installed")
figures = metrics.record_block(block("n", 1, ok=2, errors=1, occupancy=0.5, busy=0.25))
print(metrics.exporting, figures["ok"], figures["error"], figures["engine_busy"], "ray" in sys.modules and sys.modules["ray"] is not None)
"""
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["False", "2", "1", "0.25", "False"]
    assert ray_metrics.ActorMetrics("with-ray").exporting  # where Ray is installed, it exports


def _scrape(port: int) -> dict[tuple[str, str], float]:
    """{(metric name, its tags as text): value} of the chorus metrics a node exports."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    values = {}
    for line in text.splitlines():
        match = re.match(r"^(ray_chorus_\w+)\{(.*)\} (\S+)$", line)
        if match:
            tags = ",".join(sorted(t for t in match.group(2).split(",") if t.startswith(("actor=", "status="))))
            values[(match.group(1), tags)] = float(match.group(3))
    return values


@pytest.mark.slow
def test_an_actor_exports_its_blocks_to_prometheus(ray_cluster):
    import ray

    @ray.remote(num_cpus=0.1)
    class Recorder:
        def __init__(self):
            self.metrics = ray_metrics.ActorMetrics("metrics-test-actor")

        def record(self, table):
            return self.metrics.record_block(table)

    recorder = Recorder.remote()
    ray.get(recorder.record.remote(block("m", 1, ok=3, errors=1, occupancy=0.8, busy=0.6)))
    ray.get(recorder.record.remote(block("m", 2, ok=2, errors=0, occupancy=0.5, busy=0.9)))
    port = ray.nodes()[0]["MetricsExportPort"]
    tag = 'actor="metrics-test-actor"'
    expected = {
        ("ray_chorus_rows_total", f'{tag},status="ok"'): 5.0,
        ("ray_chorus_rows_total", f'{tag},status="error"'): 1.0,
        ("ray_chorus_frames_total", tag): 10 + 11 + 12 + 10 + 11,
        ("ray_chorus_audio_seconds_total", tag): 2.5,
        ("ray_chorus_blocks_total", tag): 2.0,
        ("ray_chorus_slot_occupancy", tag): 0.5,  # a gauge: the last block's
        ("ray_chorus_engine_busy", tag): 0.9,
    }
    deadline, seen = time.monotonic() + 60, {}
    while time.monotonic() < deadline:  # Ray pushes metrics to the node's exporter every few seconds
        seen = _scrape(port)
        if all(seen.get(k) == v for k, v in expected.items()):
            break
        time.sleep(1.0)
    assert {k: seen.get(k) for k in expected} == expected
    ray.kill(recorder)
