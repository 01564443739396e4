"""The codec's decode on a GPU, measured: one command, JSON rewritten after every figure.

    python3 -m actors.codec gpu-bench --out DIR        # CUDA: real size, bf16, ~2 minutes
    python3 -m actors.codec gpu-bench --quick          # CPU: tiny codec, Triton's interpreter

Needs only python3, torch and numpy (the lent GPU image as it is; triton for the fused path).
It builds the real-size codec with random weights on the device (seconds) and measures:
  accuracy  each backend's audio against the float32 eager decode of the same codes
  grid      rows x seconds per backend (fused Triton, eager cuDNN, ...), graphed and not:
            audio seconds per second, and on the ungraphed runs the peak memory per sample
            against the bytes_per_sample the batch cap is computed from
  batch     decode_batch with its default, memory-sized cap (host copies included)
  overlap   decode_batch on the codec's stream beside an engine-like matmul loop on the
            default stream: both together against each alone
  floor     the decoder's convolution FLOPs per audio second over the card's measured bf16
            rate: the audio seconds per second no kernel can beat
Each figure is skipped, not half-measured, once the time budget (--budget-s) is spent. The
quick mode runs every step at toy sizes, so CI keeps the script from rotting.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from . import triton_conv
from .bench import bench_config, random_codes
from .config import CodecConfig
from .model import Codec
from .tiny import random_codec

# the H200's bf16 rate measured by the GPU check (an 8192-cube product), used where none is measured
H200_BF16_TFLOPS = 673.0


@dataclass
class GpuBenchOptions:
    device: str = "cuda"
    size: str = "real"
    dtype: str = "bfloat16"
    rows: tuple[int, ...] = (1, 4, 16, 64)
    seconds: tuple[float, ...] = (2.0, 10.0)
    backends: tuple[str, ...] = ("triton", "eager")
    graphs: tuple[bool, ...] = (True, False)
    budget_s: float = 150.0
    min_timed_s: float = 0.3  # each figure repeats its call until this long (min_calls at least)
    min_calls: int = 3
    warm_calls: int = 2  # before timing: a shape's first call runs eagerly, its second is captured
    overlap: bool = True
    seed: int = 0
    out: Optional[Path] = None

    @classmethod
    def quick(cls, out: Optional[Path] = None) -> GpuBenchOptions:
        """Every step at toy sizes on the CPU, float32 (the interpreter runs the fused path)."""
        return cls(device="cpu", size="tiny", dtype="float32", rows=(2,), seconds=(0.1,), graphs=(False,),
                   min_timed_s=0.0, min_calls=1, warm_calls=0, overlap=False, out=out)  # fmt: skip


@dataclass
class _Run:
    options: GpuBenchOptions
    log: Callable[[str], None]
    on_put: Optional[Callable[[str, object], None]] = None
    began: float = field(default_factory=time.perf_counter)
    result: dict = field(default_factory=dict)

    def left_s(self) -> float:
        return self.options.budget_s - (time.perf_counter() - self.began)

    def put(self, key: str, value) -> None:
        self.result[key] = value
        if self.on_put is not None:
            self.on_put(key, value)
        if self.options.out is not None:
            path = self.options.out / "codec_gpu_bench.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(self.result, indent=2, default=str) + "\n")
            tmp.replace(path)

    def sync(self) -> None:
        if self.options.device.startswith("cuda"):
            torch.cuda.synchronize()


def decoder_conv_flops(config: CodecConfig) -> float:
    """FLOPs (2 x multiply-adds) of the decoder's convolutions per second of audio."""
    rate = config.sample_rate / math.prod(config.decoder_rates)  # model.0's frames per second
    width = config.decoder_dim
    macs = rate * config.latent_width * width * 7
    for stride in config.decoder_rates:
        macs += rate * width * (width // 2) * 2 * stride  # the transposed conv, per input frame
        rate, width = rate * stride, width // 2
        macs += 3 * rate * width * width * (7 + 1)  # three residual units: 7-tap and 1-tap convs
    return 2 * (macs + config.sample_rate * width * 7)


def run_gpu_bench(
    options: GpuBenchOptions,
    log: Callable[[str], None] = print,
    on_put: Optional[Callable[[str, object], None]] = None,
) -> dict:
    """Every figure above; each is also handed to `on_put(key, value)` (and rewritten into
    out/codec_gpu_bench.json) as soon as it is measured."""
    run = _Run(options, log, on_put)
    if options.device == "cpu" and triton_conv.installed():
        os.environ.setdefault("TRITON_INTERPRET", "1")  # read at the kernel's first use
    device = torch.device(options.device)
    dtype = getattr(torch, options.dtype)
    config = bench_config(options.size)
    backends = [b for b in options.backends if not b.startswith("triton") or triton_conv.available(device)]
    run.put("meta", _meta(options, config, backends))
    began = time.perf_counter()
    codec = random_codec(config, seed=options.seed, device=device, dtype=dtype)
    run.sync()
    run.put("build_s", round(time.perf_counter() - began, 2))
    _floor(run, config)
    _accuracy(run, codec, config, backends)
    _grid(run, codec, backends)
    _batch(run, codec, backends[0])
    if options.overlap and device.type == "cuda":
        _overlap(run, codec)
    run.put("total_s", round(time.perf_counter() - run.began, 1))
    return run.result


def _meta(options: GpuBenchOptions, config: CodecConfig, backends: list[str]) -> dict:
    meta = {"options": asdict(options), "torch": torch.__version__, "backends_run": backends}
    meta["triton"] = _triton_version()
    if options.device.startswith("cuda"):
        meta["device_name"] = torch.cuda.get_device_name()
        meta["memory_gib"] = round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)
    meta["conv_gflop_per_audio_s"] = round(decoder_conv_flops(config) / 1e9, 2)
    return meta


