"""The cost of a row's WER and CER (actors/quality/text.py: Whisper's normaliser, then jiwer) at a
few text lengths, split into the normalising and the edit distance; the median of repeats.
Prints a table and writes JSON.

    .venv/bin/python scripts/bench_error_rates.py [--chars 200 2000 18000] [--repeats 7]
        [--json docs/bench/error-rates.json]

The texts: English words with numbers and punctuation, the hypothesis a shuffled copy with every
seventh word changed (so the distance has work to do).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

from bench_export import cpu_name  # noqa: E402

from actors.quality import text  # noqa: E402

WORDS = "the quick brown fox paid $20 on the 3rd of May, and Mr. Smith said: twenty-one colours!".split()


def texts(chars: int, seed: int = 0) -> tuple[str, str]:
    rng = random.Random(seed)
    reference = []
    while sum(len(w) + 1 for w in reference) < chars:
        reference.append(rng.choice(WORDS))
    hypothesis = [w if i % 7 else rng.choice(WORDS) for i, w in enumerate(reference)]
    return " ".join(reference), " ".join(hypothesis)


def median_ms(call, repeats: int) -> float:
    runs = []
    for _ in range(repeats):
        began = time.perf_counter()
        call()
        runs.append((time.perf_counter() - began) * 1000)
    return round(statistics.median(runs), 3)


def measure(reference: str, hypothesis: str, recipe: str, repeats: int) -> dict:
    return {
        "chars": len(reference),
        "recipe": recipe,
        "normalise_ms": median_ms(lambda: [text.normalize(t, recipe) for t in (reference, hypothesis)], repeats),
        "wer_ms": median_ms(lambda: text.word_error_rate(reference, hypothesis, recipe), repeats),
        "cer_ms": median_ms(lambda: text.char_error_rate(reference, hypothesis, recipe), repeats),
        "both_ms": median_ms(lambda: text.error_rates(reference, hypothesis, recipe), repeats),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--chars", type=int, nargs="+", default=[200, 2000, 18000])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--json", default=str(REPO / "docs" / "bench" / "error-rates.json"))
    args = parser.parse_args()
    text.word_error_rate("warm up", "warm up", text.ENGLISH)  # the imports and the spelling list
    results = []
    print("| chars | recipe | normalise both ms | wer ms | cer ms | wer and cer (error_rates) ms |")
    print("|---|---|---|---|---|---|")
    for chars in args.chars:
        reference, hypothesis = texts(chars)
        for recipe in text.RECIPES:
            row = measure(reference, hypothesis, recipe, args.repeats)
            results.append(row)
            print(
                f"| {row['chars']:,} | {recipe} | {row['normalise_ms']} | {row['wer_ms']} | {row['cer_ms']} | "
                f"{row['both_ms']} |"
            )
    Path(args.json).write_text(json.dumps({"cpu": cpu_name(), "results": results}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
