"""The codec in a process of its own (engine.codec_process, CPU only): the finished rows'
decode, checks and FLAC (actors/quality/hearing.py) and the references' encode.

In one process the engine loop and the codec share the GIL: the engine's step is thousands
of small ops, each of which takes the GIL back after its kernel, and a codec thread running
beside it slows it (measured on the demo, 2 vCPUs: 15-35% with a codec loop in a thread,
0-8% with the same loop in another process). A child process holding its own copy of the
codec takes that contention away: codes go to it and waveforms come back through a pipe (a
few MB per batch), reference clips go to it and their codes come back. On CUDA the codec
runs on a stream of its own instead, in the actor's process.

The child exits when the pipe closes (its actor exited or was killed). A child that dies is
started again on the next call; the call that found it dead raises, and its rows fail as
retryable."""

from __future__ import annotations

import functools
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Optional

import numpy as np

from actors.memory import CODEC_ONEDNN_CACHE_ENTRIES, bound_native_caches

# the child's scheduling priority below the engine's: on a CPU node the engine loop is what the
# node is for, and the codec's work waits in a queue at no cost while the engine has the cores
# (demo, 1 actor x 16 slots on 2 vCPUs, Sapphire Rapids: vs_engine_only 0.82 at 10 against
# 0.77 at 0, the child busy 0.75-0.9 of a core either way; SCHED_IDLE measured the same as
# 10, and again with the child at ~0.5 of a core: the engine thread was preempted as often).
# When the engine has no rows, the child has the CPU: the work is the same, only its order
# changes
NICENESS = 10


def _serve(fd: int, path: str, dtype: str, threads: int, kernels: str) -> None:
    import torch

    from actors.codec.loader import load_codec
    from actors.memory import HeapTrimmer
    from actors.quality import hearing

    conn = Connection(fd)
    os.nice(NICENESS)
    torch.set_num_threads(threads)
    codec = load_codec(path, device="cpu", dtype=getattr(torch, dtype))
    if kernels:  # the folder of the codec's kernels, which the actor built before starting this
        codec.use_native_layers(Path(kernels))
    methods = {
        "decode_batch": codec.decode_batch,
        "encode_batch": codec.encode_batch,
        "hear": functools.partial(hearing.hear_with, codec),
    }
    conn.send(("ready", None))
    # after every call: a decode's waveforms are the child's whole working set, so what it holds
    # between calls is the model; a trim (~2 ms, measured at ~700 MB) is <1% of a decode call
    heap = HeapTrimmer(every_s=0.0)
    while True:
        try:
            method, args, kwargs = conn.recv()
        except (EOFError, OSError):  # the actor is gone
            return
        try:
            if method not in methods:
                raise ValueError(f"unknown codec method {method!r}")
            conn.send(("ok", methods[method](*args, **kwargs)))
        except Exception as e:  # the caller decides what fails: report, keep serving
            conn.send(("error", f"{type(e).__name__}: {e}"))
        heap.maybe_trim()


class CodecProcess:
    """`decode_batch` and `encode_batch` like the codec's, and `hear` (actors/quality/hearing.py
    over the codec's decode), run in a child process. One call at a time (the callers' threads
    take turns)."""

    def __init__(self, path: Path, dtype: str = "float32", threads: int = 1, kernels: Optional[Path] = None):
        """`kernels`: the folder of the codec's C++ kernels (actors/codec/kernels.py), None for
        torch's layers."""
        self._args = (str(path), dtype, max(1, int(threads)), str(kernels or ""))
        self._lock = threading.Lock()
        self._conn = None
        self._process: Optional[subprocess.Popen] = None
        self._start()

    def _start(self) -> None:
        self._stop()  # a dead child's connection and process go before a new one starts
        # a fresh interpreter (`python -m`), not multiprocessing's spawn: that re-imports the
        # parent's __main__, which in a Ray worker or a script is nothing a codec should run
        ours, theirs = socket.socketpair()
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        # the child's own oneDNN cache size (actors/memory.py), set before it starts: the actor's
        # environment holds the actor's, too small for a decode call's shapes
        bound_native_caches(env, CODEC_ONEDNN_CACHE_ENTRIES)
        self._process = subprocess.Popen(
            [sys.executable, "-m", "actors.synth.codec_process", str(theirs.fileno()), *map(str, self._args)],
            pass_fds=[theirs.fileno()],
            env=env,
        )
        theirs.close()
        self._conn = Connection(ours.detach())
        kind, _ = self._conn.recv()  # EOFError if the child could not load the codec
        if kind != "ready":
            raise RuntimeError(f"codec process did not start: {kind}")

    def decode_batch(self, codes: Sequence[np.ndarray], *, max_batch_rows: int) -> list[np.ndarray]:
        return self._call("decode_batch", [np.asarray(a) for a in codes], max_batch_rows=max_batch_rows)

    def encode_batch(self, waves: Sequence[np.ndarray], *, max_batch_rows: int) -> list[np.ndarray]:
        return self._call("encode_batch", [np.asarray(a) for a in waves], max_batch_rows=max_batch_rows)

    def hear(self, tasks: Sequence, quality, *, max_batch_rows: int, frame_bucket: int = 1) -> list:
        """The finished rows decoded, checked and FLAC-encoded in the child (hearing.Heard each)."""
        return self._call("hear", list(tasks), quality, max_batch_rows=max_batch_rows, frame_bucket=frame_bucket)

    def _call(self, method: str, *args, **kwargs) -> list:
        with self._lock:
            if self._process is None or self._process.poll() is not None:
                self._start()
            try:
                self._conn.send((method, args, kwargs))
                kind, value = self._conn.recv()
            except (EOFError, OSError) as e:
                exitcode = self._process.poll()
                self._stop()  # started again on the next call
                raise RuntimeError(f"codec process died (exit code {exitcode}): {e!r}") from None
        if kind != "ok":
            raise RuntimeError(f"codec process: {value}")
        return value

    def close(self) -> None:
        with self._lock:
            self._stop()

    def _stop(self) -> None:
        if self._conn is not None:
            self._conn.close()  # the child's recv sees EOF and returns
            self._conn = None
        if self._process is not None:
            try:
                self._process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
            self._process = None


if __name__ == "__main__":
    _serve(int(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5])
