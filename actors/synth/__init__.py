"""The synthesis actor: one loaded model serving Arrow batches of rows (actor.py wires the
parts; docs/architecture.md §2 draws them). Importing the package stays light: torch, the
engine and the codec load inside SynthActor's constructor, and the names below load lazily,
so the actor's helper processes (`python -m actors.synth.listen_pool`, the codec's child)
import only what they serve, not the actor.

The top layer of actors/ (its __init__ draws them): it may import quality/, the engine, the
codec and the leaves; none of them imports it."""

from __future__ import annotations

from actors.lazy_exports import lazy_exports

_EXPORTS = {
    "SynthActor": "actor",
    "SynthStage": "actor",
    "output_table_per_row": "output",
    "Recorder": "recorder",
    "Trace": "recorder",
    "SEED_MASK": "rows",
    "WORD_JOINER": "rows",
    "RowError": "rows",
    "escape_special_tokens": "rows",
    "row_seed": "rows",
}

__all__ = sorted(_EXPORTS)

__getattr__ = lazy_exports(__name__, _EXPORTS)
