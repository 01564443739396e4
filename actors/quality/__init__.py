"""Per-row quality checks and the attempt logic the actor's quality gate runs (issue 21):
host-side, numpy only, no torch. The optional ASR backend (`asr.py`) is imported only when
`quality.asr` is set."""
