"""chorus's generation engine for the Fish Audio dual-AR family: load a checkpoint, build
prompts, generate codes for many rows at once. Plain torch; usable without Ray."""

from .config import CheckpointError, ModelConfig, load_config
from .engine import Engine, EngineConfig
from .loader import LoadedModel, load_model
from .prompt import Prompt, PromptBuilder, PromptError, Reference
from .reference import reference_generate
from .types import STOP_BUDGET, STOP_EOS, STOP_ERROR, Request, Result, SamplingParams, upstream_sampling

__all__ = [
    "CheckpointError",
    "ModelConfig",
    "load_config",
    "Engine",
    "EngineConfig",
    "LoadedModel",
    "load_model",
    "Prompt",
    "PromptBuilder",
    "PromptError",
    "Reference",
    "reference_generate",
    "Request",
    "Result",
    "SamplingParams",
    "upstream_sampling",
    "STOP_BUDGET",
    "STOP_EOS",
    "STOP_ERROR",
]
