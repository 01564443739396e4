#!/usr/bin/env python3
"""The job on a GPU, end to end, in one command of about 5 minutes (H200): rows in, the engine, the
codec, the checks, FLAC and Parquet parts out, and the figures that say whether the codec and the
host keep up with the engine.

    bash scripts/gpu_job.sh [--out DIR] [--work DIR] [--deadline-s 420] [--models s1-mini,s2-pro] [--rows 1536]
    bash scripts/gpu_job.sh --device cpu --quick        # CI: tiny models, the same path on the CPU

It runs on the lent GPU image as it is (python3 with torch 2.11 + CUDA, numpy, pyarrow,
safetensors, tokenizers, tiktoken; no Ray, no Hydra): the actor is built from its settings
dataclasses (engine=gpu's preset, actors/synth/presets.py) and called with Arrow tables, blocks
several at once, as Ray Data calls it. FLAC needs soundfile and reference clips soxr, which the
image lacks: scripts/gpu_job.sh installs the wheels it finds in .whl/ first (it says how to
fetch them).

Steps, each in a process of its own under its own time limit within the run's deadline (a step
that hangs or crashes costs its own figures only); DIR/gpu_job.json is rewritten after every
figure, DIR/gpu_job.log holds every step's output. Exit status 1 when a step failed.
  rows      the input: pipeline.bench's generated sentences (the demo's words), a share with the
            demo's reference clips, a share long (generated in segments)
  codec     the codec with random weights (real size; tiny with --quick), written once;
            --codec-writer MODULE:FUNCTION writes it instead (FUNCTION(out_dir) -> its path)
  s1-mini   S1-mini's shape with random weights, written here; the actor loaded (its memory plan
            checked before loading, and what loading measured), one warm-up block; the rows end to
            end, each block's output written as a Parquet part as it returns; the same rows through
            the engine alone (SynthActor.engine_only); the parts read back, every ok row's FLAC
  s2-pro    the same for S2-Pro's shape
Figures per model: seconds of audio per second end to end and of the engine alone, and their
ratio (the target on an H200: >= 0.85); the GPU's busy share (NVML, sampled); the codec's
decode and the host's listening (checks + FLAC, on the listen pool) seconds per second of
audio; peak memory (torch's allocated and reserved, the device's used); rows by status.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
from gpu_check import Sink, run_steps, step_parser  # noqa: E402  (the GPU check's step runner, shared)
from gpu_check import _run as run_killable  # noqa: E402

MODELS = ("s1-mini", "s2-pro")
# each step's time limit (seconds) on CUDA and with --quick
# (expected on an H200 with 16 host cores: rows 2 s, codec ~10 s, S1-mini ~100 s, S2-Pro ~150 s)
CAPS = {"rows": (30, 60), "codec": (90, 60), "s1-mini": (180, 240), "s2-pro": (240, 0)}
# the workload (pipeline/bench/workload.py): mean words per sentence, shares with a clip and long
WORKLOAD = {"text_words": 8.0, "reference_fraction": 0.3, "long_fraction": 0.02, "seed": 0}
LONG_CHARS = (600, 200)  # a long row's characters on CUDA and with --quick


# ---- the steps (each runs in a child process: `--run-step NAME`) --------------------------
def step_rows(sink: Sink, args) -> None:
    from pipeline.bench.workload import make_workload

    path = Path(args.work) / "rows.parquet"
    rows = args.rows or (16 if args.quick else 1536)
    make_workload(path, rows, long_chars=LONG_CHARS[args.quick], **WORKLOAD)
    sink.put("rows", rows)
    sink.put("path", str(path))


def write_random_codec(out_dir: Path, quick: bool) -> Path:
    """The codec with random weights in the upstream layout (codec.pth + config.json): real
    size, or the demo's tiny one (10 codebooks of 128, as the tiny model's) with --quick."""
    from actors.codec import hydra_tree
    from actors.codec.config import CONFIG_FILE_NAME, CodecConfig
    from actors.codec.loader import CHECKPOINT_FILE_NAME
    from actors.codec.tiny import make_tiny, random_state_dict

    if quick:
        return make_tiny(out_dir, seed=0, semantic_codebook_size=128, codebook_size=128)
    import torch

    out_dir.mkdir(parents=True, exist_ok=True)
    config = CodecConfig.real()
    torch.save(random_state_dict(config, seed=0), out_dir / CHECKPOINT_FILE_NAME)
    (out_dir / CONFIG_FILE_NAME).write_text(json.dumps(hydra_tree.to_tree(config), indent=2) + "\n")
    return out_dir / CHECKPOINT_FILE_NAME


def step_codec(sink: Sink, args) -> None:
    out = Path(args.work) / "codec"
    began = time.perf_counter()
    if args.codec_writer and not args.quick:
        import importlib

        module, _, function = args.codec_writer.partition(":")
        path = getattr(importlib.import_module(module), function)(out)
    else:
        path = write_random_codec(out, args.quick)
    sink.put("path", str(path))
    sink.put("write_s", round(time.perf_counter() - began, 2))


def step_model(sink: Sink, args) -> None:
    from gpu_job_run import run_model

    run_model(sink, args)


STEPS = {"rows": step_rows, "codec": step_codec, "s1-mini": step_model, "s2-pro": step_model}


# ---- the run (the parent process imports nothing of chorus or torch) ----------------------
def run_step(name: str, args, timeout: float, log) -> dict:
    """One step in a child process; its figures come back through a file in the work folder."""
    figures = Path(args.work) / f"step-{name}.json"
    figures.unlink(missing_ok=True)
    command = [sys.executable, str(Path(__file__).resolve()), "--run-step", name, "--json", str(figures)]
    command += ["--device", args.device, "--work", args.work, "--rows", str(args.rows)]
    command += ["--codec-writer", args.codec_writer] + (["--quick"] if args.quick else [])
    # the repository first, then what the .sh put on the path (the carried wheels' folder)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    env["PYTHONUNBUFFERED"] = "1"
    status, code = run_killable(command, timeout, log, env)
    result = json.loads(figures.read_text()) if figures.is_file() else None
    if status == "ok" and isinstance(result, dict) and result.get("ok") is False:
        status = "check failed"
    return {"status": status, "exit_code": code, "result": result}


def plan(args) -> list[tuple[str, float]]:
    models = [m for m in args.models.split(",") if m]
    unknown = set(models) - set(MODELS)
    if unknown:
        raise SystemExit(f"gpu_job: unknown model(s) {sorted(unknown)}; known: {', '.join(MODELS)}")
    steps = []
    for name, (cuda_cap, quick_cap) in CAPS.items():
        cap = quick_cap if args.quick else cuda_cap
        if cap and (name not in MODELS or name in models):
            steps.append((name, cap))
    return steps


def main(argv=None) -> int:
    parser = step_parser(__doc__, "gpu_job", "tiny models and rows: a check the path still runs", 420.0)
    parser.add_argument("--models", default=",".join(MODELS), help="comma list of s1-mini, s2-pro")
    parser.add_argument("--rows", type=int, default=0, help="input rows (0: 1536, 16 with --quick)")
    parser.add_argument("--codec-writer", default="", help="MODULE:FUNCTION writing the real-size codec")
    parser.add_argument("--work", help="folder for the rows, checkpoints and parts (default: a temporary one)")
    args = parser.parse_args(argv)
    if args.run_step:  # a child: one step
        sys.path.insert(0, str(REPO))
        STEPS[args.run_step](Sink(Path(args.json)), args)
        return 0
    # the steps' big files (checkpoints of GBs, parts) apart from the JSON and log: a lent
    # machine sends back only a few small files
    temporary = not args.work
    args.work = args.work or tempfile.mkdtemp(prefix="chorus-gpu-job-")
    Path(args.work).mkdir(parents=True, exist_ok=True)

    def run_one(name: str, timeout: float, log) -> dict:
        return run_step(name, args, timeout, log)

    try:
        return run_steps("gpu_job", plan(args), run_one, args, Path(args.out), headline=summary)
    finally:
        if temporary:
            shutil.rmtree(args.work, ignore_errors=True)


def summary(entry: dict) -> str:
    """A model step's headline figures for the console."""
    result = entry.get("result") or {}
    run, alone = result.get("end_to_end") or {}, result.get("engine_alone") or {}
    if not run or not alone:
        return ""
    return (
        f"  end to end {run['audio_s_per_s']:.1f} audio-s/s, engine alone {alone['audio_s_per_s']:.1f}: "
        f"{result.get('vs_engine_alone', 0):.2f}; gpu busy {run.get('gpu_busy')}"
    )


if __name__ == "__main__":
    sys.exit(main())
