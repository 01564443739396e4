"""Where a decode frame's time goes, per dtype, side by side: the frame's wall time split into
its parts (the packed linears, slow and fast attention, norms, RoPE, sampling, the rest), the
same frame's linears replayed back to back on their own, and each part's bfloat16 / float32
ratio. This is the profile behind the bf16 figures in docs/performance.md: a frame gains what
its parts gain, weighted by their share, so the ratio of the linears and the share of
everything else bound what bf16 can reach on a CPU.

    .venv/bin/python scripts/bench_frame_parts.py [--size small] [--rows 32] [--prompt-len 98]
        [--steps 8] [--dtypes float32,bfloat16] [--rounds 2] [--threads 2] [--json OUT]

Timing is wall time around each part (perf_counter), taken only in decode steps where every row
is live; the rounds interleave the dtypes and each figure is the median over rounds of a
round's mean step. Measures by wrapping the engine's own functions for the run, so the
numbers are the engine's real calls, with ~1 us of timer cost per call.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import defaultdict

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from actors.engine import Engine, EngineConfig, Request, SamplingParams, packing  # noqa: E402
from actors.engine import model as model_module  # noqa: E402
from actors.engine import runner as runner_module  # noqa: E402
from actors.engine.tiny import random_model  # noqa: E402
from actors.precision import CpuUnits  # noqa: E402
from scripts.bench_soak import cpu_name as model_name  # noqa: E402

PARTS = ["linears", "slow attention", "fast attention", "norms", "rope", "sampling"]


class PartClock:
    """Adds each wrapped call's wall time to its part while `on`; records the linear calls
    of one step (their inputs' shapes and the packed weights) for the replay."""

    def __init__(self):
        self.on = False
        self.seconds: dict[str, float] = defaultdict(float)
        self.record: list | None = None

    def wrap(self, owner, name: str, part) -> None:
        """Replace owner.name by a timed call; `part` names the part, or picks it from the args."""
        original = getattr(owner, name)

        def timed(*args, **kwargs):
            if not self.on:
                return original(*args, **kwargs)
            start = time.perf_counter()
            out = original(*args, **kwargs)
            self.seconds[part(*args) if callable(part) else part] += time.perf_counter() - start
            return out

        setattr(owner, name, timed)


def install(clock: PartClock, rows: int, steps: list, warm_steps: int = 2) -> None:
    # before any engine packs its linears (the packed forward binds the function then)
    clock.wrap(packing, "packed_linear", "linears")
    timed_linear = packing.packed_linear

    def linear_recorded(x, weight, bias):
        if clock.on and clock.record is not None:
            clock.record.append((tuple(x.shape), weight, bias))
        return timed_linear(x, weight, bias)

    packing.packed_linear = linear_recorded
    # the fast stack's decode attends without a mask; the slow stack's always has one
    clock.wrap(model_module, "attend", lambda q, k, v, mask: "fast attention" if mask is None else "slow attention")
    clock.wrap(model_module.RMSNorm, "forward", "norms")
    clock.wrap(model_module.HeadRMSNorm, "forward", "norms")
    clock.wrap(model_module, "apply_rope", "rope")
    clock.wrap(runner_module, "pick_main", "sampling")
    clock.wrap(runner_module, "pick_code", "sampling")
    decode = runner_module.ModelRunner.decode
    full_steps = 0

    def decode_timed(self, n_live, keep_logits=False):
        nonlocal full_steps
        full_steps = full_steps + 1 if n_live == rows else 0
        clock.on = full_steps > warm_steps  # the first full steps warm up
        start = time.perf_counter()
        out = decode(self, n_live, keep_logits)
        if clock.on:
            steps.append(time.perf_counter() - start)
        clock.on = False
        return out

    runner_module.ModelRunner.decode = decode_timed


def workload(loaded, rows: int, prompt_len: int, frames: int) -> list[Request]:
    rng = np.random.default_rng(0)
    c = loaded.config
    requests = []
    for i in range(rows):
        prompt = np.zeros((1 + c.num_codebooks, prompt_len), np.int64)
        prompt[0] = rng.integers(32, 127, prompt_len)
        sampling = SamplingParams(temperature=0.8, top_p=0.8, top_k=30, seed=i)
        requests.append(Request(f"r{i}", prompt, frames, sampling, stop_on_eos=False))
    return requests


def replay_linears(calls: list, dtype: torch.dtype, linear) -> float:
    """The recorded step's linear calls back to back, on fresh inputs of the same shapes."""
    inputs = [torch.randn(shape).to(dtype) for shape, _, _ in calls]
    start = time.perf_counter()
    for x, (_, weight, bias) in zip(inputs, calls):
        linear(x, weight, bias)
    return time.perf_counter() - start


def one_round(loaded, args, clock: PartClock, steps: list, linear) -> dict:
    # rows start together, so the last `steps` frames run with every row live
    frames = args.steps + 3  # two warm steps, the timed ones, and the last, which ends every row
    requests = workload(loaded, args.rows, args.prompt_len, frames)
    engine = Engine(loaded, EngineConfig(max_rows=args.rows, max_tokens=args.prompt_len + frames))
    engine.generate(requests[:1])  # warm-up, not timed
    steps.clear()
    clock.seconds.clear()
    clock.record = []
    engine.generate(requests)
    n = max(1, len(steps))
    calls = clock.record[: len(clock.record) // n]  # one step's calls
    clock.record = None
    figures = {"step_ms": 1000 * sum(steps) / n, "steps": len(steps)}
    figures.update({part: 1000 * clock.seconds.get(part, 0.0) / n for part in PARTS})
    figures["other"] = figures["step_ms"] - sum(figures[p] for p in PARTS)
    figures["linears replayed alone"] = 1000 * replay_linears(calls, loaded.dtype, linear)
    return figures


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", default="small", choices=["tiny", "small", "s1-mini"])
    p.add_argument("--rows", type=int, default=32)
    p.add_argument("--prompt-len", type=int, default=98)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    clock, steps = PartClock(), []
    linear = packing.packed_linear
    install(clock, args.rows, steps)
    dtypes = args.dtypes.split(",")
    models = {d: random_model(args.size, seed=0, device="cpu", dtype=d, max_seq_len=4096) for d in dtypes}
    runs: dict[str, list[dict]] = {d: [] for d in dtypes}
    for _ in range(args.rounds):
        for d in dtypes:
            runs[d].append(one_round(models[d], args, clock, steps, linear))
    keys = ["step_ms", *PARTS, "other", "linears replayed alone"]
    medians = {d: {k: float(np.median([r[k] for r in runs[d]])) for k in keys} for d in dtypes}
    print_table(medians, dtypes, keys, args)
    if args.json:
        report = {"args": vars(args), "cpu": cpu_name(), "torch": torch.__version__, "medians": medians, "runs": runs}
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
        print(f"wrote {args.json}")
    return 0


def print_table(medians: dict, dtypes: list, keys: list, args) -> None:
    base = dtypes[0]
    print(f"{args.size}, {args.rows} rows, prompt {args.prompt_len}, {args.threads} threads, {cpu_name()}")
    print(
        f"{'part (ms per frame)':<26}"
        + "".join(f"{d:>12}" for d in dtypes)
        + "".join(f"{d + '/' + base:>22}" for d in dtypes[1:])
    )
    for k in keys:
        line = f"{k:<26}" + "".join(f"{medians[d][k]:>12.1f}" for d in dtypes)
        line += "".join(f"{medians[base][k] / max(medians[d][k], 1e-9):>21.2f}x" for d in dtypes[1:])
        share = 100 * medians[dtypes[-1]][k] / medians[dtypes[-1]]["step_ms"]
        print(line + (f"   ({share:.0f}% of the {dtypes[-1]} frame)" if k != "step_ms" else ""))


def cpu_name() -> str:
    """The CPU's model name and the bf16 unit the dtype rule sees (actors/precision.py)."""
    return f"{model_name()}, bf16 unit: {CpuUnits.of_this_cpu().bf16_unit() or 'none'}"


if __name__ == "__main__":
    sys.exit(main())
