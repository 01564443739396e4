"""One model's step of scripts/gpu_job.py, in its child process: the checkpoint written, the actor
loaded without Ray or Hydra, the rows end to end and through the engine alone, the parts read
back; every figure into the step's JSON as it comes (gpu_job.py's Sink)."""

from __future__ import annotations

import io
import json
import logging
import math
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

# rows per block: cluster=gpu's, and the quick mode's
BLOCK_ROWS = {False: 64, True: 8}
# the quick mode's engine, over engine=gpu's preset: sizes a 2-core CPU runs in seconds; the
# listen pool on (on a CPU its default is none), so CI runs the GPU's path
QUICK_ENGINE = {"max_rows": 8, "max_tokens": 512, "prefill_chunk": 256, "listen_processes": 2}
# the frame budgets (model.budget): random weights babble to their budget, so each segment is
# given read speech's length (2.15 frames a UTF-8 byte: actors/synth/budget.py) and kept when
# it fills it (on_cut=accept; a real checkpoint's default would regenerate it up to the
# ceiling); the quick mode's are the demo's short ones
BUDGET = {False: {"frames_per_byte": 2.15, "on_cut": "accept"},
          True: {"max_frames": 48, "frames_per_byte": 0.5, "min_frames": 8, "on_cut": "accept"}}  # fmt: skip
GiB = 1 << 30


def run_model(sink, args) -> None:
    import pyarrow.parquet as pq

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    work, size = Path(args.work), args.run_step
    began = time.perf_counter()
    checkpoint = write_checkpoint(work / f"model-{size}", size, args.quick)
    sink.put("write_s", round(time.perf_counter() - began, 2))
    codec = json.loads((work / "step-codec.json").read_text())["path"]
    began = time.perf_counter()
    actor = build_actor(size, checkpoint, codec, args.device, args.quick, str(work))
    sink.put("load_s", round(time.perf_counter() - began, 2))
    sink.put("device", str(actor.lm.device))
    sink.put("slots", actor.engine.config.max_rows)
    sink.put("memory_plan", actor.memory_plan.describe() if actor.memory_plan is not None else None)
    pool = actor.finisher.pool
    sink.put("listen_processes", pool.processes if pool is not None else 0)
    table, rows = pq.read_table(work / "rows.parquet"), BLOCK_ROWS[args.quick]
    began = time.perf_counter()
    actor(table.slice(0, rows))  # warm-up: the codec's shapes, the first prompts' buckets
    sink.put("warm_up_s", round(time.perf_counter() - began, 2))
    parts = work / f"parts-{size}"
    parts.mkdir(exist_ok=True)
    sink.put("end_to_end", end_to_end(actor, table, rows, parts))
    sink.put("engine_alone", engine_alone(actor, table, rows))
    run, alone = sink.data["end_to_end"], sink.data["engine_alone"]
    sink.put("vs_engine_alone", round(run["audio_s_per_s"] / alone["audio_s_per_s"], 4))
    back = read_back(parts, actor.codec.frame_length, actor.codec.sample_rate)
    sink.put("read_back", back)
    sink.put("ok", back["ok"] and run["rows"].get("error", 0) == 0)


def write_checkpoint(folder: Path, size: str, quick: bool) -> Path:
    """The model of `size`'s shape and format with random weights (bf16 safetensors and its
    tokenizer, actors/engine/tiny.py); with `quick` the tiny shape in that format."""
    from actors.engine.tiny import FAMILY_S1, SIZE_FORMATS, make_tiny

    fmt = SIZE_FORMATS.get(size, FAMILY_S1)
    return make_tiny(folder, fmt=fmt, seed=0, max_seq_len=2048 if quick else 4096, size="tiny" if quick else size)


def build_actor(size: str, checkpoint: Path, codec: str, device: str, quick: bool, input_dir: str):
    """The actor as a Ray Data stage gets it, without Ray or Hydra: its settings dataclasses,
    engine=gpu's preset (actors/synth/presets.py), the quick mode's sizes over it."""
    from actors.synth import SynthActor
    from actors.synth.budget import FrameBudget
    from actors.synth.presets import engine_settings
    from actors.synth.settings import ActorSettings, ModelSettings, RunContext

    model = ModelSettings(
        name=f"random-{size}",
        checkpoint=str(checkpoint),
        codec=codec,
        device=device,
        budget=FrameBudget(**BUDGET[quick]),
    )
    settings = ActorSettings(
        model=model,
        engine=engine_settings("gpu", **(QUICK_ENGINE if quick else {})),
        run=RunContext(run_id="gpu-job", input_dir=input_dir, threads=1 if device == "cpu" else None),
    )
    return SynthActor(settings)


class DeviceSampler:
    """While a pass runs: the GPU's busy share (NVML's utilization, the share of each sample
    period a kernel ran, averaged) and the most memory in use on it; torch's peaks. Empty on a CPU."""

    def __init__(self, device, every_s: float = 0.05):
        import torch

        self.torch, self.device, self.every_s = torch, device, every_s
        self.cuda = device.type == "cuda"
        self.busy: list[float] = []
        self.used_peak = 0
        self._stop = threading.Event()

    def __enter__(self) -> DeviceSampler:
        if self.cuda:
            self.torch.cuda.reset_peak_memory_stats(self.device)
            threading.Thread(target=self._sample, daemon=True).start()
        return self

    def _sample(self) -> None:
        cuda = self.torch.cuda
        while not self._stop.wait(self.every_s):
            free, total = cuda.mem_get_info(self.device)
            self.used_peak = max(self.used_peak, total - free)
            try:
                self.busy.append(cuda.utilization(self.device) / 100.0)
            except Exception:  # no NVML (pynvml) here: the busy share stays unknown
                pass

    def __exit__(self, *exc) -> None:
        self._stop.set()

    def figures(self) -> dict:
        if not self.cuda:
            return {"gpu_busy": None}
        cuda = self.torch.cuda
        return {
            "gpu_busy": round(sum(self.busy) / len(self.busy), 4) if self.busy else None,
            "peak_allocated_gib": round(cuda.max_memory_allocated(self.device) / GiB, 3),
            "peak_reserved_gib": round(cuda.max_memory_reserved(self.device) / GiB, 3),
            "peak_device_used_gib": round(self.used_peak / GiB, 3),
        }


