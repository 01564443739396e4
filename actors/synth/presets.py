"""Settings presets that code without Hydra uses as the run config's YAML groups do. The
engine group's `gpu` preset is written once, here: `engine=gpu` selects it (conf/engine/gpu.yaml
names it; pipeline/config.py stores each preset in Hydra's ConfigStore under PRESET_GROUPS) and
scripts/gpu_job.py, which runs on an image without Hydra, builds its engine settings from it.
Like a YAML group file, a preset states only what differs from its group's defaults
(tests/test_config_defined_once.py checks both). Torch- and Hydra-free."""

from __future__ import annotations

from typing import Any

from actors.synth.settings import EngineSettings

# One GPU per actor: many rows decoded together (the frame budgets are the model's:
# model.budget, at most 48 s of audio a segment for a real checkpoint). Measured on an H200
# (docs/performance.md, the GPU check): each decode step one CUDA graph, 3-12x the eager step;
# frames/s grow with the rows up to 256 (S2-Pro 477 s of audio per s at 256 rows against 316 at
# 128). The slots are sized from the memory left after the weights, the codec and its decode
# batches, the check models and a workspace (actors/synth/memory_plan.py): 2 x layers x
# max_tokens x kv heads x head_dim x 2 bytes a slot (S1-mini ~350 MB, S2-Pro ~450 MB at 3,072
# positions), so S1-mini gets 256 slots and S2-Pro about 230 on an H200 (tests/synth/test_memory_plan.py).
GPU_ENGINE: dict[str, Any] = {
    "max_rows": 256,
    "memory_fraction": 0.85,
    "max_tokens": 3072,
    "cuda_graphs": True,
    # capturing every batch x key bucket (9 x 4) took 2-4 s per key bucket on the H200
    "warm_up_budget_s": 600,
    # rows per codec call: on a GPU a call for many rows costs about what one row's does
    "codec_batch_rows": 16,
}

ENGINE_PRESETS: dict[str, dict[str, Any]] = {"gpu": GPU_ENGINE}
# Hydra's group for each group's presets: a YAML option selects one with
# `defaults: [/presets/engine/gpu@_here_]`
PRESET_GROUPS: dict[str, dict[str, dict[str, Any]]] = {"presets/engine": ENGINE_PRESETS}


def engine_settings(preset: str, **changes: Any) -> EngineSettings:
    """The engine group as `engine=<preset>` makes it, with `changes` over it."""
    if preset not in ENGINE_PRESETS:
        raise KeyError(f"no engine preset {preset!r} (known: {', '.join(ENGINE_PRESETS)})")
    return EngineSettings(**{**ENGINE_PRESETS[preset], **changes})
