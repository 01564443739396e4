"""The engine's figures on one device, as scripts/gpu_check.sh records them: the device's own
ceilings, decode throughput eager / CUDA-graphed / compiled across batch sizes (with proof that
graphs were replayed, from torch's profiler), step time against the key count, and whether a
row's numbers depend on its batch-mates (the linears, and whole rows through the engine).
Tooling: the engine proper never imports this module."""

from __future__ import annotations

import statistics
import time
from collections import Counter
from dataclasses import replace
from typing import Optional

import numpy as np
import torch

from .engine import Engine
from .settings import EngineConfig
from .types import Request, SamplingParams, upstream_sampling

FRAME_RATE = 44100 / 2048  # codec frames per second of audio
# eager: the plain frame op by op; graphs: each step one CUDA graph; compiled: the frame through
# inductor inside the graphs; fused: the kernels package's ops inside the graphs (engine.kernels
# =fused); regions: those regions compiled by inductor inside the graphs (engine.kernels=compiled)
VARIANTS = ("eager", "graphs", "compiled", "fused", "regions")


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def ceilings(device: torch.device, seconds: float = 1.0) -> dict:
    """What this device moves and multiplies, measured: a large device-to-device copy (bytes
    read + written per second) and a large matrix product in bfloat16 (FLOP/s), each the
    median of repeated runs after a warm-up, on random data."""
    big = 1 << 28 if device.type == "cuda" else 1 << 24  # float32 values: 1 GiB on a GPU
    src = torch.randn(big, device=device)
    dst = torch.empty_like(src)
    n = 8192 if device.type == "cuda" else 512
    a, b = (torch.randn(n, n, device=device, dtype=torch.bfloat16) for _ in range(2))

    def median_s(fn) -> float:
        fn()
        sync(device)
        times, began = [], time.perf_counter()
        while time.perf_counter() - began < seconds or len(times) < 3:
            t0 = time.perf_counter()
            fn()
            sync(device)
            times.append(time.perf_counter() - t0)
        return statistics.median(times)

    copy_s = median_s(lambda: dst.copy_(src))
    product_s = median_s(lambda: a @ b)
    facts = {"device": str(device), "copy_bytes_per_s": 2 * src.numel() * 4 / copy_s}
    facts["bf16_flop_per_s"] = 2 * n**3 / product_s
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        facts |= {
            "name": props.name,
            "memory_bytes": props.total_memory,
            "multiprocessors": props.multi_processor_count,
        }
    return facts


def _requests(loaded, rows: int, prompt_len: int, frames: int, seed: int = 0) -> list[Request]:
    """Rows of `prompt_len` random text tokens that each run exactly `frames` frames."""
    rng = np.random.default_rng(seed)
    sampling = upstream_sampling(loaded.config.family)
    out = []
    for i in range(rows):
        prompt = np.zeros((1 + loaded.config.num_codebooks, prompt_len), np.int64)
        prompt[0] = rng.integers(32, 127, prompt_len)
        out.append(Request(f"r{i}", prompt, frames, sampling.with_seed(seed * 100_000 + i), stop_on_eos=False))
    return out


def variant_config(variant: str, rows: int, max_tokens: int, **extra) -> EngineConfig:
    """The engine settings of a variant (VARIANTS)."""
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
    kernels = {"fused": "fused", "regions": "compiled"}.get(variant, "eager")
    return EngineConfig(
        max_rows=rows,
        max_tokens=max_tokens,
        cuda_graphs=variant != "eager",
        compile="on" if variant == "compiled" else "off",
        **({"kernels": kernels} | extra),
    )


def launches_per_step(engine: Engine, steps: int) -> dict:
    """Kernel and graph launches per decode step, counted by torch's profiler (CUDA runtime and
    driver calls): a graphed step shows graph launches and (nearly) no kernel launches."""
    from torch.profiler import ProfilerActivity, profile

    try:
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(steps):
                engine.step()
        names = Counter(e.name for e in prof.events())
    except Exception as error:  # a profiler that cannot attach (no CUPTI) costs this figure only
        return {"error": f"{type(error).__name__}: {error}"}
    kernels = sum(v for k, v in names.items() if "LaunchKernel" in k)
    graphs = sum(v for k, v in names.items() if "GraphLaunch" in k)
    return {"steps": steps, "kernel_launches_per_step": kernels / steps, "graph_launches_per_step": graphs / steps}


