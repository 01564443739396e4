#!/usr/bin/env python3
"""The GPU check: what chorus needs to know from a lent GPU, in one command of about 8 minutes.

    python3 scripts/gpu_check.py [--out DIR] [--deadline-s 500] [--only STEP,STEP]
    python3 scripts/gpu_check.py --device cpu --quick     # CI: every step at tiny sizes

It runs on the lent machine's image as it is: python3 with torch, numpy, pyarrow, safetensors,
tokenizers, tiktoken and pytest (pytest-timeout when present); no Ray, Hydra or soundfile;
nothing installed, nothing downloaded, no network. Each step runs in a process of its own under
a timeout of its own, within the run's deadline: a step that hangs or crashes costs its own
figures, not the others'. DIR/gpu_check.json is rewritten after every step (a step that writes
several figures rewrites its part after each), so a run killed at its limit leaves everything
finished before. DIR/gpu_check.log holds every step's output. Exit status 1 when a step failed.

Steps, in order (on CUDA; --quick runs each at tiny sizes on the CPU, and skips what needs CUDA):
  ceilings      the device's copy bandwidth and bf16 matrix rate, measured
  parity        the upstream vectors: logits and greedy codes, float32 and bfloat16, eager and graphed
  frame_check   the decode step's capture audit; graphed steps against the plain one, f32 and bf16
  decode_s1     S1-mini shape (random real-size weights): frames/s at 1/32/128/256 rows, graphed, with
                the eager ops and with the fused kernels (engine.kernels=fused)
  decode_s2     the same for the S2-Pro shape
  kernels       kernels per decode step (eager, fused; both shapes), prefill ms per admission
  fp8           the FP8 options at 256 rows (K/V; S2-Pro's W8A8 products) and their greedy A/B
  start         cold and warm start (load, warm-up with compiles and captures, first step): the
                fused kernels and the inductor-compiled regions, each in fresh processes
  codec         the real-size codec's decode (fused and eager, graphed and not) at 1/16/64 rows: audio s/s
  keys          the decode step against the key count (512 ... 3072), 32 rows, both shapes
  invariance    bf16 rows alone vs in a batch: cuBLAS linears at 1..256 rows, and whole engine rows
  tests         the engine tests with the model on the device (CHORUS_TEST_DEVICE)
  compile       the frame compiled (inductor) inside the graphs (only with --only compile: a cold
                compile of the S1-mini frame ran past 176 s)
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import gpu_check_fused  # the fused decode step's steps (kernels, fp8, start), beside this script

REPO = Path(__file__).resolve().parents[1]
TEST_FILES = [
    "tests/engine/test_engine.py",
    "tests/engine/test_engine_streaming.py",
    "tests/engine/test_model_vectors.py",
    "tests/engine/test_sampling.py",
    "tests/engine/test_engine_bf16.py",
    "tests/engine/test_graphs.py",
]
# each step's own time limit (seconds) on CUDA and with --quick
CAPS = {
    "ceilings": (30, 30),
    "parity": (90, 90),
    "frame_check": (90, 120),
    "decode_s1": (120, 90),
    "decode_s2": (150, 90),
    "kernels": (60, 120),
    "fp8": (90, 120),
    "start": (120, 120),
    "codec": (90, 90),
    "keys": (120, 90),
    "invariance": (90, 90),
    "tests": (180, 400),
    "compile": (0, 0),  # opt-in (--only compile), then COMPILE_CAP
}
DECODE_ROWS = [1, 32, 128, 256]
COMPILE_CAP = 200
KEY_COUNTS = [512, 1024, 2048, 3072]


# ---- the steps (each runs in a child process: `--run-step NAME`) --------------------------
class Sink:
    """A step's figures, written to its JSON file after each one (a step killed at its limit
    keeps what it finished)."""

    def __init__(self, path: Path):
        self.path, self.data = path, {}

    def put(self, key: str, value) -> None:
        self.data[key] = value
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=2, default=str))
        tmp.replace(self.path)


def _model(size: str, device: str, quick: bool):
    from actors.engine.tiny import random_model

    return random_model("tiny" if quick else size, device=device, dtype="float32" if quick else "bfloat16")


def step_ceilings(sink: Sink, device: str, quick: bool) -> None:
    import torch

    from actors.engine.figures import ceilings

    sink.put("torch", torch.__version__)
    sink.put("ceilings", ceilings(torch.device(device), seconds=0.3 if quick else 1.0))


def step_parity(sink: Sink, device: str, quick: bool) -> None:
    from actors.engine.checks import DEFAULT_VECTORS, vector_parity

    for dtype in ("float32", "bfloat16"):
        for variant in ("eager", "graphs") if device == "cuda" else ("eager",):
            report = vector_parity(DEFAULT_VECTORS, device, dtype, variant)
            sink.put(f"{dtype}/{variant}", report)
    exact = all(r["codes_identical"] for key, v in sink.data.items() if key.startswith("float32") for r in v.values())
    sink.put("ok", exact)


def step_frame_check(sink: Sink, device: str, quick: bool) -> None:
    from actors.engine.checks import frame_check

    for dtype in ("float32", "bfloat16"):
        sink.put(dtype, frame_check(device, dtype, ("graphs",) if device == "cuda" else ()))
    sink.put("ok", all(sink.data[d]["ok"] for d in ("float32", "bfloat16")))


def _decode(sink: Sink, device: str, quick: bool, size: str) -> None:
    from actors.engine.figures import decode_figures

    lm = _model(size, device, quick)
    sink.put(
        "model",
        {
            "size": "tiny" if quick else size,
            "parameters": sum(p.numel() for p in lm.model.parameters()),
            "dtype": str(lm.dtype),
        },
    )
    for rows in [1, 4] if quick else DECODE_ROWS:
        for variant in ("graphs", "fused") if device == "cuda" else ("eager", "fused"):
            sink.put(f"{variant}/{rows}", decode_figures(lm, rows, variant, frames=6 if quick else 48))


def step_decode_s1(sink: Sink, device: str, quick: bool) -> None:
    _decode(sink, device, quick, "s1-mini")


def step_decode_s2(sink: Sink, device: str, quick: bool) -> None:
    _decode(sink, device, quick, "s2-pro")


def step_codec(sink: Sink, device: str, quick: bool) -> None:
    """The real-size codec's decode in bf16, fused (Triton) and eager, graphed and not, at 1, 16
    and 64 rows of 10 s; accuracy against float32 (actors/codec/gpu_bench.py; its own command,
    `python3 -m actors.codec gpu-bench`, measures the whole grid)."""
    from actors.codec.gpu_bench import GpuBenchOptions, run_gpu_bench

    options = GpuBenchOptions.quick() if quick else GpuBenchOptions(rows=(1, 16, 64), seconds=(10.0,), budget_s=75,
                                                                    overlap=False, device=device)  # fmt: skip
    run_gpu_bench(options, log=lambda _: None, on_put=sink.put)


def step_keys(sink: Sink, device: str, quick: bool) -> None:
    from actors.engine.figures import step_vs_keys

    variant = "graphs" if device == "cuda" else "eager"
    for size in ["tiny"] if quick else ["s1-mini", "s2-pro"]:
        lm = _model(size, device, quick)
        sink.put(size, step_vs_keys(lm, 2 if quick else 32, [32, 64] if quick else KEY_COUNTS, variant))
        del lm


def step_invariance(sink: Sink, device: str, quick: bool) -> None:
    import torch

    from actors.engine.figures import engine_invariance, linear_invariance

    sizes = [1, 2, 4] if quick else [1, 2, 8, 32, 64, 100, 128, 129, 256]
    variant = "graphs" if device == "cuda" else "eager"
    for size in ["tiny"] if quick else ["s1-mini", "s2-pro"]:
        lm = _model(size, device, quick)
        sink.put(f"{size}/linears", linear_invariance(lm.model, sizes))
        if device == "cuda":
            matmul = torch.backends.cuda.matmul
            default = matmul.allow_bf16_reduced_precision_reduction
            matmul.allow_bf16_reduced_precision_reduction = False
            sink.put(f"{size}/linears_no_reduced_precision_reduction", linear_invariance(lm.model, sizes))
            matmul.allow_bf16_reduced_precision_reduction = default
        sink.put(f"{size}/engine", engine_invariance(lm, 4 if quick else 16, 4 if quick else 24, variant))
        del lm


def step_compile(sink: Sink, device: str, quick: bool) -> None:
    from torch._dynamo.utils import counters

    from actors.engine.checks import frame_check
    from actors.engine.figures import decode_figures

    sink.put("frame_check_float32", frame_check(device, "float32", ("compiled",)))
    lm = _model("s1-mini", device, quick)
    for rows in (32, 128):
        sink.put(f"compiled/{rows}", decode_figures(lm, rows, "compiled", frames=48))
        sink.put("counters", {group: dict(values) for group, values in counters.items()})


STEPS = {
    "ceilings": step_ceilings,
    "parity": step_parity,
    "frame_check": step_frame_check,
    "decode_s1": step_decode_s1,
    "decode_s2": step_decode_s2,
    "kernels": gpu_check_fused.step_kernels,
    "fp8": gpu_check_fused.step_fp8,
    "start": gpu_check_fused.step_start,
    "codec": step_codec,
    "keys": step_keys,
    "invariance": step_invariance,
    "tests": None,  # pytest, run by the parent itself (run_tests)
    "compile": step_compile,
}


# ---- the run (the parent process imports nothing of chorus or torch) ----------------------
def _run(command: list[str], timeout: float, log, env=None) -> tuple[str, int]:
    """Run a command in a session of its own; on timeout kill its whole process group.
    Returns (status, exit code): ok, failed or timeout."""
    with subprocess.Popen(
        command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    ) as proc:
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return "timeout", -9
    return ("ok" if code == 0 else "failed"), code


def run_tests(device: str, timeout: float, work: Path, log) -> dict:
    """The engine tests with the model on `device`, every test (no -x), the slow ones left out."""
    xml = work / "tests.xml"
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not slow", *TEST_FILES]
    command += ["--junitxml", str(xml)]
    try:
        import pytest_timeout  # noqa: F401  (the image has it; a test that hangs then fails alone)

        command += ["--timeout", "120"]
    except ImportError:
        pass
    env = dict(os.environ, CHORUS_TEST_DEVICE=device, PYTHONPATH=str(REPO))
    status, code = _run(command, timeout, log, env)
    result = {"exit_code": code}
    if xml.is_file():
        import xml.etree.ElementTree as ET

        root = ET.parse(xml).getroot()
        suite = root if root.tag == "testsuite" else root[0]
        result |= {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
        result["failed"] = [
            f"{case.get('classname')}::{case.get('name')}"
            for case in suite.iter("testcase")
            if case.find("failure") is not None or case.find("error") is not None
        ]
    return {"status": status, "result": result}


def run_step(name: str, device: str, quick: bool, timeout: float, work: Path, log) -> dict:
    """One step in a child process; its figures come back through a file in `work`."""
    if name == "tests":
        return run_tests(device, timeout, work, log)
    figures = work / f"step-{name}.json"
    figures.unlink(missing_ok=True)
    command = [sys.executable, str(Path(__file__).resolve()), "--run-step", name, "--device", device]
    command += ["--json", str(figures)] + (["--quick"] if quick else [])
    env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1")
    status, code = _run(command, timeout, log, env)
    result = json.loads(figures.read_text()) if figures.is_file() else None
    if status == "ok" and isinstance(result, dict) and result.get("ok") is False:
        status = "check failed"
    return {"status": status, "exit_code": code, "result": result}


def plan(device: str, quick: bool, only: list[str]) -> list[tuple[str, float]]:
    steps = []
    for name, (cuda_cap, quick_cap) in CAPS.items():
        cap = quick_cap if quick else cuda_cap
        if name == "compile" and name in only and not quick:
            cap = COMPILE_CAP
        if (only and name not in only) or cap == 0:
            continue
        steps.append((name, cap))
    return steps


def write_report(path: Path, report: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(report, indent=2, default=str))
    tmp.replace(path)


def step_parser(doc: str, name: str, quick_help: str, deadline_s: float) -> argparse.ArgumentParser:
    """The options of both GPU scripts (this one and gpu_job.py): the device, the quick mode,
    where the JSON and log go, the whole run's time limit, and a child's step and JSON."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    parser.add_argument("--quick", action="store_true", help=quick_help)
    parser.add_argument("--out", default=str(REPO / "artifacts" / name), help="folder for the JSON and the log")
    parser.add_argument("--deadline-s", type=float, default=deadline_s, help="the whole run's time limit")
    parser.add_argument("--run-step", help=argparse.SUPPRESS)
    parser.add_argument("--json", help=argparse.SUPPRESS)
    return parser


