"""The codec in a process of its own (engine.codec_process, CPU only): the finished rows'
decode, checks and FLAC (actors/quality/hearing.py) and the references' encode.

In one process the engine loop and the codec share the GIL: the engine's step is thousands
of small ops, each of which takes the GIL back after its kernel, and a codec thread running
beside it slows it (measured on the demo, 2 vCPUs: 15-35% with a codec loop in a thread,
0-8% with the same loop in another process). A child process holding its own copy of the
codec takes that contention away: codes go to it and waveforms come back through a pipe (a
few MB per batch), reference clips go to it and their codes come back. On CUDA the codec
runs on a stream of its own instead, in the actor's process, and the checks and FLAC on the
listen pool (listen_pool.py).

The child is a `ChildProcess` (child.py): started again on the next call when it died; the
call that found it dead raises, and its rows fail as retryable."""

from __future__ import annotations

import functools
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Optional

import numpy as np

from actors.memory import CODEC_ONEDNN_CACHE_ENTRIES, bound_native_caches
from actors.synth.child import ChildProcess, child_connection, serve


def _serve(fd: str, path: str, dtype: str, threads: str, kernels: str) -> None:
    import torch

    from actors.codec.loader import load_codec
    from actors.memory import HeapTrimmer
    from actors.quality import hearing

    conn = child_connection(fd)
    torch.set_num_threads(int(threads))
    codec = load_codec(path, device="cpu", dtype=getattr(torch, dtype))
    if kernels:  # the folder of the codec's kernels, which the actor built before starting this
        codec.use_native_layers(Path(kernels))
    methods = {
        "decode_batch": codec.decode_batch,
        "encode_batch": codec.encode_batch,
        "hear": functools.partial(hearing.hear_with, codec),
    }
    # after every call: a decode's waveforms are the child's whole working set, so what it holds
    # between calls is the model; a trim (~2 ms, measured at ~700 MB) is <1% of a decode call
    serve(conn, methods, HeapTrimmer(every_s=0.0).maybe_trim)


class CodecProcess(ChildProcess):
    """`decode_batch` and `encode_batch` like the codec's, and `hear` (actors/quality/hearing.py
    over the codec's decode), run in a child process. One call at a time (the callers' threads
    take turns)."""

    def __init__(self, path: Path, dtype: str = "float32", threads: int = 1, kernels: Optional[Path] = None):
        """`kernels`: the folder of the codec's C++ kernels (actors/codec/kernels.py), None for
        torch's layers."""
        # the child's own oneDNN cache size (actors/memory.py), set before it starts: the actor's
        # environment holds the actor's, too small for a decode call's shapes
        env = bound_native_caches({}, CODEC_ONEDNN_CACHE_ENTRIES)
        args = (str(path), dtype, max(1, int(threads)), str(kernels or ""))
        super().__init__(__name__, args, env={k: str(v) for k, v in env.items()}, name="codec process")

    def decode_batch(self, codes: Sequence[np.ndarray], *, max_batch_rows: int) -> list[np.ndarray]:
        return self.call("decode_batch", [np.asarray(a) for a in codes], max_batch_rows=max_batch_rows)

    def encode_batch(self, waves: Sequence[np.ndarray], *, max_batch_rows: int) -> list[np.ndarray]:
        return self.call("encode_batch", [np.asarray(a) for a in waves], max_batch_rows=max_batch_rows)

    def hear(self, tasks: Sequence, quality, *, max_batch_rows: int, frame_bucket: int = 1) -> list:
        """The finished rows decoded, checked and FLAC-encoded in the child (hearing.Heard each)."""
        return self.call("hear", list(tasks), quality, max_batch_rows=max_batch_rows, frame_bucket=frame_bucket)


if __name__ == "__main__":
    _serve(*sys.argv[1:6])
