"""CPU masked attention alone, the ways chorus has computed it, side by side in one process.

- rows-apart: chorus_attend::attend_rows (actors/engine/attend_rows.cpp), each (row, kv head)
  whole on one thread, the pairs spread over torch's threads; what attend() runs now;
- fused, one thread: torch's fused kernel in 128-key chunks on the calling thread alone (the
  fallback where the C++ op cannot be built; every masked call from 877e2dd until the op);
- fused, all threads: the same chunks at torch's thread count, as before 877e2dd (a row's last
  bits then follow its batch-mates at 2 threads: not exact, shown for speed only).

Shapes: the `small` model's slow stack (16 query heads on 8 kv heads of 128), the decode step
of 32 rows of mixed lengths and of one row, and prefills of 64 and 512 columns. Each case runs
every variant in turn, `--rounds` times interleaved; the table gives each variant's median ms
for one layer's call and its speed against the fused kernel on one thread.

    .venv/bin/python scripts/bench_cpu_attention.py --threads 1,2 --json docs/bench/cpu-attention-spr.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from actors.engine import attention  # noqa: E402
from scripts.engine_ab import machine  # noqa: E402

HEADS, KV_HEADS, HEAD_DIM = 16, 8, 128  # the `small` (S1-mini) slow stack
# name, rows, query columns per row, rows' lengths (keys up to and including the last column)
CASES = [
    ("decode, 32 rows ~190 keys", 32, 1, None),
    ("decode, 1 row, 190 keys", 1, 1, [190]),
    ("prefill, 1 row x 64", 1, 64, [64]),
    ("prefill, 1 row x 512", 1, 512, [512]),
]


def case_tensors(rows: int, queries: int, lengths, dtype, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    if lengths is None:  # the bench's rows: prompts ~64 and budgets ~64, half way through
        lengths = torch.randint(100, 280, (rows,), generator=g).tolist()
    keys = attention.attend_length(max(lengths), 4096, "cpu")
    q = torch.randn(rows, HEADS, queries, HEAD_DIM, generator=g).to(dtype)
    k = torch.randn(rows, KV_HEADS, keys, HEAD_DIM, generator=g).to(dtype)
    v = torch.randn(rows, KV_HEADS, keys, HEAD_DIM, generator=g).to(dtype)
    positions = torch.tensor(lengths)[:, None] - queries + torch.arange(queries)[None, :]
    mask = torch.arange(keys)[None, None, :] <= positions[:, :, None]
    return q, k, v, mask


def fused_chunks(q, k, v, mask, one_thread: bool):
    """attention.attend's chunked path, on one thread or on torch's threads."""
    b, h, t, d = q.shape
    group = h // k.shape[1]
    folded = q.reshape(b, k.shape[1], group * t, d)
    allowed = mask.unsqueeze(1).repeat(1, 1, group, 1)
    kept = attention.one_thread
    if not one_thread:
        attention.one_thread = contextlib.nullcontext
    try:
        return attention.attend_in_chunks(folded, k, v, allowed).reshape(b, h, t, d)
    finally:
        attention.one_thread = kept


VARIANTS = {
    "rows-apart (C++)": lambda q, k, v, m: torch.ops.chorus_attend.attend_rows(q, k, v, m),
    "fused, one thread": lambda q, k, v, m: fused_chunks(q, k, v, m, one_thread=True),
    "fused, all threads": lambda q, k, v, m: fused_chunks(q, k, v, m, one_thread=False),
}
BASE = "fused, one thread"


def time_case(tensors, rounds: int, calls: int) -> dict[str, float]:
    samples: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for run in VARIANTS.values():
        run(*tensors)  # warm-up
    for _ in range(rounds):
        for name, run in VARIANTS.items():
            t0 = time.perf_counter()
            for _ in range(calls):
                run(*tensors)
            samples[name].append((time.perf_counter() - t0) / calls * 1e3)
    return {name: statistics.median(values) for name, values in samples.items()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", default="1,2", help="comma list of torch thread counts")
    parser.add_argument("--dtypes", default="bfloat16,float32")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=3, help="calls per timed sample")
    parser.add_argument("--json", help="write the table here")
    args = parser.parse_args(argv)
    if not attention.load_native():
        raise SystemExit("error: the C++ attention op could not be built here (a compiler and ninja are needed)")
    results = []
    for threads in [int(t) for t in args.threads.split(",")]:
        torch.set_num_threads(threads)
        for dtype_name in args.dtypes.split(","):
            for name, rows, queries, lengths in CASES:
                tensors = case_tensors(rows, queries, lengths, getattr(torch, dtype_name))
                ms = time_case(tensors, args.rounds, args.calls)
                results.append({"threads": threads, "dtype": dtype_name, "case": name, "ms": ms})
    print(f"one layer's masked attention, {HEADS}/{KV_HEADS} heads x {HEAD_DIM}; median of {args.rounds} rounds")
    header = (
        f"{'threads':>7} {'dtype':<9} {'case':<28}"
        + "".join(f"{n:>22}" for n in VARIANTS)
        + f"{'C++ / one thread':>18}"
    )
    print(header)
    print("-" * len(header))
    for r in results:
        cells = "".join(f"{r['ms'][n]:>19.3f} ms" for n in VARIANTS)
        speed = r["ms"][BASE] / r["ms"]["rows-apart (C++)"]
        print(f"{r['threads']:>7} {r['dtype']:<9} {r['case']:<28}{cells}{speed:>17.2f}x")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        report = {"machine": machine(), "torch": torch.__version__, "rounds": args.rounds, "results": results}
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
