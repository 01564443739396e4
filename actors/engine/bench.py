"""Engine throughput, side by side in one process on the same requests:
the engine at --max-rows B, the same engine one row at a time (max_rows 1), optionally the
uncached reference loop, and (with --references) prefix reuse on vs off.

Every row runs its full frame budget (EOS stopping off) so each mode does identical work.
With --repeats N the modes run N times, interleaved, and each reports its median run."""

from __future__ import annotations

import json
import resource
import time
from dataclasses import replace
from typing import Optional

import numpy as np
import torch

from .allocator import tune_malloc
from .engine import Engine, EngineConfig
from .reference import reference_generate
from .types import Request, upstream_sampling

FRAME_RATE = 44100 / 2048  # codec frames per second of audio


def _workload(loaded, args) -> list[Request]:
    rng = np.random.default_rng(args.seed)
    c = loaded.config
    sampling = upstream_sampling(c.family)
    refs = []
    for _ in range(args.references):
        codes = rng.integers(0, c.codebook_size, (c.num_codebooks, args.reference_frames))
        prefix = np.zeros((1 + c.num_codebooks, args.reference_frames + 2), np.int64)
        prefix[0, 0] = loaded.im_end_id  # a text column, then the reference frames
        prefix[0, 1:-1] = codes[0] + c.semantic_begin_id
        prefix[1:, 1:-1] = codes
        prefix[0, -1] = loaded.im_end_id
        refs.append(prefix)
    requests = []
    for i in range(args.rows):
        text_len = max(1, int(args.prompt_len * rng.uniform(0.5, 1.5)))
        frames = max(1, int(args.frames * rng.uniform(0.5, 1.5)))
        text = np.zeros((1 + c.num_codebooks, text_len), np.int64)
        text[0] = rng.integers(32, 127, text_len)  # printable byte tokens
        if refs:
            ref = refs[i % len(refs)]
            prompt = np.concatenate([ref, text], axis=1)
            requests.append(
                Request(
                    f"r{i}",
                    prompt,
                    frames,
                    replace(sampling, seed=i),
                    stop_on_eos=False,
                    prefix_key=f"ref{i % len(refs)}",
                    prefix_len=ref.shape[1],
                )
            )
        else:
            requests.append(Request(f"r{i}", text, frames, replace(sampling, seed=i), stop_on_eos=False))
    return requests


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _row(mode: str, results, wall: float, kv_bytes: int) -> dict:
    frames = sum(r.frames for r in results)
    errors = [r.error for r in results if r.error]
    if errors:
        raise RuntimeError(f"{mode}: {len(errors)} request(s) failed, e.g. {errors[0]}")
    first = sorted(r.first_frame_ms for r in results)
    return {
        "mode": mode,
        "rows": len(results),
        "frames": frames,
        "wall_s": wall,
        "frames_per_s": frames / wall,
        "rows_per_s": len(results) / wall,
        # seconds of audio generated per wall second (> 1: faster than real time)
        "x_realtime": frames / FRAME_RATE / wall,
        "ttff_ms_p50": first[len(first) // 2],
        "ttff_ms_first": first[0],
        # one decode step's latency as the rows saw it: each row's wall time per frame after
        # its first. Rows admitted together wait for every batch-mate's prefill before their
        # first frame (TTFF holds that); a prefill of a row admitted later holds up the steps
        # it runs in, and stays in
        "decode_step_ms": sum(r.total_ms - r.first_frame_ms for r in results)
        / max(1, sum(r.frames - 1 for r in results if r.frames)),
        "peak_rss_mib": _rss_mib(),
        "kv_bytes": kv_bytes,
    }


def _run_engine(loaded, requests, max_rows, args, use_prefix=True, label="") -> tuple[dict, list]:
    longest = max(r.prompt.shape[1] + r.max_frames for r in requests)
    if args.max_tokens and args.max_tokens < longest:
        raise ValueError(f"--max-tokens {args.max_tokens} is below the longest row ({longest} columns); raise it")
    config = EngineConfig(
        max_rows=max_rows,
        max_tokens=args.max_tokens or longest,
        prefix_cache_entries=max(8, args.references),
        compile=args.compile,
        cuda_graphs=args.compile != "off" and loaded.device.type == "cuda",
        decode_buckets=args.decode_buckets,
        kernels=args.kernels,
    )
    engine = Engine(loaded, config)
    warm_up_s = engine.warm_up(requests[0].sampling)  # a compiled frame: every bucket's graph now, not timed
    if not use_prefix:
        requests = [replace(r, prefix_key=None, prefix_len=0) for r in requests]
    engine.generate(requests[:1])  # warm-up (allocator, kernels); not timed
    if use_prefix:  # start cold: the warm-up must not pre-fill the prefix cache
        engine.clear_prefix_cache()
    t0 = time.perf_counter()
    results = engine.generate(requests)
    wall = time.perf_counter() - t0
    mode = f"engine max_rows={max_rows}" + ("" if use_prefix or not args.references else " no-prefix-reuse") + label
    row = _row(mode, results, wall, engine.kv_bytes()["total"])
    row["prefix_hits"] = engine.prefixes.hits
    row["compiled"], row["warm_up_s"] = engine.runner.compiled, warm_up_s
    del engine
    return row, results


def _load_models(args, dtypes: list[str]) -> tuple[dict, dict]:
    """The model in each dtype (the same random weights in every one: same seed, cast) and the
    seconds each load took."""
    models, load_s = {}, {}
    for dtype in dtypes:
        t0 = time.perf_counter()
        if args.checkpoint:
            from .loader import load_model

            models[dtype] = load_model(args.checkpoint, device=args.device, dtype=dtype)
        else:
            from .tiny import random_model

            models[dtype] = random_model(
                args.size,
                seed=args.seed,
                device=args.device,
                dtype=dtype,
                max_seq_len=max(4096, 2 * (args.prompt_len + args.frames + args.reference_frames)),
            )
        load_s[dtype] = time.perf_counter() - t0
    return models, load_s


def _run_modes(models: dict, requests: list, modes: list, args, labelled: bool) -> tuple[list[dict], list]:
    """Every mode `repeats` times, interleaved (a slow spell of a shared machine hits all of
    them); each mode's row is its median run. Returns the rows and every run's results."""
    label = (lambda d: f" {d}") if labelled else (lambda d: "")
    repeats = max(1, args.repeats)
    runs: list[list[tuple[dict, list]]] = [[] for _ in modes]
    for _ in range(repeats):
        for i, (d, max_rows, use_prefix) in enumerate(modes):
            runs[i].append(_run_engine(models[d], requests, max_rows, args, use_prefix=use_prefix, label=label(d)))
    rows = []
    for (d, max_rows, _), mode_runs in zip(modes, runs):
        row = sorted((run[0] for run in mode_runs), key=lambda r: r["wall_s"])[(repeats - 1) // 2]
        row["wall_s_runs"] = [run[0]["wall_s"] for run in mode_runs]
        row["dtype"], row["max_rows"] = d, max_rows
        rows.append(row)
    return rows, runs


def _codes_same(dtypes: list[str], modes: list, runs: list) -> dict:
    """Per dtype: does every run of every mode produce that dtype's first mode's codes?"""
    same = {}
    for d in dtypes:
        mine = [mode_runs for (md, _, _), mode_runs in zip(modes, runs) if md == d]
        first = mine[0][0][1]
        same[d] = all(
            np.array_equal(a.codes, b.codes) for mode_runs in mine for run in mode_runs for a, b in zip(run[1], first)
        )
    return same


def _mode_row(rows: list[dict], dtype: str, max_rows: int) -> Optional[dict]:
    return next((r for r in rows if r["dtype"] == dtype and r["max_rows"] == max_rows), None)


def _dtype_ratios(rows: list[dict], dtypes: list[str], row_counts: list[int], figure: str) -> dict:
    """Per dtype after the first, per row count: how many times faster than the first dtype,
    by a rate (frames_per_s: higher is faster) or a time (anything else: lower is faster)."""

    def faster(d: str, m: int) -> float:
        mine, base = _mode_row(rows, d, m)[figure], _mode_row(rows, dtypes[0], m)[figure]
        return mine / base if figure == "frames_per_s" else base / mine

    return {d: {f"max_rows={m}": faster(d, m) for m in row_counts} for d in dtypes[1:]}


def _kernel_counts(loaded, requests: list, args) -> dict:
    """Kernels per decode step of the bench's batch (kernels/counting.py), on the eager path
    and on the fused one: the launches a step makes where it is not one graph."""
    from .kernels.counting import count_step_kernels

    counts = {}
    longest = max(r.prompt.shape[1] for r in requests) + 3
    for path in ("eager", "fused"):
        engine = Engine(
            loaded, EngineConfig(max_rows=args.max_rows, max_tokens=max(args.max_tokens, longest), kernels=path)
        )
        for request in requests[: args.max_rows]:
            engine.add(replace(request, max_frames=3, prefix_key=None, prefix_len=0))
        engine.step()  # prefill and the first frame
        counts[path] = count_step_kernels(engine)["kernels"]
        del engine
    return counts


def run_bench(args) -> int:
    if args.threads:
        torch.set_num_threads(args.threads)
    dtypes = [d for d in str(args.dtype).split(",") if d]
    models, load_s = _load_models(args, dtypes)
    loaded = models[dtypes[0]]
    requests = _workload(loaded, args)
    modes = []
    for d in dtypes:
        modes += [(d, args.max_rows, True)] + ([(d, args.max_rows, False)] if args.references else [])
        modes += [] if args.no_single else [(d, 1, True)]
    rows, runs = _run_modes(models, requests, modes, args, labelled=len(dtypes) > 1)

    batched = _mode_row(rows, dtypes[0], args.max_rows)
    single = None if args.no_single else _mode_row(rows, dtypes[0], 1)
    same = _codes_same(dtypes, modes, runs)
    row_counts = sorted({args.max_rows} | (set() if args.no_single else {1}))
    dtype_speedups = _dtype_ratios(rows, dtypes, row_counts, "frames_per_s")
    # the same ratio of decode steps alone (prefill left out): what the issue tables quote
    decode_speedups = _dtype_ratios(rows, dtypes, row_counts, "decode_step_ms")
    if args.uncached:
        t = time.perf_counter()
        results = [reference_generate(loaded, replace(r, prefix_key=None)) for r in requests]
        rows.append(_row("uncached reference", results, time.perf_counter() - t, 0))
    report = {
        "model": str(loaded.checkpoint_dir),
        "parameters": sum(p.numel() for p in loaded.model.parameters()),
        "dtype": ",".join(dtypes),
        "device": str(loaded.device),
        "threads": torch.get_num_threads(),
        "rows": args.rows,
        "max_rows": args.max_rows,
        "prompt_len": args.prompt_len,
        "frames": args.frames,
        "references": args.references,
        "repeats": max(1, args.repeats),
        "load_s": load_s[dtypes[0]],
        "compile": args.compile,
        "decode_buckets": args.decode_buckets,
        "malloc_tuned": tune_malloc(),
        "speedup_batched_vs_single": batched["frames_per_s"] / single["frames_per_s"] if single else None,
        "batched_codes_equal_single": same[dtypes[0]],
        "codes_equal_across_modes": same,
        "max_tokens": args.max_tokens or None,
        "kernels": args.kernels,
        "kernels_per_step": _kernel_counts(loaded, requests, args),
        "dtype_speedups": dtype_speedups,
        "dtype_decode_step_speedups": decode_speedups,
        "modes": rows,
    }
    _print_report(report, args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
        print(f"wrote {args.json}")
    return 0


def _print_report(report: dict, args) -> None:
    print(
        f"model {report['model']} ({report['parameters'] / 1e6:.1f}M params, {report['dtype']}, "
        f"{report['device']}, {report['threads']} threads), {args.rows} rows, prompt ~{args.prompt_len}, "
        f"frames ~{args.frames}, references {args.references}, median of {report['repeats']} run(s) per mode"
    )
    compiled = [r for r in report["modes"] if r.get("compiled")]
    if compiled:  # the frame built before the timed runs; with the compile cache cold, minutes on CPU
        print(
            f"decode frame compiled (--compile {args.compile}); warm-up before timing: "
            + ", ".join(f"{r['mode']} {r['warm_up_s']:.1f} s" for r in compiled)
        )
    header = f"{'mode':<44}{'frames/s':>10}{'rows/s':>9}{'x realtime':>11}{'TTFF p50 ms':>13}{'step ms':>9}{'peak RSS MiB':>14}{'KV MiB':>9}"
    print(header)
    print("-" * len(header))
    for r in report["modes"]:
        print(
            f"{r['mode']:<44}{r['frames_per_s']:>10.1f}{r['rows_per_s']:>9.2f}{r['x_realtime']:>11.2f}"
            f"{r['ttff_ms_p50']:>13.0f}{r['decode_step_ms']:>9.1f}{r['peak_rss_mib']:>14.0f}"
            f"{r['kv_bytes'] / 2**20:>9.1f}"
        )
    same, dtypes = report["codes_equal_across_modes"], report["dtype"].split(",")
    if report["speedup_batched_vs_single"] is not None:
        print(
            f"batched / one-row-at-a-time frames/s: {report['speedup_batched_vs_single']:.2f}x; "
            "codes identical across modes: " + ", ".join(f"{d} {v}" for d, v in same.items())
        )
    counts = report["kernels_per_step"]
    print("kernels per decode step (dispatcher count): " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    for d, ratios in report["dtype_speedups"].items():
        steps = report["dtype_decode_step_speedups"][d]
        print(
            f"{d} / {dtypes[0]} frames/s: "
            + ", ".join(f"{k} {v:.2f}x" for k, v in ratios.items())
            + "; decode steps alone: "
            + ", ".join(f"{k} {v:.2f}x" for k, v in steps.items())
        )
