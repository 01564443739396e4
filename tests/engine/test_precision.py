"""`auto`'s dtype rule (actors/precision.py): both branches by handing in the CPU's units,
the probe against the kernel's own flags, and `auto` end to end through the engine's loader,
`python -m actors.engine info`, and the codec's loader."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch

from actors import precision
from actors.precision import CpuUnits, auto_dtype, choose_dtype
from tests.helpers import run_module

AMX = CpuUnits(amx_bf16=True, avx512_bf16=True)  # Sapphire Rapids
ZEN4 = CpuUnits(amx_bf16=False, avx512_bf16=True)
AVX2 = CpuUnits(amx_bf16=False, avx512_bf16=False)


@pytest.mark.parametrize(
    "units, dtype, reason",
    [
        (AMX, torch.bfloat16, "cpu has amx_bf16"),
        (ZEN4, torch.bfloat16, "cpu has avx512_bf16"),
        (AVX2, torch.float32, "cpu has neither avx512_bf16 nor amx_bf16"),
    ],
)
def test_auto_is_bfloat16_only_where_the_cpu_has_bf16_units(units, dtype, reason):
    choice = auto_dtype("cpu", units)
    assert choice.dtype == dtype and choice.reason.startswith(reason)
    assert choose_dtype("auto", None, units) == choice  # no device: the CPU
    assert choice.describe().startswith(f"{str(dtype).removeprefix('torch.')} (auto: {reason}")


def test_cuda_is_bfloat16_whatever_the_host_cpu():
    for units in (AMX, AVX2):
        assert auto_dtype("cuda:1", units).dtype == torch.bfloat16


@pytest.mark.parametrize("name, dtype", [("float32", torch.float32), ("fp32", torch.float32), ("bf16", torch.bfloat16)])
def test_an_explicit_dtype_overrides_the_rule(name, dtype):
    for units in (AMX, AVX2):
        assert choose_dtype(name, "cpu", units) == precision.DtypeChoice(dtype, "requested")
    assert choose_dtype(torch.float64, "cpu", AMX).dtype == torch.float64
    with pytest.raises(ValueError, match="unknown dtype 'bf32'.*or 'auto'"):
        choose_dtype("bf32", "cpu", AMX)


def test_auto_logs_its_choice_once(monkeypatch, caplog):
    monkeypatch.setattr(precision, "_logged", set())
    with caplog.at_level(logging.INFO, logger=f"chorus.{precision.__name__}"):
        for _ in range(3):
            choose_dtype("auto", "cpu", ZEN4)
        choose_dtype("auto", "cpu", AVX2)
        choose_dtype("float32", "cpu", ZEN4)
    messages = [r.getMessage() for r in caplog.records]
    assert messages[0] == "dtype auto -> bfloat16 (cpu has avx512_bf16)"
    assert len(messages) == 2 and messages[1].startswith("dtype auto -> float32 (cpu has neither")


@pytest.mark.skipif(not Path("/proc/cpuinfo").is_file(), reason="reads the kernel's CPU flags")
def test_the_probe_agrees_with_the_kernels_cpu_flags():
    flags = set()
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
            break
    if not flags:
        pytest.skip("no x86 flags line")
    units = CpuUnits.of_this_cpu()
    assert units.avx512_bf16 == ("avx512_bf16" in flags)
    assert units.amx_bf16 == ("amx_tile" in flags)


def test_auto_loads_the_engine_and_the_codec_in_the_rules_dtype(ckpt, tmp_path):
    from actors.codec import load_codec
    from actors.codec.tiny import make_tiny as make_tiny_codec
    from actors.engine import load_model

    expected = auto_dtype("cpu")
    lm = load_model(ckpt, device="cpu", dtype="auto")
    assert (lm.dtype, lm.dtype_reason) == (expected.dtype, expected.reason)
    assert all(p.dtype == expected.dtype for p in lm.model.parameters())
    assert load_model(ckpt, device="cpu", dtype="float32").dtype_reason == "requested"
    codec_path = make_tiny_codec(tmp_path / "codec")
    assert next(load_codec(codec_path, dtype="auto").parameters()).dtype == expected.dtype
    assert next(load_codec(codec_path, dtype="float32").parameters()).dtype == torch.float32


@pytest.mark.slow  # ~6 s
def test_info_reports_autos_choice_and_its_reason(ckpt):
    expected = auto_dtype("cpu")
    info = json.loads(
        run_module("actors.engine", "info", "--checkpoint", str(ckpt), "--dtype", "auto", "--json").stdout
    )
    assert info["dtype"] == str(expected.dtype) and info["dtype_reason"] == expected.reason
    text = run_module("actors.engine", "info", "--checkpoint", str(ckpt), "--dtype", "auto").stdout
    assert f"dtype        {expected.name} (auto: {expected.reason}) on cpu" in text
    plain = run_module("actors.engine", "info", "--checkpoint", str(ckpt), "--dtype", "float32").stdout
    assert "dtype        float32 on cpu" in plain
