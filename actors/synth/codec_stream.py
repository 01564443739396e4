"""On a GPU, every codec call the actor makes on a CUDA stream of the codec's own: the finished
rows' decode (the finisher), the references' encode (the block callers' threads), a reference
decoded for the speaker check. On the default stream they would queue behind the engine's
steps, and its steps behind them; on their own stream the device runs both at once, and each
side waits only on its own work (a decode's copy back to the host synchronises the codec's
stream, not the device).

The stream is made once per actor (loading.py) and waits for everything the loading queued on
the default stream (the weights' copies) before its first call.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


class CodecOnStream:
    """A codec whose `decode_batch` and `encode_batch` run on `stream`, whichever thread calls;
    everything else is the codec's own."""

    def __init__(self, codec: Any, stream: Any):
        import torch

        self.codec, self.stream = codec, stream
        self._torch = torch
        stream.wait_stream(torch.cuda.current_stream(codec.device))

    def decode_batch(self, codes: Sequence[np.ndarray], **kwargs) -> list[np.ndarray]:
        with self._torch.cuda.stream(self.stream):
            return self.codec.decode_batch(codes, **kwargs)

    def encode_batch(self, waves: Sequence[np.ndarray], **kwargs) -> list[np.ndarray]:
        with self._torch.cuda.stream(self.stream):
            return self.codec.encode_batch(waves, **kwargs)

    def __getattr__(self, name: str) -> Any:  # sample_rate, frame_length, num_codebooks, device ...
        if name in ("codec", "stream", "_torch"):  # not set yet (a copy being made): not the codec's
            raise AttributeError(name)
        return getattr(self.codec, name)
