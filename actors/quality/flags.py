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
# flags measured on decoded audio: a rejected one sends the row back to the engine from the
# finisher (actors/synth/gate.py); the others are known from the codes, before any decode
AUDIO_FLAGS = (WER, SPEAKER, SILENCE, CLIPPING, LOUDNESS, MOS)

ASR_BACKENDS = ("whisper",)  # Whisper through transformers (actors/quality/asr.py)
SPEAKER_BACKENDS = ("wavlm",)  # a WavLM x-vector model through transformers (actors/quality/speaker.py)
MOS_BACKENDS = ("dnsmos",)  # DNSMOS P.835's ONNX file through onnxruntime (actors/quality/mos.py)
