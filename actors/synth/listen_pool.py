"""The listen pool: a decoded row's measurements and its FLAC encoding (actors/quality/hearing.py
`listen`) in processes beside the actor, so none of that CPU work runs in the engine's process
(neither its CPU time nor its hold on the GIL) when the codec decodes there, as on a GPU.

That work costs ~0.006 CPU-s per second of audio (LISTEN_CPU_S_PER_AUDIO_S; the checks' numpy
passes and libsndfile's FLAC), so a GPU job at ~2,500 s of audio per second needs ~15 cores of
it. `engine.listen_processes` sizes the pool; null means `default_processes`: enough for
TARGET_AUDIO_RATE, within the node's CPUs per GPU less the two the actor's own threads need.

Each process is a fresh interpreter (child.py) importing numpy, soundfile and the checks (no
torch: ~0.3 s to start); a thread of the actor's per process hands it one row at a time (the
wave pickled through a socket pair, ~176 KB per second of audio) and waits for its `Heard`
with the GIL released. A process that dies is started again; the row it held comes back as a
retryable failure.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import queue
import sys
import threading
from concurrent.futures import Future
from pathlib import Path
from typing import Optional

import numpy as np

from actors.quality import hearing
from actors.quality.settings import QualitySettings
from actors.synth.child import ChildProcess, child_connection, serve

log = logging.getLogger(f"chorus.{__name__}")  # one namespace: configuring "chorus" reaches every module

# CPU seconds listening costs per second of audio (the checks and FLAC; the measurement
# on the demo's rows, docs/performance.md "The job on a GPU" measures it per run)
LISTEN_CPU_S_PER_AUDIO_S = 0.006
# the audio rate the default pool keeps up with: a fused GPU codec's target (docs/performance.md)
TARGET_AUDIO_RATE = 2500.0
# CPUs per GPU the actor keeps for its own threads: the engine feeder and the finisher
ACTOR_CPUS = 2
MAX_PROCESSES = 32
# single-threaded numeric libraries in each process: the pool's parallelism is its processes
_ONE_THREAD = {name: "1" for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}
NVIDIA_GPUS = Path("/proc/driver/nvidia/gpus")


def processes_for(cpus_per_gpu: int, audio_rate: float = TARGET_AUDIO_RATE) -> int:
    """Processes that keep up with `audio_rate` seconds of audio per second (at
    LISTEN_CPU_S_PER_AUDIO_S each, a quarter spare), within `cpus_per_gpu` less ACTOR_CPUS;
    at least 1, at most MAX_PROCESSES."""
    wanted = math.ceil(audio_rate * LISTEN_CPU_S_PER_AUDIO_S * 1.25)
    return max(1, min(wanted, cpus_per_gpu - ACTOR_CPUS, MAX_PROCESSES))


def node_gpus(gpus_dir: Path = NVIDIA_GPUS) -> int:
    """The node's NVIDIA GPUs, all of them: the driver lists one folder per GPU whatever
    CUDA_VISIBLE_DEVICES says (Ray shows each actor its own GPU only); 1 where it lists none."""
    try:
        return max(1, sum(1 for _ in gpus_dir.iterdir()))
    except OSError:
        return 1


def node_cpus() -> int:
    """The CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def default_processes(configured: Optional[int], device_type: str) -> int:
    """engine.listen_processes as a number: the configured one, else on a GPU what
    `processes_for` gives this node's CPUs per GPU, and 0 on a CPU (there the codec's child
    process listens: actors/synth/codec_process.py)."""
    if configured is not None:
        return int(configured)
    if device_type != "cuda":
        return 0
    return processes_for(node_cpus() // node_gpus())


class ListenPool:
    """`submit(task, wave)` -> a Future of its `hearing.Heard`, listened to in one of
    `processes` child processes. The wave stays here: a task that keeps its wave gets it back
    from the caller's copy, not through the pipe."""

    def __init__(self, processes: int, quality: QualitySettings, sample_rate: int, frame_length: int):
        if processes < 1:
            raise ValueError(f"a listen pool needs at least one process, got {processes}")
        self.processes = processes
        self._args = (quality, sample_rate, frame_length)
        self._work: queue.Queue = queue.Queue()
        self._lock = threading.Lock()
        self._busy_s = 0.0  # the children's seconds listening (the checks' CPU time + FLAC's), summed
        started = [threading.Event() for _ in range(processes)]
        self._children: list[Optional[ChildProcess]] = [None] * processes
        for index in range(processes):  # each thread starts its child: they start side by side
            threading.Thread(
                target=self._serve, args=(index, started[index]), name=f"chorus-listen-{index}", daemon=True
            ).start()
        for event in started:
            event.wait()
        if not any(self._children):
            raise RuntimeError("the listen pool's processes did not start (see the log)")
        log.info(
            "listen pool: %d processes, ~%.0f s of audio per second at %.3f CPU-s per audio s",
            processes, processes / LISTEN_CPU_S_PER_AUDIO_S, LISTEN_CPU_S_PER_AUDIO_S,
        )  # fmt: skip

    def submit(self, task: hearing.HearTask, wave: np.ndarray) -> Future:
        future: Future = Future()
        self._work.put((task, wave, future))
        return future

    @property
    def busy_seconds(self) -> float:
        """The seconds the pool's processes spent measuring and encoding, so far (the checks'
        CPU time and the FLAC encoding's wall time, summed over the processes)."""
        with self._lock:
            return self._busy_s

    def _serve(self, index: int, started: threading.Event) -> None:
        try:
            self._children[index] = ChildProcess(__name__, env=_ONE_THREAD, name=f"listen process {index}")
        except Exception as e:
            log.error("listen process %d did not start: %r", index, e)
            return
        finally:
            started.set()
        child = self._children[index]
        while True:
            item = self._work.get()
            if item is None:
                return
            task, wave, future = item
            try:
                heard = child.call("listen", dataclasses.replace(task, keep_wave=False), wave, *self._args)
            except Exception as e:  # the child died or failed: this row fails, the next call restarts it
                heard = hearing.Heard(failure=f"listening to the decoded audio: {e}", retryable=True)
            if task.keep_wave and heard.failure is None:
                heard.wave = wave
            with self._lock:
                self._busy_s += (heard.checks_ms + heard.flac_ms) / 1000.0
            future.set_result(heard)

    def close(self) -> None:
        for _ in self._children:
            self._work.put(None)
        for child in self._children:
            if child is not None:
                child.close()


if __name__ == "__main__":
    serve(child_connection(sys.argv[1]), {"listen": hearing.listen})