def _triton_version() -> Optional[str]:
    if not triton_conv.installed():
        return None
    import triton

    return triton.__version__


def _floor(run: _Run, config: CodecConfig) -> None:
    """The card's bf16 rate (an 8192-cube product) and the audio seconds per second it caps."""
    tflops = H200_BF16_TFLOPS
    if run.options.device.startswith("cuda"):
        a = torch.randn(8192, 8192, device=run.options.device, dtype=torch.bfloat16)
        a @ a
        run.sync()
        began = time.perf_counter()
        for _ in range(5):
            a @ a
        run.sync()
        tflops = 5 * 2 * 8192**3 / (time.perf_counter() - began) / 1e12
        del a
    flops = decoder_conv_flops(config)
    run.put("floor", {"bf16_tflops": round(tflops, 1), "audio_s_per_s": round(tflops * 1e12 / flops, 1)})


def _accuracy(run: _Run, codec: Codec, config: CodecConfig, backends: list[str]) -> None:
    """Each backend's audio against the float32 eager decode (the reference's own layers)."""
    device = torch.device(run.options.device)
    reference = random_codec(config, seed=run.options.seed, device=device, dtype=torch.float32)
    reference.configure_decode("eager", graphs=False)
    frames = _frames(codec, 1.5, run.options.device == "cpu") if run.options.size == "real" else 3
    codes = random_codes(codec, 2, frames, seed=5).to(device)
    expected = reference.decode(codes).float()
    del reference
    figures = {"rows": 2, "frames": frames, "reference_std": float(expected.std())}
    for backend in backends:
        codec.configure_decode(backend, graphs=False)
        got = codec.decode(codes).float()
        error = (got - expected).abs()
        figures[backend] = {"max_abs": float(error.max()), "mean_abs": float(error.mean())}
        run.log(f"accuracy {backend} ({codec.dtype}) vs float32 eager: max |diff| {float(error.max()):.3g}")
    run.put("accuracy", figures)


def _grid(run: _Run, codec: Codec, backends: list[str]) -> None:
    figures: list[dict] = []
    for backend in backends:
        for graphs in run.options.graphs:
            if graphs and run.options.device == "cpu":
                continue
            began = time.perf_counter()
            path = codec.configure_decode(backend, graphs=graphs)
            warm_s = path.warm_up() if run.options.warm_calls else 0.0
            for rows in run.options.rows:
                for seconds in run.options.seconds:
                    point = {"backend": backend, "graphs": graphs, "rows": rows, "seconds": seconds}
                    if run.left_s() < 5:
                        figures.append(point | {"skipped": "time budget spent"})
                        continue
                    figures.append(point | _point(run, codec, rows, seconds))
                    run.log(_describe(figures[-1]))
                    run.put("grid", figures)
            figures.append({"backend": backend, "graphs": graphs, "warm_up_s": round(warm_s, 2),
                            "setup_and_grid_s": round(time.perf_counter() - began, 1), "path": path.describe()})  # fmt: skip
            run.put("grid", figures)


def _frames(codec: Codec, seconds: float, quick: bool) -> int:
    """Frames for `seconds` of audio, in the actor's buckets of 16 on a GPU (every kernel then
    has the one specialisation warm_up compiled)."""
    frames = seconds * codec.sample_rate / codec.frame_length
    return max(1, round(frames)) if quick else 16 * max(1, round(frames / 16))


