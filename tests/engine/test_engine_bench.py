"""`python -m actors.engine bench`: its modes side by side, its dtypes, its step time."""

import json

import numpy as np
import pytest

from helpers import run_module


def _bench(tmp_path, *args: str, timeout: float = 300):
    """`python -m actors.engine bench ARGS --json F` run as a user would: it must succeed;
    returns the process and the JSON report it wrote."""
    out = tmp_path / "bench.json"
    proc = run_module("actors.engine", "bench", *args, "--json", str(out), timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc, json.loads(out.read_text())


@pytest.mark.slow  # ~9 s: a bench in a subprocess
def test_bench_cli_reports_every_mode_side_by_side(tmp_path):
    """`python -m actors.engine bench`: the modes run interleaved --repeats times on the same
    requests, each reports its median run, and the figures agree with each other."""
    proc, report = _bench(
        tmp_path,
        "--compile",
        "off",
        "--size",
        "tiny",
        "--rows",
        "6",
        "--max-rows",
        "3",
        "--prompt-len",
        "8",
        "--frames",
        "4",
        "--references",
        "2",
        "--reference-frames",
        "5",
        "--repeats",
        "3",
        "--threads",
        "1",
    )
    modes = report["modes"]
    assert [m["mode"] for m in modes] == ["engine max_rows=3", "engine max_rows=3 no-prefix-reuse", "engine max_rows=1"]
    assert report["repeats"] == 3 and report["batched_codes_equal_single"] is True
    for m in modes:
        assert len(m["wall_s_runs"]) == 3
        assert m["wall_s"] == sorted(m["wall_s_runs"])[1]  # the median run is the one reported
        assert m["frames"] == modes[0]["frames"] and m["rows"] == 6
        assert m["frames_per_s"] == pytest.approx(m["frames"] / m["wall_s"])
        assert m["compiled"] is False and m["warm_up_s"] == 0
    assert report["speedup_batched_vs_single"] == pytest.approx(modes[0]["frames_per_s"] / modes[-1]["frames_per_s"])
    assert modes[0]["prefix_hits"] > 0 and modes[1]["prefix_hits"] == 0
    assert "median of 3 run(s)" in proc.stdout
    # kernels per decode step, eager and fused (tiny: 2 slow and 2 fast layers, 10 codebooks)
    counts = report["kernels_per_step"]
    assert 0 < counts["fused"] < counts["eager"] / 2
    assert f"eager {counts['eager']}, fused {counts['fused']}" in proc.stdout


@pytest.mark.slow
def test_bench_compiles_by_default_on_cpu_and_its_batch_sizes_agree(tmp_path):
    """bench's default is engine.compile=auto, which compiles on CPU (packed linears): every
    mode's frame (3-row and 1-row batches, in bfloat16 where this CPU chooses it) is built
    before its timed run, and each row's codes are the same in both."""
    args = ["--size", "tiny", "--rows", "4", "--max-rows", "3", "--prompt-len", "8", "--frames", "4"]
    proc, report = _bench(tmp_path, *args, "--threads", "1", timeout=1200)
    assert report["compile"] == "auto" and [m["mode"] for m in report["modes"]] == [
        "engine max_rows=3",
        "engine max_rows=1",
    ]
    assert all(m["compiled"] and m["warm_up_s"] > 0 for m in report["modes"])
    assert report["batched_codes_equal_single"] is True
    assert "decode frame compiled (--compile auto)" in proc.stdout


@pytest.mark.slow  # ~11 s: two dtypes end to end
def test_bench_runs_dtypes_side_by_side(tmp_path):
    args = ["--size", "tiny", "--rows", "4", "--max-rows", "2", "--prompt-len", "8", "--frames", "3"]
    proc, report = _bench(tmp_path, *args, "--dtype", "float32,bfloat16", "--threads", "1", "--compile", "off")
    assert [m["mode"] for m in report["modes"]] == [
        "engine max_rows=2 float32",
        "engine max_rows=1 float32",
        "engine max_rows=2 bfloat16",
        "engine max_rows=1 bfloat16",
    ]
    by_mode = {m["mode"]: m for m in report["modes"]}
    ratio = by_mode["engine max_rows=2 bfloat16"]["frames_per_s"] / by_mode["engine max_rows=2 float32"]["frames_per_s"]
    assert report["dtype_speedups"]["bfloat16"]["max_rows=2"] == pytest.approx(ratio)
    steps = (
        by_mode["engine max_rows=2 float32"]["decode_step_ms"] / by_mode["engine max_rows=2 bfloat16"]["decode_step_ms"]
    )
    assert report["dtype_decode_step_speedups"]["bfloat16"]["max_rows=2"] == pytest.approx(steps)
    assert report["codes_equal_across_modes"]["float32"] is True
    assert "bfloat16 / float32 frames/s" in proc.stdout and "decode steps alone" in proc.stdout


@pytest.mark.slow  # ~7 s
def test_bench_step_time_leaves_out_the_prefill_before_the_first_frame(tmp_path):
    """A row admitted with others waits for all of their prefills before its first frame (its
    `decode_ms` counts that wait): the bench's step is each row's time per frame after its
    first, so the wait goes to the time to first frame. A slot capacity below the longest row
    is refused."""
    from actors.engine.bench import _row
    from actors.engine.types import Result

    def result(name, frames, first_frame_ms, total_ms, decode_ms):
        codes = np.zeros((2, frames), np.int64)
        return Result(name, codes, "budget", frames=frames, first_frame_ms=first_frame_ms, total_ms=total_ms,
                      decode_ms=decode_ms)  # fmt: skip

    # both rows prefilled in one 900 ms call; a: 5 frames at 100 ms, b: 3 frames at 100 ms
    rows = [result("a", 5, 1000.0, 1400.0, 1000.0), result("b", 3, 1000.0, 1200.0, 700.0)]
    assert _row("m", rows, 1.4, 0)["decode_step_ms"] == pytest.approx(100.0)  # (400 + 200) / (4 + 2)
    base = ["--size", "tiny", "--rows", "4", "--max-rows", "4", "--frames", "6", "--no-single", "--threads", "1"]
    base += ["--compile", "off"]
    _, report = _bench(tmp_path, *base, "--prompt-len", "8", "--max-tokens", "300")
    assert report["max_tokens"] == 300 and report["modes"][0]["decode_step_ms"] > 0
    refused = run_module("actors.engine", "bench", *base, "--prompt-len", "8", "--max-tokens", "4")
    assert refused.returncode != 0 and "--max-tokens 4 is below the longest row" in refused.stderr