def decode_figures(loaded, rows: int, variant: str, frames: int = 48, prompt_len: int = 64, **extra) -> dict:
    """`rows` rows decoded together, every one for `frames` frames: the median decode step (the
    steps after the first, which prefills), frames/s and audio seconds/s it gives, the start-up
    (captures, compiles), peak device memory, and launches per step from the profiler."""
    device = loaded.device
    engine = Engine(loaded, variant_config(variant, rows, prompt_len + frames + 8, **extra))
    sampling = upstream_sampling(loaded.config.family)
    began = time.perf_counter()
    warm_up_s = engine.warm_up(sampling)
    engine.generate(_requests(loaded, rows, prompt_len, 2, seed=1))  # untimed: lazy inits, allocator
    start_s = time.perf_counter() - began
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    for request in _requests(loaded, rows, prompt_len, frames):
        engine.add(request)
    steps = []
    profiled = min(3, frames - 2) if device.type == "cuda" else 0
    while len(steps) < frames - profiled:
        t0 = time.perf_counter()
        engine.step()
        steps.append(time.perf_counter() - t0)
    launches = launches_per_step(engine, profiled) if profiled > 0 else None
    while engine.has_unfinished():
        engine.step()
    step_s = statistics.median(steps[1:])
    return {
        "variant": variant,
        "rows": rows,
        "frames": frames,
        "prompt_len": prompt_len,
        "decode_step_ms": 1e3 * step_s,
        "frames_per_s": rows / step_s,
        "audio_s_per_s": rows / step_s / FRAME_RATE,
        "first_step_ms": 1e3 * steps[0],
        "warm_up_s": warm_up_s,
        "start_s": start_s,
        "peak_memory_bytes": torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None,
        "kv_bytes": engine.kv_bytes()["total"],
        "graphs": engine.graph_stats(),
        "launches": launches,
    }


def step_vs_keys(loaded, rows: int, key_counts: list[int], variant: str = "graphs", frames: int = 8) -> list[dict]:
    """The decode step of `rows` rows whose keys number about each of `key_counts` (prompts of
    that length): how the step grows with what attention reads."""
    engine = Engine(loaded, variant_config(variant, rows, max(key_counts) + frames + 1))
    out = []
    for keys in key_counts:
        for request in _requests(loaded, rows, keys - 1, frames, seed=keys):
            engine.add(request)
        steps = []
        while engine.has_unfinished():
            t0 = time.perf_counter()
            engine.step()
            steps.append(time.perf_counter() - t0)
        # the first step prefills; the next may capture this key bucket's graph
        step_s = statistics.median(steps[2:]) if len(steps) > 3 else steps[-1]
        out.append({"keys": keys, "rows": rows, "decode_step_ms": 1e3 * step_s, "frames_per_s": rows / step_s})
    return out


def linear_invariance(model: torch.nn.Module, sizes: list[int], seed: int = 0) -> dict:
    """For each distinct linear weight shape of `model`: rows of a product at M rows compared bit
    for bit with the same rows alone (M = 1); per M, the share of rows that differ."""
    generator = torch.Generator(device="cpu").manual_seed(seed)
    weights, seen = [], set()
    for module in model.modules():
        w = getattr(module, "weight", None)
        if isinstance(module, torch.nn.Linear) and w is not None and tuple(w.shape) not in seen:
            seen.add(tuple(w.shape))
            weights.append(w)
    differing = {m: 0 for m in sizes}
    total = {m: 0 for m in sizes}
    for w in weights:
        x = torch.randn(max(sizes), w.shape[1], generator=generator).to(w.device, w.dtype)
        alone = torch.cat([torch.nn.functional.linear(x[i : i + 1], w) for i in range(max(sizes))])
        for m in sizes:
            together = torch.nn.functional.linear(x[:m], w)
            differing[m] += int((together != alone[:m]).any(dim=1).sum())
            total[m] += m
    return {
        "dtype": str(weights[0].dtype) if weights else None,
        "shapes": [list(w.shape) for w in weights],
        "rows_differing_share": {str(m): differing[m] / total[m] for m in sizes},
    }