def _point(run: _Run, codec: Codec, rows: int, seconds: float) -> dict:
    frames = _frames(codec, seconds, run.options.device == "cpu")
    codes = random_codes(codec, rows, frames, seed=rows).to(codec.device)
    audio_s = rows * frames * codec.frame_length / codec.sample_rate
    # the first call eager (a graph's warm-up), the second captured: kept, to hold the replays to it
    first = [codec.decode(codes) for _ in range(run.options.warm_calls)][:1]
    run.sync()
    cuda = run.options.device.startswith("cuda")
    if cuda:
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    walls: list[float] = []
    while len(walls) < run.options.min_calls or (sum(walls) < run.options.min_timed_s and len(walls) < 20):
        began = time.perf_counter()
        last = codec.decode(codes)
        run.sync()
        walls.append(time.perf_counter() - began)
    figures = {"frames": frames, "audio_s": round(audio_s, 3), "calls": len(walls),
               "median_s": statistics.median(walls), "audio_s_per_s": round(audio_s / statistics.median(walls), 3)}  # fmt: skip
    if first:  # a replayed graph runs the eager call's kernels: the same audio
        figures["timed_vs_first_call_max_abs"] = float((last.float() - first[0].float()).abs().max())
    samples = rows * frames * codec.frame_length
    figures["bytes_per_sample_computed"] = round(codec.device_decode.bytes_per_sample, 1)
    if cuda and codec.device_decode.graphs is None:  # a replay allocates nothing: peaks mean something eager only
        figures["bytes_per_sample_measured"] = round((torch.cuda.max_memory_allocated() - base) / samples, 1)
    return figures


def _describe(point: dict) -> str:
    if "skipped" in point:
        return f"{point['backend']} graphs={point['graphs']} rows={point['rows']}: skipped"
    measured = point.get("bytes_per_sample_measured", "-")
    return (f"{point['backend']:<16} graphs={point['graphs']!s:<5} rows {point['rows']:>3} x {point['seconds']:>5} s: "
            f"{point['audio_s_per_s']:>8} audio s/s (bytes/sample {measured} measured, "
            f"{point['bytes_per_sample_computed']} computed)")  # fmt: skip


def _batch_codes(codec: Codec, count: int) -> list[np.ndarray]:
    """Rows of 2-12 s (a job's spread of lengths), frames in buckets of 16 as the actor pads them."""
    generator = np.random.default_rng(11)
    rows = []
    for _ in range(count):
        frames = 16 * max(1, round(generator.uniform(2, 12) * codec.sample_rate / codec.frame_length / 16))
        rows.append(np.stack([generator.integers(0, size, frames) for size in codec.codebook_sizes]))
    return rows


def _batch(run: _Run, codec: Codec, backend: str) -> None:
    """decode_batch at its default cap: what the pipeline calls (host copies included)."""
    if run.left_s() < 10:
        run.put("decode_batch", {"skipped": "time budget spent"})
        return
    quick = run.options.device == "cpu"
    path = codec.configure_decode(backend, graphs=not quick)
    rows = _batch_codes(codec, 2 if quick else 64)
    if quick:
        rows = [r[:, :2] for r in rows]
    cap = codec.max_batch_samples()
    for _ in range(run.options.warm_calls):  # shapes seen once run eagerly, twice captured
        codec.decode_batch(rows, max_batch_rows=len(rows))
    began = time.perf_counter()
    waves = codec.decode_batch(rows, max_batch_rows=len(rows))
    wall = time.perf_counter() - began
    audio_s = sum(len(w) for w in waves) / codec.sample_rate
    figures = {"backend": backend, "rows": len(rows), "audio_s": round(audio_s, 1), "wall_s": round(wall, 3),
               "audio_s_per_s": round(audio_s / wall, 3), "max_batch_samples": cap,
               "cap_audio_s": round(cap / codec.sample_rate, 1), "path": path.describe()}  # fmt: skip
    run.log(f"decode_batch ({backend}, cap {figures['cap_audio_s']} audio s): {figures['audio_s_per_s']} audio s/s")
    run.put("decode_batch", figures)


def _overlap(run: _Run, codec: Codec) -> None:
    """Engine-like work (256-row bf16 products with 4096-wide weights, as a decode step's) on the
    default stream, decode_batch on the codec's stream: together against one after the other."""
    if run.left_s() < 15:
        run.put("overlap", {"skipped": "time budget spent"})
        return
    import threading

    weight = torch.randn(4096, 4096, device=codec.device, dtype=torch.bfloat16)
    x = torch.randn(256, 4096, device=codec.device, dtype=torch.bfloat16)

    def engine() -> None:
        for _ in range(3000):
            x @ weight
        torch.cuda.current_stream().synchronize()

    rows = _batch_codes(codec, 32)
    codec.decode_batch(rows, max_batch_rows=len(rows))
    timed = {}
    for name, work in {"engine": engine, "codec": lambda: codec.decode_batch(rows, max_batch_rows=len(rows))}.items():
        work()
        began = time.perf_counter()
        work()
        timed[name] = time.perf_counter() - began
    thread = threading.Thread(target=engine)
    began = time.perf_counter()
    thread.start()
    codec.decode_batch(rows, max_batch_rows=len(rows))
    thread.join()
    together = time.perf_counter() - began
    serial = timed["engine"] + timed["codec"]
    run.put("overlap", {"engine_s": round(timed["engine"], 3), "codec_s": round(timed["codec"], 3),
                        "together_s": round(together, 3), "serial_over_together": round(serial / together, 2)})  # fmt: skip
    run.log(f"overlap: engine {timed['engine']:.2f} s + codec {timed['codec']:.2f} s alone, {together:.2f} s together")
