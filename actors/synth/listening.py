"""The model-based checks on decoded audio, as the actor runs them: speaker similarity against
the row's reference (quality.speaker) and a predicted MOS (quality.mos). Each is loaded only
when set (nothing imported otherwise) and measures a finisher batch at a time.

A reference is embedded once per actor (actors/quality/speaker.py ReferenceEmbeddings, keyed
like the reference's codes): from its clip when the row gave one, read as the run reads it;
from its codes, decoded by the codec, when the row gave only `ref_codes` (the voice the model
was shown).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from typing import Any, Optional

import numpy as np

from actors.quality.settings import QualitySettings
from actors.synth.rows import RefSpec

log = logging.getLogger(f"chorus.{__name__}")  # one namespace: configuring "chorus" reaches every module

REFERENCE_EMBEDDINGS = 1024  # reference embeddings an actor keeps (a few KB each)


class SpeakerCheck:
    """Cosine similarity of each row's audio to its reference, by a speaker-verification model."""

    def __init__(self, embedder: Any, load_reference: Callable[[RefSpec], tuple[np.ndarray, int]]):
        from actors.quality.speaker import ReferenceEmbeddings

        self.embedder, self._load_reference = embedder, load_reference
        self.references = ReferenceEmbeddings(embedder, REFERENCE_EMBEDDINGS)

    def similarities(self, waves: Sequence[np.ndarray], refs: Sequence[Optional[RefSpec]], sample_rate: int) -> list:
        """One similarity per row (None: no reference, a reference that could not be read, or
        audio too short to embed)."""
        from actors.quality.speaker import cosine

        out: list[Optional[float]] = [None] * len(waves)
        wanted = [i for i, ref in enumerate(refs) if ref is not None]
        if not wanted:
            return out
        rows = self.embedder.embed([waves[i] for i in wanted], sample_rate)
        for i, row in zip(wanted, rows):
            ref = refs[i]
            try:
                reference = self.references.get(ref.key, lambda ref=ref: self._load_reference(ref))
            except Exception as e:  # the row's audio is fine; its similarity is not measured
                log.warning("speaker similarity: reference %s could not be embedded: %r", ref.key, e)
                continue
            value = cosine(row, reference)
            out[i] = value if math.isfinite(value) else None
        return out


def load_speaker_check(
    settings: QualitySettings, device: str, load_reference: Callable[[RefSpec], tuple[np.ndarray, int]]
) -> Optional[SpeakerCheck]:
    """quality.speaker's check on `device` (None when it is null: nothing imported)."""
    if settings.speaker is None:
        return None
    settings.validate()
    from actors.quality.speaker import open_embedder

    return SpeakerCheck(open_embedder(settings.speaker, settings.speaker_model, device=device), load_reference)


def load_mos(settings: QualitySettings, threads: Optional[int], device: str = "cpu") -> Any:
    """quality.mos's predictor (None when it is null: nothing imported). DNSMOS runs through
    onnxruntime: on a GPU actor's device where onnxruntime has CUDA (onnxruntime-gpu), else on
    the CPU (a small convolutional model, float32 as the published file is)."""
    if settings.mos is None:
        return None
    settings.validate()
    from actors.quality.mos import DNSMOS

    return DNSMOS(settings.mos_model, threads=threads, device=device)
