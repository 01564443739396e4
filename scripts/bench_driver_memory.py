"""The driver's memory per block of a long stream: what a run's driver keeps for every block
Ray Data hands it, measured as the growth of its resident memory over thousands of blocks.

    .venv/bin/python scripts/bench_driver_memory.py [--blocks 4000] [--rows 16] [--rounds 1]
        [--segment-blocks 1000] [--variants one segments] [--out bench-driver-memory.json]

The stream has a run's shape without an engine: a read of `blocks` blocks of `rows` rows -> an
actor pool of one (a callable class, as the synthesis stage) -> a write-like task per block
returning one stats row -> the driver's `iter_rows`, as pipeline/run/synthesis.py consumes it.
Each variant runs in a fresh process with its own local Ray (interleaved over --rounds):
  one       the whole stream as one dataset (what a run does)
  segments  the same blocks as several datasets of --segment-blocks each, one after another
            (each execution's bookkeeping is freed when it ends; a new actor pool each time)
  trim      one dataset, its operators' per-block stats lists emptied every 256 blocks through
            Ray Data's private attributes (how chorus did it before; a reference figure only)
Resident memory and the Python heap (tracemalloc, one frame) are read every 250 blocks; the
growth per block is the least-squares slope over the samples past the first 500 blocks (warm-up:
imports, pools). The Python heap is what the driver keeps; resident memory adds what the
allocator does not hand back (glibc keeps a freed arena per thread, and each dataset's
execution runs its own threads). The table prints KB per block and what a million-row job at
16 rows per block would add (62,500 blocks).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import tracemalloc

SAMPLE_EVERY = 250
WARM_BLOCKS = 500
TRIM_EVERY = 256


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def heap_mb() -> float:
    return tracemalloc.get_traced_memory()[0] / 2**20


class Stage:
    """The synthesis stage's place in the stream: an actor that returns its block's rows."""

    def __call__(self, batch):
        return batch


def write_like(batch):
    """The write stage's place: one stats row per block."""
    import pyarrow as pa

    return pa.table({"rows": [batch.num_rows]})


def stream(blocks: int, rows: int):
    import ray
    from ray.data import ActorPoolStrategy

    ds = ray.data.range(blocks * rows, override_num_blocks=blocks)
    ds = ds.map_batches(
        Stage, compute=ActorPoolStrategy(size=1), batch_size=rows, batch_format="pyarrow", num_cpus=0.25
    )
    return ds.map_batches(write_like, batch_size=None, batch_format="pyarrow", num_cpus=0.25)


def _trim(ds) -> None:
    executor = getattr(ds, "_current_executor", None)
    for operator in getattr(executor, "_topology", None) or {}:
        kept = getattr(operator, "_output_blocks_stats", None)
        if isinstance(kept, list):
            kept.clear()


def child(variant: str, blocks: int, rows: int, segment_blocks: int) -> dict:
    import ray
    from ray.data import DataContext

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    DataContext.get_current().enable_progress_bars = False
    tracemalloc.start(1)
    began = time.monotonic()
    samples, heap, seen = [], [], 0
    size = segment_blocks if variant == "segments" else blocks
    for first in range(0, blocks, size):
        ds = stream(min(size, blocks - first), rows)
        for _ in ds.iter_rows():
            seen += 1
            if variant == "trim" and seen % TRIM_EVERY == 0:
                _trim(ds)
            if seen % SAMPLE_EVERY == 0:
                samples.append((seen, rss_mb()))
                heap.append((seen, heap_mb()))
        del ds
    wall = time.monotonic() - began
    ray.shutdown()
    return {
        "variant": variant,
        "blocks": seen,
        "wall_s": wall,
        "samples": samples,
        "heap": heap,
        "ray": ray.__version__,
    }


def slope_kb(samples: list) -> float:
    points = [(b, m) for b, m in samples if b > WARM_BLOCKS]
    n = len(points)
    mean_b = sum(b for b, _ in points) / n
    mean_m = sum(m for _, m in points) / n
    cov = sum((b - mean_b) * (m - mean_m) for b, m in points)
    var = sum((b - mean_b) ** 2 for b, _ in points)
    return cov / var * 1024.0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--blocks", type=int, default=4000)
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--segment-blocks", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--variants", nargs="+", default=["one", "segments", "trim"])
    parser.add_argument("--out", default="bench-driver-memory.json")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.blocks, args.rows, args.segment_blocks)))
        return 0
    results = []
    for _ in range(args.rounds):
        for variant in args.variants:
            command = [sys.executable, __file__, "--child", variant, "--blocks", str(args.blocks)]
            command += ["--rows", str(args.rows), "--segment-blocks", str(args.segment_blocks)]
            done = subprocess.run(command, check=True, capture_output=True, text=True)
            entry = json.loads(done.stdout.strip().splitlines()[-1])
            entry["kb_per_block"] = slope_kb(entry["samples"])
            entry["heap_kb_per_block"] = slope_kb(entry["heap"])
            results.append(entry)
            print(
                f"{variant}: RSS {entry['kb_per_block']:.2f}, heap {entry['heap_kb_per_block']:.2f} KB/block",
                flush=True,
            )
    with open(args.out, "w") as f:
        json.dump({"blocks": args.blocks, "rows_per_block": args.rows, "results": results}, f, indent=2)
    print(f"| variant (Ray {results[0]['ray']}) | blocks | heap KB/block | RSS KB/block | heap MB per 62,500 blocks |")
    print("|---|---:|---:|---:|---:|")
    for e in results:
        heap, rss = e["heap_kb_per_block"], e["kb_per_block"]
        print(f"| {e['variant']} | {e['blocks']:,} | {heap:.2f} | {rss:.2f} | {heap * 62_500 / 1024:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
