"""Optional ASR for the quality gate: Whisper through `transformers`, loaded from a local model
directory (`quality.asr_model`; nothing is downloaded), run batched over finished rows on the
actor's device, giving each row `asr_text`, `asr_language`, `wer`, `cer` and `wer_recipe` against
its own text (actors/quality/text.py: Whisper's normaliser for the language, jiwer).

A clip of at most 30 s is one Whisper window (padded to 30 s, as Whisper always reads). A longer
clip is decoded by transformers' own long-form generation: OpenAI's sequential algorithm
(Whisper paper, section 3.8), each next window starting at the last timestamp the model
predicted, so no word is cut at a fixed 30 s boundary. Greedy, with no temperature fallback: a
row's transcript is a function of its audio. Each clip's features are computed alone and
right-padded, so a row hears the same frames whatever its batch-mates.

The language is `quality.asr_language` or, when that is null, the one Whisper detects in the
clip's first 30 s (transformers' `detect_language`, as its generate does by itself; called here
so the row records it): it picks the normaliser, so set it when the texts' language is known.

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
from actors.quality import text
from actors.quality.settings import QualitySettings

WHISPER_RATE = 16000
WINDOW_S = 30.0  # one Whisper window; longer clips go to the long-form decoder
WINDOW_SAMPLES = int(WINDOW_S * WHISPER_RATE)
HOP = 160  # samples per log-mel frame (a 30 s window is 3,000 frames)


@dataclass(frozen=True)
class Transcript:
    asr_text: str
    language: Optional[str]  # the language it was decoded in (a Whisper code, e.g. "en")
    recipe: str  # how wer and cer were computed (text.RECIPES)
    wer: float
    cer: float


@dataclass(frozen=True)
class Hearing:
    """What a clip says, and the language it was decoded in."""

    text: str
    language: Optional[str]


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

        from actors.precision import check_model_dtype

        self._torch = torch
        self.processor = WhisperProcessor.from_pretrained(model_dir, local_files_only=True)
        self.model = WhisperForConditionalGeneration.from_pretrained(model_dir, local_files_only=True)
        self.model.to(device, check_model_dtype(device)).eval()  # float16 on a GPU
        self.device, self.batch_rows = device, batch_rows
        self.language = _language_code(language) if language else None
        lang_to_id = getattr(self.model.generation_config, "lang_to_id", None) or {}
        self._language_of_id = {i: token.strip("<|>") for token, i in lang_to_id.items()}

    def hear(self, clips: Sequence[np.ndarray], sample_rate: int) -> list[Hearing]:
        """What each clip (float32 mono at sample_rate) says and in which language, in order:
        the clips of at most 30 s batch_rows at a time, the longer ones by long-form decoding."""
        waves = [resample(np.asarray(clip, dtype=np.float32), sample_rate, WHISPER_RATE) for clip in clips]
        heard: list[Optional[Hearing]] = [None] * len(waves)
        for long_form in (False, True):
            chosen = [i for i, w in enumerate(waves) if (len(w) > WINDOW_SAMPLES) == long_form]
            for start in range(0, len(chosen), self.batch_rows):
                batch = chosen[start : start + self.batch_rows]
                for i, result in zip(batch, self._decode([waves[i] for i in batch], long_form)):
                    heard[i] = result
        return heard

    def transcribe(self, clips: Sequence[np.ndarray], sample_rate: int) -> list[str]:
        """One text per clip, in order."""
        return [h.text for h in self.hear(clips, sample_rate)]

    def _features(self, waves: list[np.ndarray], long_form: bool):
        """Log-mel features and their frame mask. Short clips: each padded to 30 s by the
        extractor. Long ones: each clip's features alone, then right-padded with zeros (the
        decoder never reads past a row's mask), so no row's last frames see another's padding."""
        torch = self._torch
        extract = self.processor.feature_extractor
        if not long_form:
            features = extract(waves, sampling_rate=WHISPER_RATE, return_tensors="pt", return_attention_mask=True)
            return features.input_features, features.attention_mask
        alone = [
            extract(
                w, sampling_rate=WHISPER_RATE, return_tensors="pt", truncation=False, padding="longest"
            ).input_features[0]
            for w in waves
        ]
        frames = max(f.shape[-1] for f in alone)
        padded = torch.zeros((len(alone), alone[0].shape[0], frames), dtype=alone[0].dtype)
        mask = torch.zeros((len(alone), frames), dtype=torch.long)
        for row, f in enumerate(alone):
            padded[row, :, : f.shape[-1]] = f
            mask[row, : f.shape[-1]] = 1
        return padded, mask

    def _decode(self, waves: list[np.ndarray], long_form: bool) -> list[Hearing]:
        features, mask = self._features(waves, long_form)
        features = features.to(self.device, self.model.dtype)
        with self._torch.inference_mode():
            languages = [self.language] * len(waves) if self.language else self._detect(features)
            # how many tokens a window may take is the checkpoint's generation_config.max_length
            # (448 in OpenAI's: the decoder's positions)
            chosen = {"language": languages, "task": "transcribe"} if all(languages) else {}
            tokens = self.model.generate(
                features,
                attention_mask=mask.to(self.device),
                return_timestamps=True if long_form else None,
                **chosen,
            )
        texts = self.processor.batch_decode(tokens, skip_special_tokens=True)
        return [Hearing(t.strip(), language) for t, language in zip(texts, languages)]

    def _detect(self, features) -> list[Optional[str]]:
        """Each clip's language, from its first 30 s (None: a checkpoint without languages)."""
        if not self._language_of_id or not getattr(self.model.generation_config, "is_multilingual", False):
            return [None] * features.shape[0]
        ids = self.model.detect_language(features[:, :, : int(WINDOW_SAMPLES // HOP)])
        return [self._language_of_id.get(int(i)) for i in ids.reshape(-1).tolist()]

    def score(self, clips: Sequence[np.ndarray], sample_rate: int, texts: Sequence[str]) -> list[Transcript]:
        """Transcribe the clips and score each against its row's text, by the recipe of the
        language it was decoded in."""
        out = []
        for reference, heard in zip(texts, self.hear(clips, sample_rate)):
            recipe = text.recipe_for(heard.language)
            wer, cer = text.error_rates(reference, heard.text, recipe)
            out.append(Transcript(heard.text, heard.language, recipe, wer, cer))
        return out


def _language_code(language: str) -> str:
    """quality.asr_language as Whisper's code: "english" and "en" both give "en"."""
    from transformers.models.whisper.tokenization_whisper import TO_LANGUAGE_CODE

    language = language.strip().lower()
    return TO_LANGUAGE_CODE.get(language, language)


def load_asr(settings: QualitySettings, device: str) -> Optional[WhisperASR]:
    """The backend `quality.asr` names, on `device` (None when it is null: nothing imported)."""
    if settings.asr is None:
        return None
    settings.validate()
    return WhisperASR(
        settings.asr_model, device=device, language=settings.asr_language, batch_rows=settings.asr_batch_rows
    )
