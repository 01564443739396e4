#!/usr/bin/env python3
"""The decode step's floor on paper: bytes it must move and products it must do, per model shape
and batch size, against a GPU's bandwidth and matrix rate (default: what the GPU check measured
on the H200, docs/bench/gpu_check_h200_run1.json). Prints a table and writes JSON.

    python scripts/gpu_roofline.py [--keys 512] [--rows 1,32,128,256] [--json OUT]

A step reads every weight once per pass (the slow stack once; the fast stack and its output
layer once per codebook: position 0 takes the slow hidden, then one pass per later codebook),
the candidate head (the semantic ids and <|im_end|>), and each row's K/V up to its length; it
multiplies each of those weights by each row (2 FLOP per weight per row) and each row's query
by its keys and values (4 FLOP per key per head dim per query head per layer).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# measured by scripts/gpu_check.py's ceilings step on the lent H200 (2026-12-04)
H200_BYTES_PER_S = 4.12e12
H200_BF16_FLOP_PER_S = 673e12


def block_params(dim: int, heads: int, kv_heads: int, head_dim: int, ffn: int) -> int:
    return dim * (heads + 2 * kv_heads) * head_dim + heads * head_dim * dim + 3 * dim * ffn


def shape_counts(size: str) -> dict:
    from actors.engine.architecture import parse_config
    from actors.engine.tiny import SIZE_FORMATS, SIZES, config_dict

    c = parse_config(config_dict(SIZE_FORMATS.get(size, "s1"), SIZES[size], 4096), size)
    slow = c.n_layer * block_params(c.dim, c.n_head, c.n_local_heads, c.head_dim, c.intermediate_size)
    fast = c.n_fast_layer * block_params(
        c.fast_dim, c.fast_n_head, c.fast_n_local_heads, c.fast_head_dim, c.fast_intermediate_size
    )
    passes = c.num_codebooks  # position 0, then codebooks 1..C-1
    per_row = slow + (c.codebook_size + 1) * c.dim + passes * (fast + c.codebook_size * c.fast_dim)
    return {
        "size": size,
        "weights_per_step": per_row,  # weights read (and multiplied by each row) per step
        "kv_bytes_per_token": c.slow_kv_bytes_per_token(2),
        "attention_flop_per_key": 4 * c.n_layer * c.n_head * c.head_dim,
    }


def floor(counts: dict, rows: int, keys: int, bandwidth: float, rate: float) -> dict:
    weight_bytes = 2 * counts["weights_per_step"]
    kv_bytes = rows * keys * counts["kv_bytes_per_token"]
    flop = 2 * rows * counts["weights_per_step"] + rows * keys * counts["attention_flop_per_key"]
    memory_s, compute_s = (weight_bytes + kv_bytes) / bandwidth, flop / rate
    step_s = max(memory_s, compute_s)
    return {
        "rows": rows,
        "keys": keys,
        "weight_gb": weight_bytes / 1e9,
        "kv_gb": kv_bytes / 1e9,
        "tflop": flop / 1e12,
        "memory_ms": 1e3 * memory_s,
        "compute_ms": 1e3 * compute_s,
        "bound": "memory" if memory_s >= compute_s else "compute",
        "floor_step_ms": 1e3 * step_s,
        "ceiling_frames_per_s": rows / step_s,
        "ceiling_audio_s_per_s": rows / step_s / (44100 / 2048),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="s1-mini,s2-pro")
    parser.add_argument("--rows", default="1,32,128,256")
    parser.add_argument("--keys", type=int, default=512, help="keys each row attends over")
    parser.add_argument("--bandwidth", type=float, default=H200_BYTES_PER_S, help="bytes/s")
    parser.add_argument("--rate", type=float, default=H200_BF16_FLOP_PER_S, help="bf16 FLOP/s")
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    table = []
    print(f"{'shape':<9}{'rows':>5}{'weights GB':>11}{'KV GB':>7}{'TFLOP':>7}{'mem ms':>8}{'math ms':>8}"
          f"{'floor ms':>9}{'frames/s':>10}{'audio s/s':>10}  bound")  # fmt: skip
    for size in args.sizes.split(","):
        counts = shape_counts(size)
        for rows in (int(r) for r in args.rows.split(",")):
            f = floor(counts, rows, args.keys, args.bandwidth, args.rate) | {"size": size}
            table.append(f)
            print(f"{size:<9}{rows:>5}{f['weight_gb']:>11.2f}{f['kv_gb']:>7.2f}{f['tflop']:>7.2f}"
                  f"{f['memory_ms']:>8.2f}{f['compute_ms']:>8.2f}{f['floor_step_ms']:>9.2f}"
                  f"{f['ceiling_frames_per_s']:>10.0f}{f['ceiling_audio_s_per_s']:>10.1f}  {f['bound']}")  # fmt: skip
    if args.json:
        Path(args.json).write_text(
            json.dumps({"bandwidth": args.bandwidth, "rate": args.rate, "table": table}, indent=2)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
