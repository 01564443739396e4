"""The GPU check's steps for the fused decode step (scripts/gpu_check.py runs them, each in a
process of its own, its figures through the step's sink): kernels per step and prefill per
admission, the FP8 options, cold and warm start. Runs on the lent image as it is (torch, numpy;
Triton where torch ships it), and on the CPU at tiny sizes (--quick, in CI)."""

from __future__ import annotations

import sys
from pathlib import Path


def _model(size: str, device: str, quick: bool):
    from actors.engine.tiny import random_model

    return random_model("tiny" if quick else size, device=device, dtype="float32" if quick else "bfloat16")


def step_kernels(sink, device: str, quick: bool) -> None:
    """Kernels per decode step (the dispatcher's count, the profiler's launches where CUDA) on the
    eager and fused paths, and prefill ms per admission (rows of mixed widths)."""
    import numpy as np

    from actors.engine import Engine
    from actors.engine.figures import launches_per_step, prefill_figures, variant_config
    from actors.engine.kernels.counting import STEP_KERNEL_BUDGET, count_step_kernels, counting_model
    from actors.engine.types import Request, upstream_sampling

    for shape in STEP_KERNEL_BUDGET:
        lm = counting_model(shape) if device == "cpu" else _model(shape, device, quick)
        for variant in ("eager", "fused"):
            engine = Engine(lm, variant_config(variant, 4, 1024))
            prompt = np.full((1 + lm.config.num_codebooks, 16), 40, np.int64)
            for i in range(4):
                engine.add(Request(f"k{i}", prompt, 8, upstream_sampling(lm.config.family).with_seed(i), False))
            engine.step()
            figures = count_step_kernels(engine) | {"budget": STEP_KERNEL_BUDGET[shape]}
            figures.pop("by_op")
            if device == "cuda":
                figures["profiler"] = launches_per_step(engine, 2)
            sink.put(f"{shape}/{variant}", figures)
        del lm
    lm = _model("s1-mini", device, quick)
    for variant in ("graphs", "fused") if device == "cuda" else ("eager", "fused"):
        rows, widths = (4, (8, 24)) if quick else (32, (96, 480))
        sink.put(f"prefill/{variant}", prefill_figures(lm, rows, variant, widths))


def step_fp8(sink, device: str, quick: bool) -> None:
    """The FP8 options on the fused path: decode at 256 rows, and greedy agreement against bf16."""
    from actors.engine.figures import decode_figures, greedy_agreement

    variant = "fused"
    rows, frames = (4, 6) if quick else (256, 48)
    for shape, options in (("s1-mini", {"kv_dtype": "fp8"}), ("s2-pro", {"kv_dtype": "fp8", "fp8_weights": True})):
        lm = _model(shape, device, quick)
        for name, extra in [("fp8_kv", {"kv_dtype": "fp8"})] + ([("fp8_all", options)] if len(options) > 1 else []):
            sink.put(f"{shape}/{name}/agreement", greedy_agreement(lm, 4 if quick else 16, 6 if quick else 24,
                                                                   variant, {}, extra))  # fmt: skip
            sink.put(f"{shape}/{name}/{rows}", decode_figures(lm, rows, variant, frames=frames, **extra))
        del lm


def step_start(sink, device: str, quick: bool) -> None:
    """Cold and warm start of an engine (fresh processes; a fresh compile cache, then the same)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import bench_cold_start

    variants = "fused" if quick else "fused,regions"
    size, rows = ("tiny", 4) if quick else ("s1-mini", 32)
    args = bench_cold_start.parser().parse_args(
        [f"--size={size}", f"--rows={rows}", "--frames=6", "--max-tokens=512", f"--device={device}",
         f"--variants={variants}", "--threads=0", f"--dtype={'float32' if quick else 'bfloat16'}"]
    )  # fmt: skip
    sink.put("runs", bench_cold_start.measure(args, log=lambda line: None))
