"""What an actor loads once: the model, its codec (or a child process holding a copy), the
engine and the prompt builder, on the device the actor was granted. torch is imported here,
inside the actor's constructor, so importing the actor's package stays light for the driver."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from actors.synth.settings import ActorSettings, ModelSettings

log = logging.getLogger(f"chorus.{__name__}")  # one namespace: configuring "chorus" reaches every module


@dataclass
class Loaded:
    lm: Any
    codec: Any
    codec_runner: Any  # what decodes finished rows and encodes references
    engine: Any
    builder: Any
    codec_stream: Any  # CUDA: the finisher's own stream; None on CPU
    sampling: Any  # the job's sampling (upstream's for the family, with the run's overrides)
    checkpoint: Path
    codec_path: Path


def model_paths(model: ModelSettings) -> tuple[Path, Path]:
    """(checkpoint dir, codec file or dir): the configured ones, or the demo's (built here on
    first use) when no checkpoint is configured."""
    checkpoint, codec_path = model.checkpoint, model.codec
    if checkpoint is None:
        from actors.synth.demo_models import demo_assets

        cache_dir = model.cache_dir
        checkpoint, demo_codec = demo_assets(Path(cache_dir).expanduser() if cache_dir else None, model.demo_family)
        codec_path = codec_path or demo_codec
    checkpoint = Path(checkpoint)
    return checkpoint, Path(codec_path) if codec_path else checkpoint / "codec.pth"


def _log_warm_up(engine, seconds: float) -> None:
    if engine.runner.compiled:
        log.info(
            "decode frame compiled in %.1f s (engine.compile=%s; cache %s)",
            seconds, engine.config.compile, engine.runner.compile_cache,
        )  # fmt: skip
    if engine.graph_stats() is not None:
        log.info(
            "decode steps: %d CUDA graphs captured in %.1f s for %d slots (the rest when first met)",
            engine.graph_stats()["captures"], seconds, engine.config.max_rows,
        )  # fmt: skip


def load(settings: ActorSettings) -> Loaded:
    import torch

    from actors import native
    from actors.codec import load_codec
    from actors.engine import Engine, PromptBuilder, load_model, upstream_sampling
    from actors.engine.loader import resolve_dtype

    model, threads = settings.model, settings.run.threads
    if threads:
        # one actor per fraction of a CPU: more threads than granted cores thrash (80x
        # slower measured with two 2-thread actors on two cores)
        torch.set_num_threads(int(threads))
    checkpoint, codec_path = model_paths(model)
    device = model.device
    if device == "auto":
        # Ray hides the GPUs an actor was not granted (CUDA_VISIBLE_DEVICES), so this is
        # "cuda when granted"
        device = "cuda" if torch.cuda.is_available() else "cpu"
    lm = load_model(checkpoint, device=device, dtype=model.dtype)
    codec_dtype = resolve_dtype(model.codec_dtype, torch.device(device))  # auto: bf16 on CUDA, by the CPU's units else
    codec = load_codec(codec_path, device=device, dtype=codec_dtype)
    # CPU float32 only; the first actor on a node builds the kernels, into the compile cache
    kernels = native.cache_dir(settings.engine.compile_cache_dir) if model.codec_kernels else None
    if kernels is not None:
        codec.use_native_layers(kernels)
    # engine.codec_process (CPU): a copy of the codec in a child process, so the codec never
    # holds the engine loop's GIL
    codec_runner = codec
    if settings.engine.codec_process and codec.device.type == "cpu":
        from actors.synth.codec_process import CodecProcess

        dtype_name = str(codec_dtype).removeprefix("torch.")
        codec_runner = CodecProcess(
            codec_path, dtype=dtype_name, threads=int(threads or torch.get_num_threads()), kernels=kernels
        )
    if codec.num_codebooks != lm.config.num_codebooks:
        raise ValueError(
            f"codec {codec_path} has {codec.num_codebooks} codebooks, model "
            f"{checkpoint} {lm.config.num_codebooks}: they do not belong together"
        )
    # the engine group extends EngineConfig; the engine gets those fields alone
    engine = Engine(lm, settings.engine.engine_config())
    sampling = upstream_sampling(lm.config.family, **settings.sampling.overrides())
    sampling.validate()
    # a compiled frame is built here, before the first block arrives, for the job's sampling
    # (a frame specialises on it: top-k widths, which penalties run)
    _log_warm_up(engine, engine.warm_up(sampling))
    stream = torch.cuda.Stream(device=lm.device) if lm.device.type == "cuda" else None
    return Loaded(
        lm, codec, codec_runner, engine, PromptBuilder.for_model(lm), stream, sampling, checkpoint, codec_path
    )
