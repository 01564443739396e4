"""Engine checks a person (or scripts/gpu_check.sh) runs on a device: parity with the upstream
vectors in a given dtype, and the compiled decode frame against the eager one. Tooling: the
engine proper never imports this module."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import torch

from .engine import Engine
from .loader import load_model
from .settings import EngineConfig
from .types import Request, SamplingParams

VECTOR_SETS = ("dualar-s1-tiny", "dualar-s2-tiny")
# the upstream-made vectors ship with the tests (tests/vectors/PROVENANCE.md)
DEFAULT_VECTORS = Path(__file__).resolve().parents[2] / "tests" / "vectors"


def vector_parity(vectors: Path, device: str, dtype: str, variant: str = "eager") -> dict:
    """Per vector set: the largest |logit - upstream| of the teacher-forced slow and fast
    logits, and how many of upstream's greedy frames the engine reproduces (leading frames in
    a row, and columns equal overall) with the model in `dtype`, the engine's steps run as
    `variant` (figures.VARIANTS)."""
    from .figures import variant_config

    report = {}
    for name in VECTOR_SETS:
        root = Path(vectors) / name
        lm = load_model(root / "checkpoint", device=device, dtype=dtype)
        tokens = torch.from_numpy(np.load(root / "vectors/score_tokens.npy")).to(lm.device)
        slow, fast = lm.model.score(tokens)
        expected_slow = np.load(root / "vectors/score_slow_logits.npy")
        expected_fast = np.load(root / "vectors/score_fast_logits.npy")
        prompt = np.load(root / "vectors/greedy_prompt.npy")
        expected = np.load(root / "vectors/greedy_codes.npy")
        meta = json.loads((root / "vectors/greedy_meta.json").read_text())
        budget = meta["max_new_tokens"]
        engine = Engine(lm, variant_config(variant, 1, prompt.shape[1] + budget))
        result = engine.generate([Request("parity", prompt, budget, SamplingParams(temperature=0))])[0]
        n = min(result.codes.shape[1], expected.shape[1])
        equal = (result.codes[:, :n] == expected[:, :n]).all(axis=0)
        leading = int(np.argmin(equal)) if not equal.all() else n
        report[name] = {
            "variant": variant,
            "dtype": str(lm.dtype),
            "device": str(lm.device),
            "slow_logits_max_abs_diff": float(np.abs(slow.float().cpu().numpy() - expected_slow).max()),
            "fast_logits_max_abs_diff": float(np.abs(fast.float().cpu().numpy() - expected_fast).max()),
            "upstream_frames": int(expected.shape[1]),
            "frames": int(result.codes.shape[1]),
            "leading_frames_equal": leading,
            "frames_equal": int(equal.sum()),
            "codes_identical": bool(np.array_equal(result.codes, expected)),
            "stop_reason": result.stop_reason,
        }
    return report


def _frame_check_rows(lm, rows: int, frames: int) -> list[Request]:
    sampling = SamplingParams(temperature=0.9, top_p=0.85, top_k=20, ras_window=10, repetition_penalty=1.2)
    rng = np.random.default_rng(0)
    requests = []
    for i in range(rows):
        prompt = np.zeros((1 + lm.config.num_codebooks, 10 + i), np.int64)
        prompt[0] = rng.integers(32, 127, prompt.shape[1])
        requests.append(Request(f"c{i}", prompt, frames, sampling.with_seed(i), stop_on_eos=False))
    return requests


def frame_check(device: str, dtype: str = "float32", variants=("compiled",), rows: int = 8, frames: int = 4) -> dict:
    """Decode `rows` sampled rows (every sampling feature on) with the plain static frame and with
    each of `variants` (graphs: each step one CUDA graph; compiled: the frame through inductor
    (fullgraph: a graph break raises), inside the graphs on CUDA); every variant's tokens must
    equal the plain frame's. Also the plain step's capture audit (audit.py), and on CUDA each
    variant's graph captures and replays."""
    import tempfile

    from .audit import audit_steps
    from .figures import variant_config
    from .tiny import make_tiny

    with tempfile.TemporaryDirectory() as tmp:
        ckpt = make_tiny(Path(tmp) / "s2", fmt="s2", seed=5, num_codebooks=4, codebook_size=64, max_seq_len=256)
        lm = load_model(ckpt, device=device, dtype=dtype)
    requests = _frame_check_rows(lm, rows, frames)
    plain = Engine(lm, EngineConfig(max_rows=rows, max_tokens=64, static_shapes=True))
    expected = plain.generate(requests)
    for r in requests:
        plain.add(r)
    report = {"device": str(lm.device), "dtype": str(lm.dtype), "rows": rows, "frames": frames}
    report["audit"] = audit_steps(plain, frames)
    ok = report["audit"]["capturable"] and report["audit"]["addresses_stable"]
    for variant in variants:
        began = time.perf_counter()
        engine = Engine(lm, variant_config(variant, rows, 64, static_shapes=True))
        got = engine.generate(requests)
        same = sum(bool(np.array_equal(a.codes, b.codes)) for a, b in zip(expected, got))
        report[variant] = {
            "rows_identical": same,
            "seconds": time.perf_counter() - began,
            "compiled": engine.runner.compiled,
            "graphs": engine.graph_stats(),
        }
        ok = ok and same == rows
    report["ok"] = ok
    return report
