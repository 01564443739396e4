"""Codec throughput on this machine: seconds of audio per wall-clock second.

Decode at batch 1 and batch 16, encode at batch 1, on random weights (tiny
or real size, built in memory) and random in-range codes / a synthetic clip.
"""

from __future__ import annotations

import math
import os
import resource
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Optional

import numpy as np
import torch

from ..precision import choose_dtype
from .config import CodecConfig
from .model import Codec
from .tiny import random_codec


@dataclass
class BenchRow:
    operation: str
    batch: int
    audio_seconds: float  # audio per call, all rows together
    best_wall_s: float
    median_wall_s: float
    repeats: int

    @property
    def best_speed(self) -> float:
        return self.audio_seconds / self.best_wall_s

    @property
    def median_speed(self) -> float:
        return self.audio_seconds / self.median_wall_s


def peak_rss_gib() -> float:
    # ru_maxrss is in KiB on Linux.
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def bench_config(size: str) -> CodecConfig:
    if size == "tiny":
        return CodecConfig.tiny(semantic_codebook_size=128, codebook_size=128)
    if size == "real":
        return CodecConfig.real()
    raise ValueError(f"unknown size {size!r}; use 'tiny' or 'real'")


def _time_calls(call: Callable[[], object], repeats: int) -> list[float]:
    walls = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        walls.append(time.perf_counter() - start)
    return walls


def random_codes(codec: Codec, batch: int, frames: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    rows = [torch.randint(0, size, (batch, 1, frames), generator=generator) for size in codec.codebook_sizes]
    return torch.cat(rows, dim=1)


def synthetic_clip(samples: int, sample_rate: int, seed: int) -> np.ndarray:
    t = np.arange(samples) / sample_rate
    noise = np.random.default_rng(seed).standard_normal(samples)
    wave = 0.3 * np.sin(2 * np.pi * 220 * t) + 0.1 * np.sin(2 * np.pi * 1375.5 * t) + 0.05 * noise
    return wave.astype(np.float32)


def run_bench(
    size: str = "tiny",
    seconds: float = 5.0,
    repeats: int = 3,
    big_batch: int = 16,
    big_batch_repeats: int = 1,
    threads: Optional[int] = None,
    dtype: torch.dtype | str = torch.float32,
    log: Callable[[str], None] = print,
    device: str = "cpu",
) -> dict:
    """One dtype's table, or with a comma list of dtypes (`"float32,bfloat16"`) each dtype's
    table from rounds that interleave the dtypes (a slow spell of a shared machine hits all
    of them), plus each later dtype's median speed over the first's."""
    if threads:
        torch.set_num_threads(threads)
    names = [d for d in dtype.split(",") if d] if isinstance(dtype, str) else [dtype]
    where = torch.device(device)
    benches = [_DtypeBench(size, choose_dtype(d, where).dtype, seconds, big_batch, log, where) for d in names]
    for _ in range(max(repeats, big_batch_repeats)):
        for bench in benches:
            bench.round(repeats, big_batch_repeats)
    results = [bench.result(size, seconds) for bench in benches]
    if len(results) == 1:
        return results[0]
    first = {(r["operation"], r["batch"]): r["median_speed"] for r in results[0]["rows"]}
    speedups = {
        r["dtype"]: {f"{row['operation']}_b{row['batch']}": row["median_speed"] / first[(row["operation"], row["batch"])]
                     for row in r["rows"]}
        for r in results[1:]
    }  # fmt: skip
    return {"dtypes": [r["dtype"] for r in results], "results": results, "speedups": speedups}


class _DtypeBench:
    """One dtype's codec, inputs and timings; `round` times each operation once more."""

    def __init__(self, size: str, dtype: torch.dtype, seconds: float, big_batch: int, log, device: torch.device):
        self.dtype, self.log, self.device = dtype, log, device
        build_start = time.perf_counter()
        self.codec = codec = random_codec(bench_config(size), seed=0, device=device, dtype=dtype)
        self.build_s = time.perf_counter() - build_start
        log(
            f"built {size} codec ({dtype}) with random weights in {self.build_s:.1f} s (peak RSS {peak_rss_gib():.2f} GiB)"
        )
        self.frames = math.ceil(seconds * codec.sample_rate / codec.frame_length)
        self.clip_seconds = self.frames * codec.frame_length / codec.sample_rate
        self.rss: dict[str, float] = {"after_build": peak_rss_gib()}
        codes_one = random_codes(codec, 1, self.frames, seed=1)
        codes_many = random_codes(codec, big_batch, self.frames, seed=2)
        clip = torch.from_numpy(synthetic_clip(self.frames * codec.frame_length, codec.sample_rate, 3))
        clip = clip.view(1, 1, -1).to(device, dtype)
        codes_one, codes_many = codes_one.to(device), codes_many.to(device)
        # warm-ups (allocator, oneDNN kernel selection), untimed
        codec.decode(codes_one)
        codec.decode(codes_many[:, :, :2])
        codec.encode(clip)
        self.calls = [
            ("decode", 1, self._synced(lambda: codec.decode(codes_one)), False),
            ("decode", big_batch, self._synced(lambda: codec.decode(codes_many)), True),
            ("encode", 1, self._synced(lambda: codec.encode(clip)), False),
        ]
        self.walls: dict[tuple[str, int], list[float]] = {(op, b): [] for op, b, _, _ in self.calls}

    def _synced(self, call: Callable[[], object]) -> Callable[[], None]:
        """The call, finished on the device before the clock stops."""

        def run() -> None:
            call()
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)

        return run

    def round(self, repeats: int, big_batch_repeats: int) -> None:
        for operation, batch, call, big in self.calls:
            walls = self.walls[(operation, batch)]
            if len(walls) < (big_batch_repeats if big else repeats):
                walls += _time_calls(call, 1)
                self.rss[f"{operation}_b{batch}"] = peak_rss_gib()

    def result(self, size: str, seconds: float) -> dict:
        rows = []
        for (operation, batch), walls in self.walls.items():
            row = BenchRow(
                operation, batch, self.clip_seconds * batch, min(walls), statistics.median(walls), len(walls)
            )
            rows.append(row)
            self.log(
                f"  {self.dtype} {operation} batch {batch}: best {row.best_wall_s:.3f} s "
                f"({row.best_speed:.3f} s audio / s), median {row.median_wall_s:.3f} s"
            )
        return {
            "size": size,
            "device": str(self.device),
            "dtype": str(self.dtype).replace("torch.", ""),
            "threads": torch.get_num_threads(),
            "clip_seconds": self.clip_seconds,
            "frames": self.frames,
            "build_seconds": self.build_s,
            "load_average": _load_average(),
            "rows": [asdict(r) | {"best_speed": r.best_speed, "median_speed": r.median_speed} for r in rows],
            "peak_rss_gib": self.rss,
            "torch": torch.__version__,
        }


