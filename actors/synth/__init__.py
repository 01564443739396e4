"""The synthesis actor: one loaded model serving Arrow batches of rows (actor.py wires the
parts; docs/architecture.md §2 draws them). Importing the package stays light: torch, the
engine and the codec load inside SynthActor's constructor.

The top layer of actors/ (its __init__ draws them): it may import quality/, the engine, the
codec and the leaves; none of them imports it."""

from actors.synth.actor import SynthActor, SynthStage
from actors.synth.output import output_table_per_row
from actors.synth.recorder import Recorder, Trace
from actors.synth.rows import SEED_MASK, WORD_JOINER, RowError, escape_special_tokens, row_seed

__all__ = [
    "SEED_MASK",
    "WORD_JOINER",
    "Recorder",
    "RowError",
    "SynthActor",
    "SynthStage",
    "Trace",
    "escape_special_tokens",
    "output_table_per_row",
    "row_seed",
]
