"""What each check on decoded audio costs per row: CPU seconds per second of audio for the
numpy checks (silence, clipping, loudness, speech rate: actors/quality/checks.py), the speaker
embedding (actors/quality/speaker.py) and DNSMOS (actors/quality/mos.py), on clips of a few
lengths, each timed several times (best and median). Prints a table and writes JSON.

    .venv/bin/python scripts/bench_quality_checks.py [--mos-model sig_bak_ovr.onnx]
        [--speaker-model DIR] [--seconds 2 5 10] [--repeats 5] [--threads 1] [--json out.json]

Without --speaker-model a WavLM x-vector model of wavlm-base-plus-sv's shape (transformers'
WavLMConfig defaults: 12 layers of 768) is built with random weights: the cost is the shape's,
whatever the weights. Without --mos-model DNSMOS is skipped (its weights are not in the
repository; the DNS-Challenge repository has DNSMOS/DNSMOS/sig_bak_ovr.onnx).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository, for scripts.*
from scripts.bench_soak import cpu_name  # noqa: E402

SAMPLE_RATE = 44100  # the codec's


def voice(seconds: float, seed: int) -> np.ndarray:
    """A voiced-like test signal at the codec's rate: harmonics of a pitch, some noise."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * SAMPLE_RATE)) / SAMPLE_RATE
    wave = sum(0.1 / h * np.sin(2 * np.pi * 140 * h * t) for h in range(1, 6))
    return (wave + 0.01 * rng.standard_normal(t.size)).astype(np.float32)


def timed(fn, repeats: int) -> tuple[float, float]:
    fn()  # warm-up: first-call allocations, lazy imports
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        fn()
        times.append(time.perf_counter() - began)
    return min(times), statistics.median(times)


def checks_to_time(args) -> dict:
    from actors.quality import checks
    from actors.quality.settings import QualitySettings

    settings = QualitySettings()
    found = {"numpy checks": lambda clip: checks.audio_metrics(clip, SAMPLE_RATE, "a text of some words", settings)}
    from actors.quality.speaker import SpeakerEmbedder

    model_dir = args.speaker_model or _random_wavlm(Path(tempfile.mkdtemp(prefix="wavlm-base-")))
    embedder = SpeakerEmbedder(str(model_dir))
    found["speaker embedding"] = lambda clip: embedder.embed([clip], SAMPLE_RATE)
    if args.mos_model:
        from actors.quality.mos import DNSMOS

        dnsmos = DNSMOS(args.mos_model, threads=args.threads)
        found["DNSMOS"] = lambda clip: dnsmos.score([clip], SAMPLE_RATE)
    return found


def _random_wavlm(folder: Path) -> Path:
    import torch
    from transformers import Wav2Vec2FeatureExtractor, WavLMConfig, WavLMForXVector

    torch.manual_seed(0)
    WavLMForXVector(WavLMConfig()).save_pretrained(folder)
    Wav2Vec2FeatureExtractor(
        feature_size=1, sampling_rate=16000, padding_value=0.0, do_normalize=True, return_attention_mask=True
    ).save_pretrained(folder)
    return folder


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--speaker-model", default=None)
    ap.add_argument("--mos-model", default=None)
    ap.add_argument("--seconds", type=float, nargs="+", default=[2.0, 5.0, 10.0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", default="artifacts/bench_quality_checks.json")
    args = ap.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    rows = []
    for name, check in checks_to_time(args).items():
        for seconds in args.seconds:
            clip = voice(seconds, seed=int(seconds * 10))
            best, median = timed(lambda check=check, clip=clip: check(clip), args.repeats)
            rows.append({"check": name, "audio_s": seconds, "best_s": best, "median_s": median})
            print(
                f"{name:18s} {seconds:5.1f} s audio: best {best * 1000:8.1f} ms, median {median * 1000:8.1f} ms, "
                f"{best / seconds:.4f} CPU s per audio s",
                flush=True,
            )
    report = {"cpu": cpu_name(), "threads": args.threads, "rows": rows}
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.json} ({report['cpu']}, {args.threads} thread(s))")


if __name__ == "__main__":
    main()