def main(argv=None) -> int:
    parser = step_parser(__doc__, "gpu_check", "tiny sizes: a check that every step still runs", 470.0)
    parser.add_argument("--only", default="", help="comma list of steps to run (default: all)")
    args = parser.parse_args(argv)
    if args.run_step:  # a child: one step
        sys.path.insert(0, str(REPO))
        STEPS[args.run_step](Sink(Path(args.json)), args.device, args.quick)
        return 0
    work = Path(tempfile.mkdtemp(prefix="chorus-gpu-check-"))  # the steps' files (the JSON holds them all)
    steps = plan(args.device, args.quick, [s for s in args.only.split(",") if s])

    def run_one(name: str, timeout: float, log) -> dict:
        return run_step(name, args.device, args.quick, timeout, work, log)

    return run_steps("gpu_check", steps, run_one, args, Path(args.out))


def run_steps(label: str, steps, run_one, args, out: Path, headline=lambda entry: "") -> int:
    """Each (step, cap) in turn, `run_one(name, timeout, log)` within the run's deadline (a step
    the deadline leaves no time for is recorded as skipped); OUT/<label>.json rewritten after
    each step, OUT/<label>.log their output. Exit status 1 when a step did not finish ok. (The
    GPU job, scripts/gpu_job.py, runs its steps with it too.)"""
    out.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + args.deadline_s
    report = {"device": args.device, "quick": args.quick, "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    report["steps"] = {}
    failed = []
    with open(out / f"{label}.log", "a") as log:
        for name, cap in steps:
            left = deadline - time.monotonic() - 3
            if left < 10:
                report["steps"][name] = {"status": "skipped", "reason": "the run's deadline came first"}
                failed.append(name)
                continue
            print(f"== {name} (up to {min(cap, left):.0f} s)", file=log, flush=True)
            began = time.monotonic()
            entry = run_one(name, min(cap, left), log)
            entry["seconds"] = round(time.monotonic() - began, 1)
            report["steps"][name] = entry
            write_report(out / f"{label}.json", report)
            print(f"{label}: {name:<12} {entry['status']:<12} {entry['seconds']:>6.1f} s{headline(entry)}", flush=True)
            if entry["status"] != "ok":
                failed.append(name)
    write_report(out / f"{label}.json", report)
    print(f"{label}: wrote {out / f'{label}.json'}; " + (f"failed: {', '.join(failed)}" if failed else "all ok"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
