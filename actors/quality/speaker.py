"""Optional speaker similarity for the quality gate: the cosine between a speaker embedding of a
row's synthesized audio and one of its reference voice clip, from a local model directory
(`quality.speaker_model`; nothing is downloaded): a WavLM x-vector through `transformers`
(`quality.speaker=wavlm`, here) or Seed-TTS-eval's WavLM ECAPA-TDNN (`wavlm_ecapa`,
actors/quality/wavlm_ecapa.py); `open_embedder` picks.

Imported only when `quality.speaker` is set: torch and transformers are imported inside
SpeakerEmbedder, so importing this module costs numpy only.
"""

from __future__ import annotations

import json
import math
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from actors.audio import resample
from actors.errors import ConfigError
from actors.quality.settings import SPEAKER_BACKENDS, WAVLM_SAME_SPEAKER_THRESHOLD  # noqa: F401 (named here too)

XVECTOR_ARCHITECTURE = "WavLMForXVector"
DOWNLOAD_HINT = "huggingface-cli download microsoft/wavlm-base-plus-sv --local-dir DIR"
# The x-vector head pools the mean AND the (Bessel-corrected) standard deviation of the TDNN's
# frames: one frame gives a NaN deviation, so two is the fewest that give an embedding at all.
MIN_POOLED_FRAMES = 2


class ClipEmbedder(Protocol):
    def embed(self, clips: Sequence[np.ndarray], sample_rate: int) -> np.ndarray: ...


class SpeakerEmbedder:
    """A WavLM x-vector checkpoint directory (config.json, weights and preprocessor_config.json,
    as `save_pretrained` writes them) on one device, giving unit-norm speaker embeddings.

    Each clip runs as its own forward pass. Padding clips into one batch changes a clip's
    embedding: the first conv layer's GroupNorm (feat_extract_norm="group", as in wavlm-base-plus-sv)
    normalizes each channel over the whole padded length, and the x-vector head's pooling lengths
    (`_get_tdnn_output_lengths`) ignore the TDNN's dilation, so frames made from padding are pooled
    too. Measured with random weights (transformers 5.24, torch seed 0, padded with the attention
    mask; tests/quality/test_speaker.py's tiny model, which keeps this conv stack and TDNN): a 0.5 s
    clip batched with a 3 s one had its conv-encoder output on its own frames moved by up to 6.2
    (values of magnitude 1.7) and its unit embedding by up to 0.14, cosine 0.981 to the clip alone
    (1 s next to 1.5 s: 0.994); a base-size WavLMConfig() gave 0.983 for 1 s of noise next to 3 s. A
    row's similarity would then depend on its batch-mates, by ~0.02, enough to carry a row near
    the 0.86 threshold across it either way; one clip per pass makes it a function of the row.

    A clip shorter than `min_samples` (at the model's rate; 5200 samples = 0.325 s for the
    wavlm-base-plus-sv conv stack and TDNN) gets a NaN row: the model has no embedding for it
    (too few frames for the TDNN's kernels and the deviation pooling). Zero-padding it up to the
    minimum would give a number dominated by the padding's silence, read as a real similarity by
    the gate; NaN lets the caller record "not measured" instead.
    """

    def __init__(self, model_dir: str, device: str = "cpu"):
        _check_xvector_config(model_dir)
        import torch
        from transformers import AutoFeatureExtractor, WavLMForXVector

        from actors.precision import check_model_dtype

        self._torch = torch
        try:
            self.feature_extractor = AutoFeatureExtractor.from_pretrained(model_dir, local_files_only=True)
            self.model = WavLMForXVector.from_pretrained(model_dir, local_files_only=True)
        except (OSError, ValueError) as e:
            raise ConfigError(
                f"quality.speaker_model: {model_dir} holds a WavLM x-vector config.json but cannot be "
                f"loaded ({e}); download the whole model beforehand (e.g. `{DOWNLOAD_HINT}`)"
            ) from None
        self.model.to(device, check_model_dtype(device)).eval()  # float16 on a GPU
        self.device = device
        self.sample_rate = int(self.feature_extractor.sampling_rate)
        self.dim = int(self.model.config.xvector_output_dim)
        self.min_samples = min_clip_samples(self.model.config)

    def embed(self, clips: Sequence[np.ndarray], sample_rate: int) -> np.ndarray:
        """(len(clips), dim) float32 unit-norm embeddings of float32 mono clips at sample_rate, in
        order; a clip too short to embed (or whose embedding is not finite) gets a row of NaN."""
        embeddings = np.full((len(clips), self.dim), np.nan, dtype=np.float32)
        for row, clip in enumerate(clips):
            wave = resample(np.asarray(clip, dtype=np.float32), sample_rate, self.sample_rate)
            if len(wave) >= self.min_samples:
                embeddings[row] = self._embed_alone(wave)
        return embeddings

    def _embed_alone(self, wave: np.ndarray) -> np.ndarray:
        # one clip, so nothing is padded: the attention mask would be all ones and is left out
        features = self.feature_extractor(wave, sampling_rate=self.sample_rate, return_tensors="pt")
        with self._torch.inference_mode():
            output = self.model(features.input_values.to(self.device, self.model.dtype))
        embedding = output.embeddings[0].float().cpu().numpy().astype(np.float64)
        norm = float(np.linalg.norm(embedding))
        if not (math.isfinite(norm) and norm > 0):
            return np.full(self.dim, np.nan, dtype=np.float32)
        return (embedding / norm).astype(np.float32)


