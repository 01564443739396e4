"""What an actor loads once: the model, its codec (or a child process holding a copy), the
engine and the prompt builder, on the device the actor was granted; on a GPU first the memory
plan (memory_plan.py: checked before any weights load), then the codec on a stream of its own
(codec_stream.py) and the listen pool (listen_pool.py). torch is imported here, inside the
actor's constructor, so importing the actor's package stays light for the driver."""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Optional

from actors.synth.memory_plan import device_plan
from actors.synth.settings import ActorSettings, ModelSettings

log = logging.getLogger(f"chorus.{__name__}")  # one namespace: configuring "chorus" reaches every module


@dataclass
class Loaded:
    lm: Any
    codec: Any
    codec_runner: Any  # what decodes finished rows and encodes references
    engine: Any
    builder: Any
    codec_stream: Any  # CUDA: the codec's own stream (the finisher's threads run on it); None on CPU
    sampling: Any  # the job's sampling (upstream's for the family, with the run's overrides)
    checkpoint: Path
    codec_path: Path
    memory_plan: Any = None  # CUDA: the device's MemoryPlan (memory_plan.py), measured parts set
    listen_pool: Any = None  # a ListenPool when rows decoded in this process are listened to on one


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


def load(settings: ActorSettings, codec_call_samples: Optional[int] = None) -> Loaded:
    """`codec_call_samples`: the most output samples one codec call holds, for the memory plan
    (None: what the codec's decode_batch allows today: memory_plan.codec_call_samples)."""
    import torch

    from actors.codec import load_codec
    from actors.engine import Engine, PromptBuilder, load_model, upstream_sampling
    from actors.engine.loader import resolve_device, resolve_dtype

    model, threads = settings.model, settings.run.threads
    if threads:
        # one actor per fraction of a CPU: more threads than granted cores thrash (80x
        # slower measured with two 2-thread actors on two cores)
        torch.set_num_threads(int(threads))
    checkpoint, codec_path = model_paths(model)
    # auto: Ray hides the GPUs an actor was not granted (CUDA_VISIBLE_DEVICES), so this is
    # "cuda when granted"
    device = resolve_device(model.device)
    lm_dtype, codec_dtype = resolve_dtype(model.dtype, device), resolve_dtype(model.codec_dtype, device)
    plan = None
    if device.type == "cuda":  # checked before any weights load: a plan that cannot fit stops here
        plan = device_plan(settings, checkpoint, codec_path, device, (lm_dtype, codec_dtype), codec_call_samples)
        log.info("memory plan for %s: %s", device, plan.line())
    lm = load_model(checkpoint, device=device, dtype=lm_dtype)
    codec = load_codec(codec_path, device=device, dtype=codec_dtype)
    if codec.num_codebooks != lm.config.num_codebooks:
        raise ValueError(
            f"codec {codec_path} has {codec.num_codebooks} codebooks, model "
            f"{checkpoint} {lm.config.num_codebooks}: they do not belong together"
        )
    codec_runner, stream = _codec_runner(settings, codec, codec_path, codec_dtype, plan)
    # the engine group extends EngineConfig; the engine gets those fields alone, and on a GPU
    # the share of memory the plan leaves it once the parts loaded after it are counted
    config = settings.engine.engine_config()
    if plan is not None:
        config = replace(config, memory_fraction=plan.engine_fraction())
    engine = Engine(lm, config)
    sampling = upstream_sampling(lm.config.family, **settings.sampling.overrides())
    sampling.validate()
    # a compiled frame is built here, before the first block arrives, for the job's sampling
    # (a frame specialises on it: top-k widths, which penalties run)
    _log_warm_up(engine, engine.warm_up(sampling))
    if plan is not None:
        kv = engine.kv_bytes()["total"]
        plan = plan.measured(slots=engine.config.max_rows, weights=_bytes(lm.model), codec=_bytes(codec), kv=kv)
    return Loaded(
        lm, codec, codec_runner, engine, PromptBuilder.for_model(lm), stream, sampling, checkpoint, codec_path, plan,
        _listen_pool(settings, codec_runner, device),
    )  # fmt: skip


def _codec_runner(settings: ActorSettings, codec, codec_path: Path, codec_dtype, plan) -> tuple[Any, Any]:
    """What decodes finished rows and encodes references, and the codec's CUDA stream (None on
    CPU): on CUDA the codec on its own stream, decoding on its fused path in calls the memory
    plan sized, compiled at load; on CPU with engine.codec_process a copy of it in a child
    process, so the codec never holds the engine loop's GIL; else the codec itself (CPU float32
    on chorus's kernels, which the first actor on a node builds into the compile cache)."""
    import torch

    from actors import native

    if codec.device.type == "cuda":
        from actors.synth.codec_stream import CodecOnStream

        decode = codec.configure_decode(memory_budget=plan.decode_budget)
        log.info("codec decode on %s: %s, warm-up %.1f s", codec.device, decode.describe(), decode.warm_up())
        return CodecOnStream(codec, codec.stream), codec.stream
    kernels = native.cache_dir(settings.engine.compile_cache_dir) if settings.model.codec_kernels else None
    if kernels is not None:
        codec.use_native_layers(kernels)
    if not settings.engine.codec_process:
        return codec, None
    from actors.synth.codec_process import CodecProcess

    threads = int(settings.run.threads or torch.get_num_threads())
    dtype_name = str(codec_dtype).removeprefix("torch.")
    return CodecProcess(codec_path, dtype=dtype_name, threads=threads, kernels=kernels), None


def _listen_pool(settings: ActorSettings, codec_runner, device) -> Any:
    """The listen pool (listen_pool.py) when rows are decoded in this process and
    engine.listen_processes (or its default for the device) asks for one; else None."""
    from actors.synth.listen_pool import ListenPool, default_processes

    processes = default_processes(settings.engine.listen_processes, device.type)
    if processes == 0 or hasattr(codec_runner, "hear"):  # none, or the codec's child listens
        return None
    return ListenPool(processes, settings.quality, codec_runner.sample_rate, codec_runner.frame_length)


def _bytes(module) -> int:
    """A module's parameters and buffers, in bytes."""
    return sum(t.numel() * t.element_size() for t in (*module.parameters(), *module.buffers()))
