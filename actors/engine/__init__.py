"""chorus's generation engine for the Fish Audio dual-AR family: load a checkpoint, build
prompts, generate codes for many rows at once. Plain torch; usable without Ray.

A layer of actors/ (its __init__ draws them): it imports the leaves (actors/*.py,
actors/storage/) only, never the codec, quality/ or synth/.

The names below load lazily, so `from actors.engine.types import Request` or
`from actors.engine.settings import EngineConfig` never imports torch (the driver does that)."""

from __future__ import annotations

from actors.lazy_exports import lazy_exports

_EXPORTS = {
    "CheckpointError": "architecture",
    "ModelArchitecture": "architecture",
    "load_config": "architecture",
    "Engine": "engine",
    "EngineConfig": "settings",
    "LoadedModel": "loader",
    "load_model": "loader",
    "Prompt": "prompt",
    "PromptBuilder": "prompt",
    "PromptError": "prompt",
    "Reference": "prompt",
    "reference_generate": "reference",
    "Request": "types",
    "Result": "types",
    "SamplingParams": "types",
    "upstream_sampling": "types",
    "STOP_BUDGET": "types",
    "STOP_EOS": "types",
    "STOP_ERROR": "types",
}

__all__ = sorted(_EXPORTS)

__getattr__ = lazy_exports(__name__, _EXPORTS)