def open_embedder(backend: str, model_dir: str, device: str = "cpu") -> ClipEmbedder:
    """The speaker-verification model quality.speaker names, from its local directory: the WavLM
    x-vector model (`wavlm`) or Seed-TTS-eval's WavLM ECAPA-TDNN (`wavlm_ecapa`)."""
    if backend == "wavlm_ecapa":
        from actors.quality.wavlm_ecapa import WavLMEcapaEmbedder

        return WavLMEcapaEmbedder(model_dir, device=device)
    if backend != "wavlm":
        raise ConfigError(f"quality.speaker must be one of {', '.join(SPEAKER_BACKENDS)}, got {backend!r}")
    return SpeakerEmbedder(model_dir, device=device)


def _check_xvector_config(model_dir: str) -> None:
    """Refuse a directory whose config.json is not a WavLM x-vector model's; read as JSON, without
    transformers, so that a wrong directory is refused before seconds of imports."""
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise ConfigError(
            f"quality.speaker_model: {model_dir} is not a WavLM x-vector model directory (no config.json); "
            f"download one beforehand (e.g. `{DOWNLOAD_HINT}`)"
        )
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(
            f"quality.speaker_model: {path} is not readable JSON ({e}); download the model again"
        ) from None
    if not isinstance(config, dict):
        config = {}
    model_type = config.get("model_type")
    architectures = config.get("architectures")
    architectures = [str(a) for a in architectures] if isinstance(architectures, list) else []
    if model_type != "wavlm" or XVECTOR_ARCHITECTURE not in architectures:
        raise ConfigError(
            f"quality.speaker_model: {model_dir} holds a {model_type!r} model ({', '.join(architectures) or 'no architectures'}), "
            f"not a WavLM x-vector model ({XVECTOR_ARCHITECTURE}); download one (e.g. `{DOWNLOAD_HINT}`)"
        )


def min_clip_samples(config: Any) -> int:
    """The fewest samples (at the model's rate) a WavLM x-vector model embeds: enough conv frames
    for the TDNN's dilated kernels to leave MIN_POOLED_FRAMES frames to pool."""
    frames = MIN_POOLED_FRAMES + sum((k - 1) * d for k, d in zip(config.tdnn_kernel, config.tdnn_dilation))
    # walk the conv stack backwards: a conv of kernel k, stride s needs (frames - 1) * s + k inputs
    for kernel, stride in reversed(list(zip(config.conv_kernel, config.conv_stride))):
        frames = (frames - 1) * stride + kernel
    return frames


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    """Cosine similarity of two embeddings, in [-1, 1]; NaN when either is zero or not finite
    (a clip the embedder could not measure)."""
    a64 = np.asarray(a, dtype=np.float64).ravel()
    b64 = np.asarray(b, dtype=np.float64).ravel()
    if a64.shape != b64.shape:
        raise ValueError(f"cosine of embeddings of different sizes: {a64.size} and {b64.size}")
    scale = float(np.linalg.norm(a64) * np.linalg.norm(b64))
    if not (math.isfinite(scale) and scale > 0):
        return math.nan
    # rounding can take a vector's cosine with itself a hair past 1
    return float(np.clip(np.dot(a64, b64) / scale, -1.0, 1.0))


class ReferenceEmbeddings:
    """Embeddings of reference clips, keyed by what the caller names a clip by (its content hash,
    its ref_id), least recently used dropped past `capacity`: a voice shared by many rows is
    embedded once. `hits` and `misses` count lookups.

    One lock guards the cache and is held while a missing clip is loaded and embedded, so two
    threads asking for the same new key embed it once; the actor asks from its one finisher
    thread and the model runs one clip at a time anyway, so nothing waits that could run.
    A failed load or embedding caches nothing and raises to the caller.
    """

    def __init__(self, embedder: ClipEmbedder, capacity: int = 1024):
        if capacity < 1:
            raise ValueError(f"ReferenceEmbeddings capacity must be >= 1, got {capacity}")
        self.embedder, self.capacity = embedder, capacity
        self.hits = self.misses = 0
        self._entries: OrderedDict[Hashable, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Hashable, load_clip: Callable[[], tuple[np.ndarray, int]]) -> np.ndarray:
        """The embedding of the clip `key` names; on a miss only, `load_clip()` gives the clip
        (float32 mono, sample rate) to embed. The array is shared: it is read-only."""
        with self._lock:
            embedding = self._entries.get(key)
            if embedding is not None:
                self._entries.move_to_end(key)
                self.hits += 1
                return embedding
            self.misses += 1
            clip, sample_rate = load_clip()
            embedding = self.embedder.embed([clip], sample_rate)[0]
            embedding.setflags(write=False)
            self._entries[key] = embedding
            if len(self._entries) > self.capacity:
                self._entries.popitem(last=False)
            return embedding

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def __contains__(self, key: Hashable) -> bool:
        with self._lock:
            return key in self._entries
