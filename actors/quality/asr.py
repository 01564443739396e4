"""Optional ASR for the quality gate: Whisper through `transformers`, loaded from a local model
directory (`quality.asr_model`; nothing is downloaded), run batched over finished rows on the
actor's device, giving each row `asr_text`, `wer` and `cer` against its own text.

Imported only when `quality.asr` is set: transformers costs seconds to import and is an
optional dependency (`pip install "chorus-tts[asr]"`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np

from actors.audio import resample
from actors.errors import ConfigError
from actors.quality.settings import QualitySettings
from actors.quality.text import char_error_rate, word_error_rate

WHISPER_RATE = 16000
# Whisper reads 30 s windows; a longer clip is transcribed window by window and the texts
# joined (a word cut by a boundary may be misheard: WER on long rows reads a little high)
WINDOW_S = 30.0


@dataclass(frozen=True)
class Transcript:
    asr_text: str
    wer: float
    cer: float


class WhisperASR:
    """A Whisper checkpoint directory (config.json, weights, tokenizer and feature extractor
    files, as `save_pretrained` writes them) on one device."""

    def __init__(self, model_dir: str, device: str = "cpu", language: Optional[str] = None, batch_rows: int = 8):
        if not (Path(model_dir) / "config.json").is_file():
            raise ConfigError(
                f"quality.asr_model: {model_dir} is not a Whisper model directory (no config.json); "
                "download one beforehand (e.g. `huggingface-cli download openai/whisper-large-v3 --local-dir DIR`)"
            )
        import torch
        from transformers import WhisperForConditionalGeneration, WhisperProcessor

        self._torch = torch
        self.processor = WhisperProcessor.from_pretrained(model_dir, local_files_only=True)
        self.model = WhisperForConditionalGeneration.from_pretrained(model_dir, local_files_only=True)
        # half precision on a GPU (its tensor cores' rate; what comes out is read in float32),
        # float32 elsewhere
        self.model.to(device, torch.float16 if torch.device(device).type == "cuda" else torch.float32).eval()
        self.device, self.language, self.batch_rows = device, language, batch_rows

    def transcribe(self, clips: Sequence[np.ndarray], sample_rate: int) -> list[str]:
        """One text per clip (float32 mono at sample_rate), in order; batch_rows windows at a time."""
        windows, owner = [], []
        for index, clip in enumerate(clips):
            for window in _windows(resample(np.asarray(clip, dtype=np.float32), sample_rate, WHISPER_RATE)):
                windows.append(window)
                owner.append(index)
        texts = [[] for _ in clips]
        for start in range(0, len(windows), self.batch_rows):
            batch = windows[start : start + self.batch_rows]
            for index, text in zip(owner[start : start + self.batch_rows], self._generate(batch)):
                texts[index].append(text.strip())
        return [" ".join(t for t in parts if t) for parts in texts]

    def _generate(self, windows: list[np.ndarray]) -> list[str]:
        features = self.processor.feature_extractor(
            windows, sampling_rate=WHISPER_RATE, return_tensors="pt", return_attention_mask=True
        )
        # how many tokens a window may take is the checkpoint's generation_config.max_length
        # (448 in OpenAI's: the decoder's positions)
        language = {} if self.language is None else {"language": self.language, "task": "transcribe"}
        with self._torch.inference_mode():
            tokens = self.model.generate(
                features.input_features.to(self.device, self.model.dtype),
                attention_mask=features.attention_mask.to(self.device),
                **language,
            )
        return self.processor.batch_decode(tokens, skip_special_tokens=True)

    def score(self, clips: Sequence[np.ndarray], sample_rate: int, texts: Sequence[str]) -> list[Transcript]:
        """Transcribe the clips and score each against its row's text."""
        heard = self.transcribe(clips, sample_rate)
        return [Transcript(h, word_error_rate(t, h), char_error_rate(t, h)) for t, h in zip(texts, heard)]


def _windows(wave: np.ndarray) -> list[np.ndarray]:
    size = int(WINDOW_S * WHISPER_RATE)
    if len(wave) <= size:
        return [wave]
    return [wave[start : start + size] for start in range(0, len(wave), size)]


def load_asr(settings: QualitySettings, device: str) -> Optional[WhisperASR]:
    """The backend `quality.asr` names, on `device` (None when it is null: nothing imported)."""
    if settings.asr is None:
        return None
    settings.validate()
    return WhisperASR(
        settings.asr_model, device=device, language=settings.asr_language, batch_rows=settings.asr_batch_rows
    )
