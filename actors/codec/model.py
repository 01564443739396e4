"""The codec: audio <-> codes, one module tree with upstream's key names."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Optional, Union

import numpy as np
import torch
from torch import nn

from . import kernels
from .config import CodecConfig
from .device import DeviceDecode
from .layers import Decoder, Encoder, ResidualUnit
from .pieces import decode_in_pieces, receptive_steps
from .quantizer import DownsampleResidualVectorQuantize

# On CPU decode_batch / encode_batch group rows so that one forward pass holds at most
# this many (padded) audio samples. The decoder keeps its last two stage
# outputs alive (decoder_dim/16 channels at audio rate plus twice that at half
# rate: ~1.6 GB at 2**21 samples for the real codec); CPU throughput does not
# improve with more rows, so larger groups would only cost memory. On a GPU the
# cap comes from the device's memory instead (device.py: DeviceDecode.max_batch_samples).
DEFAULT_MAX_BATCH_SAMPLES = 2**21
DEFAULT_MAX_BATCH_ROWS = 16
# On CPU a group also pads at most this share over its rows' own samples. A CPU decode costs
# in proportion to the padded samples and batching saves only the per-call part (measured on
# the demo codec, one thread, 8 rows: 1.44x at 10 frames each, 1.15x at 27, 1.11x at 48),
# while rows finishing together differ in length: 1.78x padded/own over a pipeline run's
# batches of 8. Accelerators keep whole batches (their per-call cost is what batching saves).
CPU_MAX_PADDING = 0.15
DEVICE_PADDING = "device"  # max_padding: CPU_MAX_PADDING on CPU, unbounded elsewhere


class Codec(nn.Module):
    """Causal modded DAC (OpenAudio S1 / S2-Pro codec).

    Module names match upstream (`encoder.block...`, `quantizer...`,
    `decoder.model...`); weight norm is folded at load, so every conv holds a
    plain `weight`.
    """

    def __init__(self, config: CodecConfig):
        super().__init__()
        self.config = config.validate()
        self.encoder = Encoder(config)
        self.quantizer = DownsampleResidualVectorQuantize(config)
        self.decoder = Decoder(config)
        self._device_decode: Optional[DeviceDecode] = None
        self._stream = None
        self._code_limits: dict[str, torch.Tensor] = {}
        self.decoder_reach = receptive_steps(self.decoder)  # latent steps a piece's context needs

    # ---- sizes ----------------------------------------------------------
    @property
    def sample_rate(self) -> int:
        return self.config.sample_rate

    @property
    def frame_length(self) -> int:
        return self.config.frame_length

    @property
    def num_codebooks(self) -> int:
        return self.config.num_codebooks

    @property
    def codebook_sizes(self) -> list[int]:
        return self.config.codebook_sizes

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.parameters()).dtype

    def use_native_layers(self, build_root: Optional[Path] = None) -> int:
        """Run the narrow layers through kernels.py's C++ kernel (built once per node under
        build_root, default: chorus's compile cache) when this codec is float32 on CPU. Returns
        how many layers switched: 0 elsewhere, or where the kernel cannot be built."""
        if self.device.type != "cpu" or self.dtype != torch.float32 or not kernels.load(build_root):
            return 0
        widest = kernels.max_channels()
        narrow = [m for m in self.modules() if isinstance(m, ResidualUnit) and m.block[1].conv.in_channels <= widest]
        if self.decoder.last_channels <= widest:
            narrow.append(self.decoder)
        for module in narrow:
            module.native = True
        return len(narrow)

    # ---- the decode on a device (device.py) ------------------------------
    def configure_decode(
        self, backend: str = "auto", graphs: Optional[bool] = None, memory_budget: Optional[int] = None
    ) -> DeviceDecode:
        """Choose how `decode` runs on this codec's device (call after moving the codec):
        backend auto | triton | triton-prologue | eager | inductor, CUDA graphs per decode
        shape (default on CUDA), and the bytes a decode call may hold (default: a share of
        the device's free memory). A CUDA codec gets the defaults at its first decode; on CPU
        the layers of layers.py run unless this is called (the tests run the Triton path
        there under TRITON_INTERPRET=1)."""
        self._device_decode = DeviceDecode(self, backend, graphs, memory_budget)
        return self._device_decode

    @property
    def device_decode(self) -> Optional[DeviceDecode]:
        """The device decode in use: configured, or the defaults on a CUDA codec; None on CPU."""
        if self._device_decode is None and self.device.type == "cuda":
            self.configure_decode()
        return self._device_decode

    @property
    def stream(self):
        """The CUDA stream decode_batch runs on (None on CPU): its own, made on first use, so
        a decode overlaps the engine's steps on the default stream; the actor may set another."""
        if self._stream is None and self.device.type == "cuda":
            self._stream = torch.cuda.Stream(device=self.device)
        return self._stream

    @stream.setter
    def stream(self, value) -> None:
        self._stream = value

    def max_batch_samples(self) -> int:
        """Padded samples one decode_batch call may hold here: the CPU's cache-sized cap, or on
        a GPU what its memory budget allows (device.py)."""
        if self.device.type == "cpu" or self.device_decode is None:
            return DEFAULT_MAX_BATCH_SAMPLES
        return self.device_decode.max_batch_samples()

    # ---- tensor API (upstream semantics) --------------------------------
    @torch.inference_mode()
    def encode(self, audio: torch.Tensor, lengths: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
        """audio [B, 1, T] (or [B, T]) -> (codes [B, C, F] int64, frame_lengths [B]).

        The input is right-padded with zeros to F = ceil(T / frame_length)
        frames; frame_lengths[b] = ceil(lengths[b] / frame_length). Codes past
        a row's frame length encode padding and should be dropped.
        """
        if audio.dim() == 2:
            audio = audio.unsqueeze(1)
        if audio.dim() != 3 or audio.shape[1] != 1:
            raise ValueError(f"encode expects audio [B, 1, T], got {tuple(audio.shape)}")
        batch, _, length = audio.shape
        if lengths is None:
            lengths = torch.full((batch,), length, dtype=torch.long)
        lengths = torch.as_tensor(lengths, dtype=torch.long).reshape(-1)
        if lengths.numel() != batch:
            raise ValueError(f"lengths has {lengths.numel()} entries for a batch of {batch}")
        if bool((lengths < 0).any()) or bool((lengths > length).any()):
            raise ValueError(f"lengths {lengths.tolist()} must lie in [0, {length}]")
        frames = -(-length // self.frame_length)
        frame_lengths = (lengths + self.frame_length - 1) // self.frame_length
        if frames == 0:
            empty = torch.zeros(batch, self.num_codebooks, 0, dtype=torch.long, device=self.device)
            return empty, frame_lengths.to(self.device)
        padded = torch.zeros(batch, 1, frames * self.frame_length, dtype=self.dtype, device=self.device)
        padded[..., :length] = audio
        codes = self.quantizer.encode(self.encoder(padded))
        return codes, frame_lengths.to(codes.device)

    @torch.inference_mode()
    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """codes [B, C, F] -> audio [B, 1, F * frame_length].

        Out-of-range codes are clamped like upstream (row 0 to the semantic
        codebook, the others to the residual one) and also from below at 0;
        the caller's tensor is left untouched.
        """
        if codes.dim() != 3 or codes.shape[1] != self.num_codebooks:
            raise ValueError(f"decode expects codes [B, {self.num_codebooks}, F], got {tuple(codes.shape)}")
        if codes.dtype.is_floating_point or codes.dtype == torch.bool:
            raise ValueError(f"codes must be an integer tensor, got {codes.dtype}")
        safe = self._in_range(codes)
        if safe.shape[-1] == 0:
            return torch.zeros(codes.shape[0], 1, 0, dtype=self.dtype, device=self.device)
        if self.device_decode is not None:
            return self.device_decode.run(safe)
        return self.decoder(self.quantizer.decode(safe))

    def _in_range(self, codes: torch.Tensor) -> torch.Tensor:
        return torch.minimum(codes.to(device=self.device, dtype=torch.long).clamp(min=0), self._limits())

    @torch.inference_mode()
    def decode_long(self, codes: torch.Tensor, max_samples: int) -> torch.Tensor:
        """codes [B, C, F] -> audio [B, 1, F * frame_length] as decode gives it, with the decoder
        run over pieces of at most max_samples samples (pieces.py): a row longer than one call
        may hold stays within the call's memory."""
        latent = self.quantizer.decode(self._in_range(codes))
        decoder = self.device_decode.decode_latent if self.device_decode is not None else self.decoder
        hop = self.frame_length * codes.shape[-1] // latent.shape[-1]  # samples per latent step
        return decode_in_pieces(latent, decoder, hop, self.decoder_reach, max_samples)

    def _limits(self) -> torch.Tensor:
        """[1, C, 1] largest code per codebook, made once per device (no host copy per call)."""
        key = str(self.device)
        if key not in self._code_limits:
            sizes = torch.tensor([size - 1 for size in self.codebook_sizes], dtype=torch.long)
            self._code_limits[key] = sizes.view(1, -1, 1).to(self.device)
            if self.device.type == "cuda":  # complete before a decode on another stream reads it
                torch.cuda.synchronize(self.device)
        return self._code_limits[key]

    # ---- numpy batch API -------------------------------------------------
    def _max_padding(self, asked: Union[float, None, str]) -> Optional[float]:
        if asked != DEVICE_PADDING:
            return asked  # a share, or None: unbounded
        return CPU_MAX_PADDING if self.device.type == "cpu" else None

    def encode_batch(
        self,
        waves: Sequence[np.ndarray],
        *,
        max_batch_rows: int = DEFAULT_MAX_BATCH_ROWS,
        max_batch_samples: int = DEFAULT_MAX_BATCH_SAMPLES,
        max_padding: Union[float, None, str] = DEVICE_PADDING,
    ) -> list[np.ndarray]:
        """Mono float waves at `sample_rate` -> codes [C, ceil(len / frame_length)].

        Rows are grouped by length and right-padded; since every layer is
        causal, a row's codes do not depend on the rows batched with it.
        """
        arrays = []
        for index, wave in enumerate(waves):
            array = np.asarray(wave, dtype=np.float32)
            if array.ndim != 1:
                raise ValueError(f"wave {index} must be 1-D mono samples, got shape {array.shape}")
            arrays.append(array)
        results: list[Optional[np.ndarray]] = [None] * len(arrays)
        lengths = [len(array) for array in arrays]
        groups = _length_groups(
            lengths, max_batch_rows, max_batch_samples, self.frame_length, self._max_padding(max_padding)
        )
        for group in groups:
            longest = max(lengths[i] for i in group)
            if longest == 0:
                for i in group:
                    results[i] = np.zeros((self.num_codebooks, 0), dtype=np.int64)
                continue
            audio = torch.zeros(len(group), 1, longest, dtype=self.dtype, device=self.device)
            for row, i in enumerate(group):
                audio[row, 0, : lengths[i]] = torch.from_numpy(arrays[i])
            codes, frame_lengths = self.encode(audio, torch.tensor([lengths[i] for i in group]))
            codes = codes.cpu().numpy()
            for row, i in enumerate(group):
                results[i] = np.ascontiguousarray(codes[row, :, : int(frame_lengths[row])])
        return results  # type: ignore[return-value]

    def decode_batch(
        self,
        codes: Sequence[np.ndarray],
        *,
        max_batch_rows: int = DEFAULT_MAX_BATCH_ROWS,
        max_batch_samples: Optional[int] = None,
        max_padding: Union[float, None, str] = DEVICE_PADDING,
    ) -> list[np.ndarray]:
        """Codes [C, F_i] -> float32 waves of F_i * frame_length samples.

        Rows are grouped by length and right-padded with code 0; every layer
        is causal, so the padding never reaches a row's own samples. A group
        holds at most max_batch_rows rows and max_batch_samples padded samples
        (None: `max_batch_samples()`, the CPU's cap or the GPU's memory's). On
        CUDA the calls run on `stream`, which only this call waits for.
        """
        arrays = []
        for index, row_codes in enumerate(codes):
            array = np.asarray(row_codes)
            if array.ndim != 2 or array.shape[0] != self.num_codebooks:
                raise ValueError(f"codes {index} must have shape [{self.num_codebooks}, frames], got {array.shape}")
            if not np.issubdtype(array.dtype, np.integer):
                raise ValueError(f"codes {index} must be integers, got {array.dtype}")
            arrays.append(array.astype(np.int64, copy=False))
        if max_batch_samples is None:
            max_batch_samples = self.max_batch_samples()
        stream = self.stream
        with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
            return self._decode_groups(arrays, max_batch_rows, max_batch_samples, self._max_padding(max_padding))

    def _decode_groups(
        self, arrays: list[np.ndarray], max_rows: int, max_samples: int, max_padding: Optional[float]
    ) -> list[np.ndarray]:
        frames = [array.shape[1] for array in arrays]
        results: list[Optional[np.ndarray]] = [None] * len(arrays)
        samples = [f * self.frame_length for f in frames]
        for group in _length_groups(samples, max_rows, max_samples, 1, max_padding):
            longest = max(frames[i] for i in group)
            if longest == 0:
                for i in group:
                    results[i] = np.zeros(0, dtype=np.float32)
                continue
            batch = torch.zeros(len(group), self.num_codebooks, longest, dtype=torch.long)
            for row, i in enumerate(group):
                batch[row, :, : frames[i]] = torch.from_numpy(arrays[i])
            # a group over the cap is one row alone (_length_groups): decoded in pieces
            too_long = longest * self.frame_length > max_samples
            audio = (self.decode_long(batch, max_samples) if too_long else self.decode(batch)).float().cpu().numpy()
            for row, i in enumerate(group):
                results[i] = np.ascontiguousarray(audio[row, 0, : samples[i]])
        return results  # type: ignore[return-value]


def _length_groups(
    lengths: Sequence[int], max_rows: int, max_samples: int, quantum: int, max_padding: Optional[float] = None
) -> Iterable[list[int]]:
    """Indices grouped longest first so padded groups waste little work; a
    group holds at most max_rows rows and max_samples padded samples (a single
    row longer than that still forms its own group) and, with max_padding, at
    most that share of padding over its rows' own samples."""
    if max_rows < 1:
        raise ValueError(f"max_batch_rows must be >= 1, got {max_rows}")
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    group: list[int] = []
    group_width = own = 0
    for i in order:
        width = -(-lengths[i] // quantum) * quantum
        if group:
            padded = (len(group) + 1) * group_width
            too_padded = max_padding is not None and padded > (1 + max_padding) * (own + width)
            if len(group) + 1 > max_rows or padded > max_samples or too_padded:
                yield group
                group = []
        if not group:
            group_width, own = width, 0
        group.append(i)
        own += width
    if group:
        yield group
