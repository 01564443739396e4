"""Side-by-side engine benchmark across source trees or environments, in one run.

Runs `python -m actors.engine bench <args>` for each variant in turn, repeated and interleaved
(a slow spell of a shared machine hits every variant), and prints each variant's median
frames/s per mode with its ratio to the first variant. A variant is NAME=TREE[:ENV=VALUE...]:
TREE is a checkout of chorus (e.g. a git worktree at an older commit), ENV settings apply to
that variant's processes only, and each +ARG is a bench argument for that variant alone.

    git worktree add --detach ../chorus-old 2cf692f
    python scripts/engine_ab.py --variant old=../chorus-old --variant new=. --repeats 3 \\
        --json artifacts/engine_ab.json -- --size tiny --rows 256 --max-rows 64 --threads 2
    python scripts/engine_ab.py --variant default-malloc=.:CHORUS_MALLOPT=0 --variant tuned=. -- --size small
    python scripts/engine_ab.py --batched-only --variant old=../chorus-old --variant eager=. \\
        --variant compiled=.:+--compile -- --size tiny --rows 256 --max-rows 64 --threads 1
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path


def parse_variant(text: str) -> tuple[str, Path, dict, list]:
    name, _, rest = text.partition("=")
    tree, *extras = rest.split(":")
    if not name or not tree:
        raise argparse.ArgumentTypeError(f"variant {text!r}: expected NAME=TREE[:ENV=VALUE...][:+ARG...]")
    env = dict(e.split("=", 1) for e in extras if not e.startswith("+"))
    return name, Path(tree).resolve(), env, [e[1:] for e in extras if e.startswith("+")]


# --batched-only: time just the batched mode through the tree's own bench helpers (older trees
# always add a one-row-at-a-time pass, which on 256 rows dwarfs the batched one)
BATCHED_ONLY = """
import argparse, json, sys, torch
from actors.engine.bench import _run_engine, _workload
from actors.engine.tiny import random_model
p = argparse.ArgumentParser()
for name, kind, default in [("size", str, "tiny"), ("rows", int, 32), ("max_rows", int, 32), ("prompt_len", int, 64),
                            ("frames", int, 64), ("references", int, 0), ("reference_frames", int, 100),
                            ("threads", int, 0), ("seed", int, 0), ("dtype", str, "float32"), ("json", str, None),
                            ("max_tokens", int, 0)]:
    p.add_argument("--" + name.replace("_", "-"), type=kind, default=default)
p.add_argument("--compile", action="store_true")
a = p.parse_args()
if a.threads:
    torch.set_num_threads(a.threads)
lm = random_model(a.size, seed=a.seed, device="cpu", dtype=a.dtype,
                  max_seq_len=max(4096, 2 * (a.prompt_len + a.frames + a.reference_frames)))
row, _ = _run_engine(lm, _workload(lm, a), a.max_rows, a)
json.dump({"modes": [row]}, open(a.json, "w"))
"""


def run_variant(tree: Path, env: dict, bench_args: list[str], batched_only: bool = False) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "bench.json"
        command = ["-c", BATCHED_ONLY] if batched_only else ["-m", "actors.engine", "bench"]
        proc = subprocess.run(
            [sys.executable, *command, *bench_args, "--json", str(out)],
            cwd=tree,
            env={**os.environ, "PYTHONPATH": str(tree), **env},
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            raise SystemExit(f"error: bench failed in {tree}:\n{proc.stderr[-3000:]}")
        return json.loads(out.read_text())


def machine() -> dict:
    """The CPU the runs measured (a figure means nothing without it)."""
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    fields = dict(line.split(":", 1) for line in info.splitlines() if ":" in line)
    flags = fields.get("flags\t\t", "").split()
    return {
        "cpu": fields.get("model name\t", "").strip() or platform.processor(),
        "cpus": os.cpu_count(),
        "bf16_units": [f for f in ("amx_bf16", "avx512_bf16") if f in flags],
    }


def commit_of(tree: Path) -> str:
    done = subprocess.run(["git", "-C", str(tree), "rev-parse", "HEAD"], capture_output=True, text=True)
    return done.stdout.strip() or "?"


def medians(runs: dict[str, list[dict]], figure: str) -> dict[str, dict[str, float]]:
    """Per variant, per mode: the median of `figure` over its runs (modes that lack it left out)."""
    table = {}
    for name, reports in runs.items():
        modes: dict[str, list[float]] = {}
        for report in reports:
            for m in report["modes"]:
                if m.get(figure) is not None:
                    modes.setdefault(m["mode"], []).append(m[figure])
        table[name] = {mode: statistics.median(values) for mode, values in modes.items()}
    return table


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variant", action="append", type=parse_variant, required=True)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", help="write every run and the medians here")
    parser.add_argument("--batched-only", action="store_true", help="time only the batched mode")
    parser.add_argument("bench_args", nargs=argparse.REMAINDER, help="after --: arguments for the engine bench")
    args = parser.parse_args(argv)
    bench_args = [a for a in args.bench_args if a != "--"]
    runs: dict[str, list[dict]] = {name: [] for name, _, _, _ in args.variant}
    for repeat in range(args.repeats):
        # every other round in reverse order: a machine slowing down or speeding up through the
        # run then weighs on every variant alike
        for name, tree, env, extra in args.variant[:: -1 if repeat % 2 else 1]:
            runs[name].append(run_variant(tree, env, bench_args + extra, args.batched_only))
    table, steps = medians(runs, "frames_per_s"), medians(runs, "decode_step_ms")
    first = args.variant[0][0]
    print(f"engine bench {' '.join(bench_args)}; median of {args.repeats} interleaved run(s) per variant")
    header = f"{'variant':<22}{'mode':<40}{'frames/s':>10}{'vs ' + first:>14}{'step ms':>10}{'faster':>8}"
    print(header)
    print("-" * len(header))
    for name, modes in table.items():
        for mode, fps in modes.items():
            base, base_step, step = table[first].get(mode), steps[first].get(mode), steps[name].get(mode)
            ratio = f"{fps / base:.2f}x" if base else "-"
            faster = f"{base_step / step:.2f}x" if base_step and step else "-"
            print(f"{name:<22}{mode:<40}{fps:>10.1f}{ratio:>14}{step or 0:>10.1f}{faster:>8}")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(
            json.dumps(
                {
                    "machine": machine(),
                    "commits": {name: commit_of(tree) for name, tree, _, _ in args.variant},
                    "bench_args": bench_args,
                    "medians": table,
                    "step_ms_medians": steps,
                    "runs": runs,
                },
                indent=2,
            )
        )
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
