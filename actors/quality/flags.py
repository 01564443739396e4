"""The quality flags' names and the model backends: no imports, so actors/settings.py
(QualitySettings) and the checks can both name them without an import cycle."""

# flags, most severe first: the order the best attempt is chosen by (attempts.py). No audio is
# unusable; a cut-off or looping row says the wrong thing; an ASR mismatch says other words;
# another voice is the wrong speaker saying them; a wrong speech rate, long silences, clipping,
# loudness and a low predicted MOS are flaws of a row that says them in the right voice.
NO_AUDIO = "no_audio"
TRUNCATED = "truncated"
REPETITION = "repetition"
WER = "wer"
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
SPEAKER_BACKENDS = ("wavlm",)  # a WavLM x-vector model through transformers (actors/quality/speaker.py)
MOS_BACKENDS = ("dnsmos",)  # DNSMOS P.835's ONNX file through onnxruntime (actors/quality/mos.py)

# the thresholds the checks' defaults take (QualitySettings), each from its source
# The model card of microsoft/wavlm-base-plus-sv (https://huggingface.co/microsoft/wavlm-base-plus-sv,
# "Usage") compares the cosine of two of its x-vectors with `threshold = 0.86` ("the optimal threshold
# is dataset-dependent"): below it, not the same speaker. It holds for that checkpoint only.
WAVLM_SAME_SPEAKER_THRESHOLD = 0.86
# Emilia keeps only utterances with DNSMOS P.835 OVRL >= 3.0, "the lowest 'fair' quality
# anchor" of ITU-T P.835: He et al., "Emilia: A Large-Scale, Extensive, Multilingual, and
# Diverse Dataset for Speech Generation", arXiv:2501.15907, Sec. III (Filtering). The
# Emilia-YODAS increment used 2.4 instead (same paper, Sec. IV-B).
EMILIA_MIN_OVRL = 3.0
