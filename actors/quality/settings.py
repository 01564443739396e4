"""The quality group of the run config (`quality.*`): which checks' flags reject an attempt,
how many attempts a row gets, the bounds each flag is raised at, and the optional ASR.

Written as actors/settings.py writes the actor's groups -- torch-, Hydra- and OmegaConf-free,
each default here once, `validate()` raising ConfigError naming the key -- and kept beside the
checks until the actor's settings module takes it in (the actor is being split).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from actors.quality.flags import ASR_BACKENDS, FLAGS, NO_AUDIO, WER
from actors.settings import ConfigError


@dataclass
class QualitySettings:
    # flags that reject an attempt and have the row (or the failed segment) generated again.
    # Default: no audio only, so a random demo model is not regenerated endlessly; quality=strict
    # adds truncated, repetition, speech_rate and silence for real checkpoints
    reject: list[str] = field(default_factory=lambda: [NO_AUDIO])
    # attempts per row (or per segment of a long row) before it is kept as `rejected`
    max_attempts: int = 3
    # repetition: share of codebook-0 n-grams of this many frames that repeat an earlier one
    repeat_ngram: int = 4
    max_repeat_ratio: float = 0.5
    # speech_rate: seconds of audio per character (whitespace not counted). English reads at
    # ~0.06-0.08 s/char, Chinese ~0.2-0.3 s/char: the bounds hold both
    min_s_per_char: float = 0.02
    max_s_per_char: float = 0.4
    # silence: share of 20 ms frames quieter than silence_dbfs (RMS, full scale 1.0)
    silence_dbfs: float = -45.0
    max_silence_ratio: float = 0.5
    # clipping: share of samples with |x| >= clip_level
    clip_level: float = 0.999
    max_clipped_ratio: float = 0.001
    # loudness: integrated loudness (ITU-R BS.1770-4) outside [min_lufs, max_lufs], or every
    # 400 ms block below the -70 LUFS gate
    min_lufs: float = -45.0
    max_lufs: float = -5.0
    # optional ASR (adds asr_text, wer, cer): the backend, and a local model directory (nothing
    # is downloaded); null = no ASR, nothing of it imported
    asr: Optional[str] = None
    asr_model: Optional[str] = None
    # the language Whisper transcribes in (null = it detects); rows per ASR batch
    asr_language: Optional[str] = None
    asr_batch_rows: int = 8
    # wer: word error rate above this (after normalising both texts) flags the row
    max_wer: float = 0.5

    def validate(self) -> None:
        for flag in self.reject:
            if flag not in FLAGS:
                raise ConfigError(f"quality.reject: unknown flag {flag!r} (known: {', '.join(FLAGS)})")
        if WER in self.reject and self.asr is None:
            raise ConfigError("quality.reject lists 'wer' but quality.asr is null (set quality.asr=whisper)")
        for key in ("max_attempts", "repeat_ngram", "asr_batch_rows"):
            if getattr(self, key) < 1:
                raise ConfigError(f"quality.{key} must be >= 1, got {getattr(self, key)}")
        for key in ("max_repeat_ratio", "max_silence_ratio", "max_clipped_ratio"):
            if not 0.0 <= getattr(self, key) <= 1.0:
                raise ConfigError(f"quality.{key} must be in [0, 1], got {getattr(self, key)}")
        for low, high in (("min_s_per_char", "max_s_per_char"), ("min_lufs", "max_lufs")):
            if not getattr(self, low) <= getattr(self, high):
                raise ConfigError(
                    f"quality.{low} ({getattr(self, low)}) must be <= quality.{high} ({getattr(self, high)})"
                )
        if not 0.0 < self.clip_level <= 1.0:
            raise ConfigError(f"quality.clip_level must be in (0, 1], got {self.clip_level}")
        if self.max_wer < 0:
            raise ConfigError(f"quality.max_wer must be >= 0, got {self.max_wer}")
        if self.asr is not None:
            if self.asr not in ASR_BACKENDS:
                raise ConfigError(f"quality.asr must be null or one of {', '.join(ASR_BACKENDS)}, got {self.asr!r}")
            if not self.asr_model:
                raise ConfigError("quality.asr is set but quality.asr_model is null: name a local model directory")

    @property
    def rejects(self) -> frozenset[str]:
        return frozenset(self.reject)
