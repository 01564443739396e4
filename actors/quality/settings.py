"""The quality group of the run's settings: the flags' names, which of them reject an attempt,
the bound each check raises its flag at, and the optional model-based checks. A leaf of
quality/ (it imports only actors.errors and actors.bounds): the checks, the gate and the driver all name the
flags from here. Free of torch, Hydra and OmegaConf, like the other settings."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from actors.bounds import at_least, check_bounds, described, one_of, within
from actors.errors import ConfigError

# flags, most severe first: the order the best attempt is chosen by (attempts.py). No audio is
# unusable; a cut-off or looping row says the wrong thing; an ASR mismatch says other words;
# another voice is the wrong speaker saying them; a wrong speech rate, long silences, clipping,
# loudness and a low predicted MOS are flaws of a row that says them in the right voice.
NO_AUDIO = "no_audio"
TRUNCATED = "truncated"
REPETITION = "repetition"
WER = "wer"
# the file name of Seed-TTS-eval's speaker model (quality.speaker=wavlm_ecapa), as published
WAVLM_ECAPA_FILE = "wavlm_large_finetune.pth"
SPEAKER = "speaker"
SPEECH_RATE = "speech_rate"
SILENCE = "silence"
CLIPPING = "clipping"
LOUDNESS = "loudness"
MOS = "mos"
FLAGS = (NO_AUDIO, TRUNCATED, REPETITION, WER, SPEAKER, SPEECH_RATE, SILENCE, CLIPPING, LOUDNESS, MOS)
# the flags a stretch of a row's audio (a segment's, a turn's) shows on its own; the others
# need the whole row
LOCAL_FLAGS = (SILENCE, CLIPPING, LOUDNESS)

ASR_BACKENDS = ("whisper",)  # Whisper through transformers (actors/quality/asr.py)
# wavlm: a WavLM x-vector model through transformers (microsoft/wavlm-base-plus-sv; speaker.py);
# wavlm_ecapa: UniSpeech's WavLM-Large ECAPA-TDNN, Seed-TTS-eval's SIM model (wavlm_ecapa.py)
SPEAKER_BACKENDS = ("wavlm", "wavlm_ecapa")
MOS_BACKENDS = ("dnsmos",)  # DNSMOS P.835's ONNX file through onnxruntime (actors/quality/mos.py)

# the thresholds the checks' defaults take (QualitySettings), each from its source
# The model card of microsoft/wavlm-base-plus-sv (https://huggingface.co/microsoft/wavlm-base-plus-sv,
# "Usage") compares the cosine of two of its x-vectors with `threshold = 0.86` ("the optimal threshold
# is dataset-dependent"): below it, not the same speaker. It holds for that checkpoint only.
WAVLM_SAME_SPEAKER_THRESHOLD = 0.86
# each speaker backend's own bound when quality.min_speaker_similarity is null: only the x-vector
# model's card publishes one; Seed-TTS-eval reports its model's cosine as a mean, no threshold
SPEAKER_BOUNDS = {"wavlm": WAVLM_SAME_SPEAKER_THRESHOLD, "wavlm_ecapa": None}
# Emilia keeps only utterances with DNSMOS P.835 OVRL >= 3.0, "the lowest 'fair' quality
# anchor" of ITU-T P.835: He et al., "Emilia: A Large-Scale, Extensive, Multilingual, and
# Diverse Dataset for Speech Generation", arXiv:2501.15907, Sec. III (Filtering). The
# Emilia-YODAS increment used 2.4 instead (same paper, Sec. IV-B).
EMILIA_MIN_OVRL = 3.0

_REJECT_WORDS = f"flags from {', '.join(FLAGS)}; wer, speaker, mos need their check set"
_MODEL_WORDS = "set when quality.{backend} is"


@dataclass
class QualitySettings:
    """The quality gate and its checks (actors/quality/): which flags reject
    an attempt, how many attempts a row gets, the bound each flag is raised at, optional ASR."""

    # flags that reject an attempt and have the row (or the failed segment) generated again.
    # Default: no audio only, so a random demo model is not regenerated endlessly; quality=strict
    # adds truncated, repetition, speech_rate and silence for real checkpoints
    reject: list[str] = field(default_factory=lambda: [NO_AUDIO], metadata=described(_REJECT_WORDS))
    # attempts per row (or per segment of a long row) before it is kept as `rejected`
    max_attempts: int = field(default=3, metadata=at_least(1))
    # repetition: share of codebook-0 n-grams of repeat_ngram frames repeating an earlier one;
    # half the 4-grams repeating is a loop, not speech (chorus's own; no published bound)
    repeat_ngram: int = field(default=4, metadata=at_least(1))
    max_repeat_ratio: float = field(default=0.5, metadata=within(0, 1))
    # speech_rate: seconds of audio per non-space character (English ~0.06-0.08, Chinese ~0.2-0.3);
    # 0.02-0.4 spans fast English to slow Chinese with margin (chorus's own; no published bound)
    min_s_per_char: float = field(default=0.02, metadata=described("<= max_s_per_char"))
    max_s_per_char: float = field(default=0.4, metadata=described(">= min_s_per_char"))
    # silence: share of 20 ms frames quieter than silence_dbfs (RMS, full scale 1.0); a read
    # sentence's pauses are a small part of it, so over half is too much (chorus's own)
    silence_dbfs: float = -45.0
    max_silence_ratio: float = field(default=0.5, metadata=within(0, 1))
    # clipping: share of samples with |x| >= clip_level; over 0.1% is audible distortion
    # (chorus's own)
    clip_level: float = field(default=0.999, metadata=within(0, 1, closed="(]"))
    max_clipped_ratio: float = field(default=0.001, metadata=within(0, 1))
    # loudness: BS.1770-4 integrated loudness outside [min_lufs, max_lufs], or all below -70 LUFS
    min_lufs: float = field(default=-45.0, metadata=described("<= max_lufs"))
    max_lufs: float = field(default=-5.0, metadata=described(">= min_lufs"))
    # ASR (asr_text, wer, cer): a backend and a local model directory (nothing downloaded; null:
    # none, nothing of it imported), the language (null: detected), rows per batch, the wer bound
    # (0.5 keeps rows whose words mostly match: chorus's own; TTS evaluations report WER, they
    # publish no per-row filter)
    asr: Optional[str] = field(default=None, metadata=one_of(*ASR_BACKENDS, or_null=True))
    asr_model: Optional[str] = field(default=None, metadata=described(_MODEL_WORDS.format(backend="asr")))
    asr_language: Optional[str] = None
    asr_batch_rows: int = field(default=8, metadata=at_least(1))
    max_wer: float = field(default=0.5, metadata=at_least(0))
    # speaker similarity (speaker_similarity): a speaker-verification model from a local directory
    # (null: none, nothing imported), the row's audio against its reference clip; the flag below
    # the bound. wavlm: a WavLM x-vector model (microsoft/wavlm-base-plus-sv); wavlm_ecapa:
    # Seed-TTS-eval's SIM model (UniSpeech's wavlm_large_finetune.pth). The bound, null: the
    # backend's own -- 0.86 for wavlm (its model card's same-speaker threshold), none (measured,
    # never flagged) for wavlm_ecapa, whose source publishes no threshold
    speaker: Optional[str] = field(default=None, metadata=one_of(*SPEAKER_BACKENDS, or_null=True))
    speaker_model: Optional[str] = field(default=None, metadata=described(_MODEL_WORDS.format(backend="speaker")))
    min_speaker_similarity: Optional[float] = field(default=None, metadata=within(-1, 1, or_null=True))
    # predicted MOS (mos, mos_sig, mos_bak): DNSMOS P.835's ONNX file (null: none, nothing
    # imported); the flag below the bound. 3.0 OVRL: the Emilia corpus's filter (He et al., 2024)
    mos: Optional[str] = field(default=None, metadata=one_of(*MOS_BACKENDS, or_null=True))
    mos_model: Optional[str] = field(default=None, metadata=described(_MODEL_WORDS.format(backend="mos")))
    min_mos: float = EMILIA_MIN_OVRL
    # regeneration for the checks on decoded audio (silence, clipping, loudness, wer, speaker,
    # mos) stops once the frames generated again for them would exceed this multiple of the
    # row's frames: a one-segment row at max_attempts=3 needs 2.0; a long row that fails early
    # would otherwise regenerate most of itself max_attempts times per segment
    max_regenerated_share: float = field(default=2.0, metadata=at_least(0))

    def speaker_bound(self) -> Optional[float]:
        """The similarity below which the `speaker` flag is raised (None: never)."""
        if self.min_speaker_similarity is not None:
            return self.min_speaker_similarity
        return SPEAKER_BOUNDS.get(self.speaker or "wavlm")

    def validate(self) -> None:
        check_bounds(self, "quality")
        for flag in self.reject:
            if flag not in FLAGS:
                raise ConfigError(f"quality.reject: unknown flag {flag!r} (known: {', '.join(FLAGS)})")
        for flag, backend, example in ((WER, "asr", "whisper"), (SPEAKER, "speaker", "wavlm"), (MOS, "mos", "dnsmos")):
            if flag in self.reject and getattr(self, backend) is None:
                raise ConfigError(
                    f"quality.reject lists {flag!r} but quality.{backend} is null (set quality.{backend}={example})"
                )
        if SPEAKER in self.reject and self.speaker is not None and self.speaker_bound() is None:
            raise ConfigError(
                f"quality.reject lists 'speaker' but quality.speaker={self.speaker} has no published threshold: "
                "set quality.min_speaker_similarity"
            )
        for low, high in (("min_s_per_char", "max_s_per_char"), ("min_lufs", "max_lufs")):
            if not getattr(self, low) <= getattr(self, high):
                raise ConfigError(
                    f"quality.{low} ({getattr(self, low)}) must be <= quality.{high} ({getattr(self, high)})"
                )
        for backend, where in (
            ("asr", "a local model directory"),
            ("speaker", "a local model directory"),
            ("mos", "the local sig_bak_ovr.onnx file"),
        ):
            if getattr(self, backend) is not None and not getattr(self, f"{backend}_model"):
                raise ConfigError(f"quality.{backend} is set but quality.{backend}_model is null: name {where}")