def end_to_end(actor, table, block_rows: int, parts: Path) -> dict:
    """The rows through the actor as Ray Data drives it (blocks of `block_rows`, enough at once to
    keep the slots full: pipeline/run/actor_settings.py concurrent_blocks' rule), each block's
    output written as a Parquet part as it returns."""
    import pyarrow.parquet as pq

    from actors.files import atomic_open

    engine = actor.settings.engine
    at_once = math.ceil((actor.engine.config.max_rows + engine.feed_queue_rows) / block_rows) + 2
    blocks = [table.slice(start, block_rows) for start in range(0, table.num_rows, block_rows)]
    pool = actor.finisher.pool
    pool_before = pool.busy_seconds if pool is not None else 0.0
    outputs = []
    with DeviceSampler(actor.lm.device) as sampler, ThreadPoolExecutor(at_once) as calls:
        began = time.perf_counter()
        futures = {calls.submit(actor, block): index for index, block in enumerate(blocks)}
        for future in as_completed(futures):
            out = future.result()
            with atomic_open(parts / f"part-{futures[future]:05d}.parquet") as f:
                pq.write_table(out, f)
            outputs.append(out)
        seconds = time.perf_counter() - began
    figures = output_figures(outputs, seconds)
    audio_s = max(figures["audio_s"], 1e-9)
    if pool is not None:  # the listen pool's processes: the checks' CPU and FLAC's time
        figures["host_s_per_audio_s"] = round((pool.busy_seconds - pool_before) / audio_s, 6)
    return {**figures, "blocks": len(blocks), "blocks_at_once": at_once, **sampler.figures()}


def output_figures(outputs: list, seconds: float) -> dict:
    """What the output rows say: rows by status, frames, audio seconds and their rate, the
    codec's decode and the host's listening (checks + FLAC + the row) per audio second."""
    import pyarrow as pa

    from actors import schema as S

    table = pa.concat_tables(outputs)
    rows = {}
    for status in table.column(S.STATUS).to_pylist():
        rows[status] = rows.get(status, 0) + 1
    audio_s = sum(v or 0.0 for v in table.column(S.AUDIO_SECONDS).to_pylist())
    batches = {b[S.BATCH_ID]: b for b in table.column(S.BATCH).to_pylist() if b}
    decode_s = sum(b[S.BATCH_CODEC_MS] or 0.0 for b in batches.values()) / 1000.0
    host_s = sum((b[S.BATCH_ENCODE_MS] or 0.0) + (b[S.BATCH_CHECKS_MS] or 0.0) for b in batches.values()) / 1000.0
    total_ms = sorted(v for v in table.column(S.TOTAL_MS).to_pylist() if v is not None)
    return {
        "rows": rows,
        "frames": sum(v or 0 for v in table.column(S.N_FRAMES).to_pylist()),
        "audio_s": round(audio_s, 2),
        "seconds": round(seconds, 3),
        "audio_s_per_s": round(audio_s / seconds, 3),
        "decode_s_per_audio_s": round(decode_s / max(audio_s, 1e-9), 6),
        "host_s_per_audio_s": round(host_s / max(audio_s, 1e-9), 6),
        "row_ms_p50": total_ms[len(total_ms) // 2] if total_ms else None,
    }


def engine_alone(actor, table, block_rows: int) -> dict:
    """The same rows through the engine alone (SynthActor.engine_only: no codec, no checks, no
    output), in audio seconds per second."""
    with DeviceSampler(actor.lm.device) as sampler:
        alone = actor.engine_only(table, block_rows=block_rows)
    audio_s = alone["frames"] * actor.codec.frame_length / actor.codec.sample_rate
    return {
        "rows": alone["rows"],
        "frames": alone["frames"],
        "audio_s": round(audio_s, 2),
        "seconds": round(alone["seconds"], 3),
        "audio_s_per_s": round(audio_s / alone["seconds"], 3),
        "steps": alone["steps"],
        **sampler.figures(),
    }


def read_back(parts: Path, frame_length: int, sample_rate: int) -> dict:
    """Every part read back with the output schema, and every ok row's FLAC decoded: its sample
    rate and length (n_frames x frame_length) as the row says."""
    import pyarrow.parquet as pq
    import soundfile

    from actors import schema as S

    files, rows, flac, problems = 0, 0, 0, []
    for part in sorted(parts.glob("part-*.parquet")):
        table = pq.read_table(part)
        files += 1
        if table.schema.remove_metadata() != S.OUTPUT_SCHEMA.remove_metadata():
            problems.append(f"{part.name}: not the output schema")
        for row in table.to_pylist():
            rows += 1
            if row[S.STATUS] != S.STATUS_OK:
                continue
            wave, rate = soundfile.read(io.BytesIO(row[S.AUDIO][S.AUDIO_BYTES]), dtype="float32")
            if rate != sample_rate or len(wave) != row[S.N_FRAMES] * frame_length:
                problems.append(f"{row[S.ID]}: {len(wave)} samples at {rate} Hz, {row[S.N_FRAMES]} frames")
            flac += 1
    return {"parts": files, "rows": rows, "flac_read": flac, "problems": problems[:10],
            "ok": files > 0 and flac > 0 and not problems}  # fmt: skip
