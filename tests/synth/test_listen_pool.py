"""The listen pool (actors/synth/listen_pool.py): decoded rows measured and FLAC-encoded in
processes beside the actor give what listening in the actor's thread gives, byte for byte; a
process that died is started again; and the pool's size from the node's CPUs and GPUs."""

from __future__ import annotations

import numpy as np
import pytest

from actors.quality import hearing
from actors.quality.settings import QualitySettings
from actors.synth import listen_pool as L

RATE, FRAME = 44100, 512


def wave(seconds: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * RATE)) / RATE
    return (0.3 * np.sin(2 * np.pi * 180 * t) + 0.05 * rng.standard_normal(len(t))).astype(np.float32)


def task(samples: int, keep_wave: bool = False) -> hearing.HearTask:
    frames = samples // FRAME
    return hearing.HearTask(np.zeros((2, frames), dtype=np.int64), "a few words here", (frames,), keep_wave)


@pytest.fixture(scope="module")
def pool():
    pool = L.ListenPool(2, QualitySettings(), RATE, FRAME)
    yield pool
    pool.close()


def test_the_pool_hears_what_the_thread_hears(pool):
    waves = [wave(0.5 + 0.25 * i, seed=i) for i in range(5)]
    tasks = [task(len(w), keep_wave=(i == 1)) for i, w in enumerate(waves)]
    futures = [pool.submit(t, w) for t, w in zip(tasks, waves)]
    for t, w, future in zip(tasks, waves, futures):
        heard, here = future.result(timeout=60), hearing.listen(t, w, QualitySettings(), RATE, FRAME)
        assert heard.failure is None and heard.flac == here.flac  # the same FLAC bytes
        assert heard.metrics == here.metrics and heard.samples == len(w)
        assert heard.checks_ms > 0 and heard.flac_ms > 0
        if t.keep_wave:  # the actor's own copy, never sent back through the pipe
            assert heard.wave is w
        else:
            assert heard.wave is None
    assert pool.busy_seconds > 0


def test_a_process_that_died_is_started_again(pool):
    first = [child.pid for child in pool._children]
    victim = pool._children[0]
    victim._process.kill()
    victim._process.wait()
    # rows long enough that both processes take some
    results = [f.result(timeout=60) for f in [pool.submit(task(10 * RATE), wave(10.0, seed=i)) for i in range(4)]]
    assert all(r.failure is None for r in results), [r.failure for r in results]
    assert pool._children[0].pid not in (None, first[0]) and pool._children[1].pid == first[1]


def test_non_finite_audio_is_a_row_failure_not_a_pool_failure(pool):
    bad = wave(0.5, seed=1)
    bad[10] = np.nan
    heard = pool.submit(task(len(bad)), bad).result(timeout=60)
    assert heard.failure == "codec decode produced non-finite samples"


def test_the_pools_size_follows_the_audio_rate_and_the_cpus_per_gpu(tmp_path):
    # 2,500 s of audio per second x 0.006 CPU-s each, a quarter spare: 19 processes
    assert L.processes_for(128) == 19
    assert L.processes_for(16) == 14  # an H200 machine of 16 cores: all but the actor's two
    assert L.processes_for(2) == 1 and L.processes_for(1000, audio_rate=1e6) == L.MAX_PROCESSES
    assert L.processes_for(64, audio_rate=400) == 3
    gpus = tmp_path / "gpus"
    gpus.mkdir()
    for bus in range(8):
        (gpus / f"0000:{bus:02x}:00.0").mkdir()
    assert L.node_gpus(gpus) == 8 and L.node_gpus(tmp_path / "absent") == 1
    assert L.default_processes(None, "cpu") == 0  # the codec's child process listens on a CPU
    assert L.default_processes(3, "cuda") == 3 and L.default_processes(0, "cuda") == 0
    assert L.default_processes(None, "cuda") == L.processes_for(L.node_cpus() // L.node_gpus())
