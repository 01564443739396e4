"""The quality flags' names and the ASR backends: no imports, so actors/settings.py
(QualitySettings) and the checks can both name them without an import cycle."""

# flags, most severe first: the order the best attempt is chosen by (attempts.py). No audio is
# unusable; a cut-off or looping row says the wrong thing; an ASR mismatch says other words;
# a wrong speech rate, long silences, clipping and loudness are flaws of a row that says them.
NO_AUDIO = "no_audio"
TRUNCATED = "truncated"
REPETITION = "repetition"
WER = "wer"
SPEECH_RATE = "speech_rate"
SILENCE = "silence"
CLIPPING = "clipping"
LOUDNESS = "loudness"
FLAGS = (NO_AUDIO, TRUNCATED, REPETITION, WER, SPEECH_RATE, SILENCE, CLIPPING, LOUDNESS)

ASR_BACKENDS = ("whisper",)  # Whisper through transformers (actors/quality/asr.py)