def engine_invariance(loaded, rows: int, frames: int, variant: str = "graphs") -> dict:
    """`rows` sampled rows decoded together against each decoded alone: how many come out with
    the same codes, and the first frame where any differs."""
    requests = _requests(loaded, rows, 48, frames, seed=7)
    together = Engine(loaded, variant_config(variant, rows, 48 + frames + 1)).generate(requests)
    single = Engine(loaded, variant_config(variant, 1, 48 + frames + 1))
    alone = [single.generate([r])[0] for r in requests]
    first: Optional[int] = None
    same = 0
    for a, b in zip(together, alone):
        if np.array_equal(a.codes, b.codes):
            same += 1
            continue
        n = min(a.codes.shape[1], b.codes.shape[1])
        frame = int(np.argmin((a.codes[:, :n] == b.codes[:, :n]).all(axis=0)))
        first = frame if first is None else min(first, frame)
    return {"variant": variant, "rows": rows, "frames": frames, "rows_identical": same, "first_differing_frame": first}


def prefill_figures(loaded, rows: int, variant: str, widths: tuple[int, int] = (96, 480), **extra) -> dict:
    """Admission of `rows` rows whose prompts spread over `widths` columns: the step that
    prefills them all and decodes their first frame, less the next (a decode step alone), per
    row (ms per admission). The eager path batches only equal widths; the fused one packs all."""
    device = loaded.device
    lo, hi = widths
    engine = Engine(loaded, variant_config(variant, rows, hi + 8, **extra))
    engine.generate(_requests(loaded, rows, lo, 2, seed=3))  # untimed: kernels, captures of the decode step
    out = []
    for repeat in range(2):  # the second: the prefill's graphs (fused path) are captured by now
        sampling = upstream_sampling(loaded.config.family)
        for i in range(rows):
            width = lo + (hi - lo) * i // max(1, rows - 1)
            prompt = np.zeros((1 + loaded.config.num_codebooks, width), np.int64)
            prompt[0] = (np.arange(width) * 7 + i) % 90 + 32
            engine.add(Request(f"p{repeat}-{i}", prompt, 3, sampling.with_seed(i), stop_on_eos=False))
        times = []
        while engine.has_unfinished():
            sync(device)
            t0 = time.perf_counter()
            engine.step()
            sync(device)
            times.append(time.perf_counter() - t0)
        out.append(1e3 * max(0.0, times[0] - times[1]) / rows)
    return {"variant": variant, "rows": rows, "widths": list(widths), "prefill_ms_per_row": out[-1], "first": out[0]}


def greedy_agreement(loaded, rows: int, frames: int, variant: str, base: dict, other: dict) -> dict:
    """Greedy rows decoded with the `base` settings and with `other` (an A/B of e.g. an FP8
    option): per row the leading frames whose codes are equal, their mean, and rows equal whole."""
    requests = [replace(r, sampling=SamplingParams(temperature=0)) for r in _requests(loaded, rows, 48, frames, 11)]
    results = [
        Engine(loaded, variant_config(variant, rows, 48 + frames + 8, **s)).generate(requests) for s in (base, other)
    ]
    leading = []
    for a, b in zip(*results):
        n = min(a.codes.shape[1], b.codes.shape[1])
        equal = (a.codes[:, :n] == b.codes[:, :n]).all(axis=0)
        leading.append(int(np.argmin(equal)) if not equal.all() else n)
    return {"rows": rows, "frames": frames, "leading_frames_equal": leading, "mean_leading": float(np.mean(leading)),
            "rows_identical": sum(n == frames for n in leading)}  # fmt: skip
