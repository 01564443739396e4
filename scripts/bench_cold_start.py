#!/usr/bin/env python3
"""Cold and warm start of a compiled engine, side by side: for each variant, a fresh process
with an empty compile cache (cold), then another on the cache the first left (warm), each
loading a random model, building the engine, warming it up (compiles, captures), then timing a
few decode steps. Variants (engine settings):

  eager     nothing compiled (the baseline's start and step)
  frame     engine.compile=on: the whole decode frame compiled (one graph per batch bucket)
  regions   engine.kernels=compiled: the kernels package's regions (norms, RoPE + K/V write,
            SiLU x mul) compiled by inductor, each serving every layer of both stacks
  fused     engine.kernels=fused: the Triton kernels (CUDA; the CPU runs their references)

On CUDA every variant runs its steps as CUDA graphs (engine.cuda_graphs), captured at warm-up.

    python scripts/bench_cold_start.py --size small --rows 32 --dtype bfloat16 --json out.json

Prints a table and writes JSON (docs/performance.md, "Cold and warm start").
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
VARIANTS = {
    "eager": {},
    "frame": {"compile": "on"},
    "regions": {"kernels": "compiled"},
    "fused": {"kernels": "fused"},
}


def child(args) -> dict:
    """One start: load, build, warm up, step. Runs in its own process (--child)."""
    began = time.perf_counter()
    import numpy as np
    import torch

    from actors.engine import Engine, EngineConfig, Request
    from actors.engine.tiny import random_model
    from actors.engine.types import upstream_sampling

    if args.threads:
        torch.set_num_threads(args.threads)
    imported = time.perf_counter()
    lm = random_model(args.size, dtype=args.dtype, device=args.device)
    loaded = time.perf_counter()
    settings = dict(VARIANTS[args.child], compile_cache_dir=args.cache, decode_buckets=[args.rows])
    settings["cuda_graphs"] = lm.device.type == "cuda"
    engine = Engine(lm, EngineConfig(max_rows=args.rows, max_tokens=args.max_tokens, **settings))
    built = time.perf_counter()
    sampling = upstream_sampling(lm.config.family)
    warm_up_s = engine.warm_up(sampling)
    warmed = time.perf_counter()
    rng = np.random.default_rng(0)
    for i in range(args.rows):
        prompt = np.zeros((1 + lm.config.num_codebooks, args.prompt_len), np.int64)
        prompt[0] = rng.integers(32, 127, args.prompt_len)
        engine.add(Request(f"r{i}", prompt, args.frames, sampling.with_seed(i), stop_on_eos=False))
    steps = []
    while engine.has_unfinished():
        t0 = time.perf_counter()
        engine.step()
        steps.append(time.perf_counter() - t0)
    decode = sorted(steps[1:])
    return {
        "variant": args.child,
        "import_s": imported - began,
        "load_s": loaded - imported,
        "build_s": built - loaded,
        "cache_loaded": engine.runner.cache_loaded,
        "warm_up_s": warm_up_s,
        "start_s": warmed - began,
        "first_step_ms": 1e3 * steps[0],
        "decode_step_ms": 1e3 * decode[len(decode) // 2],
    }


def measure(args, log=print) -> list[dict]:
    """Each variant cold (a fresh cache directory) then warm (the same directory), each start in
    a process of its own; the figures of every start."""
    rows = []
    forwarded = [f"--{k.replace('_', '-')}={getattr(args, k)}" for k in
                 ("size", "dtype", "rows", "prompt_len", "frames", "max_tokens", "threads", "device")]  # fmt: skip
    for variant in args.variants.split(","):
        cache = tempfile.mkdtemp(prefix=f"chorus-cold-{variant}-")
        for start in ("cold", "warm"):
            env = dict(os.environ, PYTHONPATH=str(REPO))
            env.pop("TORCHINDUCTOR_CACHE_DIR", None)
            env.pop("TRITON_CACHE_DIR", None)
            command = [sys.executable, __file__, "--child", variant, "--cache", cache, *forwarded]
            out = subprocess.run(command, env=env, capture_output=True, text=True, check=True).stdout
            result = json.loads(next(line[7:] for line in out.splitlines() if line.startswith("RESULT ")))
            result["start"] = start
            rows.append(result)
            log(
                f"{variant:<8} {start:<5} start {result['start_s']:7.1f} s (warm-up {result['warm_up_s']:6.1f} s, "
                f"cache loaded {result['cache_loaded']}), decode step {result['decode_step_ms']:7.1f} ms"
            )
    return rows


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", default="small")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--rows", type=int, default=32)
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--frames", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=512)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--device", default="cpu")
    p.add_argument("--variants", default="eager,frame,regions")
    p.add_argument("--json")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--cache", help=argparse.SUPPRESS)
    return p


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    if args.child:
        print("RESULT " + json.dumps(child(args)), flush=True)
        return 0
    rows = measure(args, log=lambda line: print(line, flush=True))
    report = {"size": args.size, "dtype": args.dtype, "rows": args.rows, "threads": args.threads, "runs": rows}
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
