"""The quality gate (`gate.py`), the per-row quality checks and the attempt logic it runs
(issue 21): host-side, numpy only, no torch. The optional ASR backend (`asr.py`) is imported
only when `quality.asr` is set.

A layer of actors/ (its __init__ draws them): it imports the engine, the codec and the leaves
(actors/*.py, actors/storage/), never synth/; a row in flight is synth's, so the gate names
only the fields it uses (gate.GatedRow)."""
