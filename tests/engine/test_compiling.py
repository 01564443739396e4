"""engine.compile (off | on | auto) and the compile cache kept across starts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from actors.engine import Engine, EngineConfig
from actors.engine.buckets import cpu_buckets
from actors.engine.compiling import INDUCTOR_CACHE_ENV, auto_compiles, compiles, use_cache_dir
from actors.engine.settings import compile_mode
from actors.native import default_cache_dir

ROOT = Path(__file__).resolve().parents[2]
CPU = torch.device("cpu")


def test_compile_reads_on_off_auto_and_the_bools_yaml_and_hydra_make():
    assert [compile_mode(v) for v in (True, "True", "on", "ON")] == ["on"] * 4
    assert [compile_mode(v) for v in (False, "False", "off", " Off ")] == ["off"] * 4
    assert compile_mode("Auto") == "auto"
    with pytest.raises(ValueError, match=r"engine.compile must be one of off, on, auto .* got 'yes'"):
        compile_mode("yes")
    with pytest.raises(ValueError, match="engine.compile"):
        EngineConfig(compile="sometimes").validate()


@pytest.mark.slow  # > 7 s: the everyday subset stays under 5 minutes
def test_auto_compiles_on_cpu_where_the_linears_are_packed_and_not_on_cuda(lm32, lm64):
    # CUDA runs the eager frame as CUDA graphs: a cold compile took minutes there (compiling.py)
    assert not auto_compiles(torch.device("cuda"), packed_linears=False)
    assert auto_compiles(CPU, packed_linears=True) and not auto_compiles(CPU, packed_linears=False)
    assert not compiles(EngineConfig(compile="auto"), torch.device("cuda:0"))
    assert compiles(EngineConfig(compile="on"), torch.device("cuda:0"))
    assert compiles(EngineConfig(compile="on"), CPU) and compiles(EngineConfig(compile=True), CPU)
    assert not compiles(EngineConfig(), torch.device("cuda"))  # the engine's own default is off
    # what an engine decides (building an engine compiles nothing yet: the first frame would)
    compiled = Engine(lm32, EngineConfig(max_rows=8, max_tokens=32, compile="auto")).runner
    assert compiled.compiled and compiled.buckets == [2, 4, 6, 8]  # on CPU: max_rows and its quarters
    assert cpu_buckets(32) == [8, 16, 24, 32] and cpu_buckets(2) == [2] and cpu_buckets(1) == [1]
    assert cpu_buckets(6) == [2, 3, 4, 6]  # never a 1-row graph where a row can be padded to 2
    unpacked = EngineConfig(max_rows=2, max_tokens=32, compile="auto", cpu_packed_linears=False)
    assert not Engine(lm32, unpacked).runner.compiled
    assert not Engine(lm64, EngineConfig(max_rows=2, max_tokens=32, compile="auto")).runner.compiled  # float64


def test_the_compile_cache_is_the_configured_dir_else_the_users_variable_else_chorus_own(tmp_path, monkeypatch):
    monkeypatch.delenv(INDUCTOR_CACHE_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == tmp_path / "xdg" / "chorus" / "compile"
    assert use_cache_dir(None) == default_cache_dir() and default_cache_dir().is_dir()
    assert os.environ[INDUCTOR_CACHE_ENV] == str(default_cache_dir())  # what inductor reads
    monkeypatch.setenv(INDUCTOR_CACHE_ENV, str(tmp_path / "users"))
    assert use_cache_dir(None) == tmp_path / "users"
    assert use_cache_dir(str(tmp_path / "configured")) == tmp_path / "configured"
    assert os.environ[INDUCTOR_CACHE_ENV] == str(tmp_path / "configured")


# run twice in fresh processes against one cache dir: the second start finds the first's graph
_START = """
import json, sys, time
import torch
from torch._dynamo.utils import counters
from actors.engine import Engine, EngineConfig, load_model
lm = load_model(sys.argv[1], device="cpu", dtype="bfloat16")
engine = Engine(lm, EngineConfig(max_rows=4, max_tokens=64, compile="on", compile_cache_dir=sys.argv[2]))
seconds = engine.warm_up()
print(json.dumps({"compiled": engine.runner.compiled, "seconds": seconds, "cache": str(engine.runner.compile_cache),
                  "hits": counters["inductor"]["fxgraph_cache_hit"]}))
"""


@pytest.mark.slow
def test_a_compiled_frame_is_built_at_start_and_the_next_start_reuses_the_cached_graph(ckpt, tmp_path):
    """compile=on: the frame is compiled at warm_up (before any real row) into the configured
    cache; a second process starting the same engine hits inductor's FX graph cache there."""
    cache = tmp_path / "compile-cache"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CUDA_VISIBLE_DEVICES": ""}
    env.pop(INDUCTOR_CACHE_ENV, None)
    starts = []
    for _ in range(2):
        out = subprocess.run(
            [sys.executable, "-c", _START, str(ckpt), str(cache)], env=env, capture_output=True, text=True, check=True
        )
        starts.append(json.loads(out.stdout.strip().splitlines()[-1]))
    first, second = starts
    assert first["compiled"] and second["compiled"]
    assert first["cache"] == second["cache"] == str(cache)
    assert first["seconds"] > 0 and any(cache.iterdir())
    assert first["hits"] == 0 and second["hits"] >= 1


@pytest.mark.slow
def test_warm_up_builds_every_buckets_graph_before_the_first_real_row(lm32):
    """Rows of every batch size, sampling as upstream does (warm_up's default), compile nothing
    more after warm_up: no real block waits for a compile mid-job (before, only the one-row
    bucket was built at start, with sampling the real rows did not use)."""
    from torch._dynamo.utils import counters

    from actors.engine import Engine, Request, upstream_sampling

    engine = Engine(lm32, EngineConfig(max_rows=3, max_tokens=32, compile="on", decode_buckets=[1, 3]))
    before = counters["stats"]["unique_graphs"]
    assert engine.warm_up() > 0
    built = counters["stats"]["unique_graphs"] - before
    prompt = np.zeros((1 + lm32.config.num_codebooks, 3), dtype=np.int64)
    sampling = upstream_sampling(lm32.config.family)
    rows = [Request(f"r{i}", prompt, 3, sampling.with_seed(7 + i), stop_on_eos=False) for i in range(3)]
    assert all(r.frames == 3 for r in engine.generate(rows) + engine.generate(rows[:1]))
    assert built == 2 and counters["stats"]["unique_graphs"] - before == built