def format_table(result: dict) -> str:
    if "results" in result:
        tables = [format_table(r) for r in result["results"]]
        ratios = [
            f"{d} / {result['dtypes'][0]} audio s per s (median): " + ", ".join(f"{k} {v:.2f}x" for k, v in r.items())
            for d, r in result["speedups"].items()
        ]
        return "\n".join(tables + ratios)
    lines = [
        f"codec bench: size={result['size']} dtype={result['dtype']} threads={result['threads']} "
        f"clip={result['clip_seconds']:.2f} s ({result['frames']} frames) "
        f"load average={result['load_average']}",
        f"{'operation':<10}{'batch':>6}{'audio s':>10}{'best wall s':>13}{'median wall s':>15}"
        f"{'audio s / s (best)':>20}{'(median)':>10}",
    ]
    for row in result["rows"]:
        lines.append(
            f"{row['operation']:<10}{row['batch']:>6}{row['audio_seconds']:>10.2f}"
            f"{row['best_wall_s']:>13.3f}{row['median_wall_s']:>15.3f}"
            f"{row['best_speed']:>20.3f}{row['median_speed']:>10.3f}"
        )
    lines.append("peak RSS (GiB): " + ", ".join(f"{k} {v:.2f}" for k, v in result["peak_rss_gib"].items()))
    return "\n".join(lines)


def _load_average() -> str:
    try:
        return " ".join(f"{v:.2f}" for v in os.getloadavg())
    except OSError:
        return "n/a"
