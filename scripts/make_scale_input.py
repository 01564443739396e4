"""Write an N-row input shaped like a speech corpus, with the counts planning must find.

    .venv/bin/python scripts/make_scale_input.py N OUT [--files K] [--seed S] [--ref-fraction F]

OUT/part-XXXX.parquet: several files of `speaker/utt` ids, texts of corpus-like lengths, a
speaker column and (for a share of the rows) a reference clip by path, shared per speaker
through its ref_id (clips under OUT/refs/). Planted: duplicate ids, null ids, over-long ids and
one ref_id naming two clips. OUT/expected.json (also printed) holds what a preview of a fresh
output must report: rows_total, to_synthesize, rejected (reason -> rows).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from actors.schema import ID_MAX_CHARS  # noqa: E402

WORDS = (
    "the of and to in a is that for it as was with be by on not he this are or his from at which but have an "
    "they you were her she there been one all we their has would when if so no more out up said what its about "
    "into than them can only other time new some could these two may first then do any like my now over such "
    "our man me even most made after also did many before must through back years where much your way well down"
).split()
ROW_GROUP_ROWS = 65_536
SPEAKERS = 2_000
CONFLICT_REF = "spk-conflict"


def planted(n: int) -> dict:
    """How many rows of each kind of bad row an n-row input gets (at least one of each)."""
    return {
        "duplicate_pairs": max(2, n // 100_000),
        "null_id": max(1, n // 200_000),
        "long_id": max(1, n // 200_000),
        "conflict_rows": 2,
    }


def _texts(rng: np.random.Generator, n: int) -> list[str]:
    lengths = np.clip(rng.lognormal(mean=2.2, sigma=0.5, size=n).astype(int), 2, 60)
    words = np.array(WORDS)[rng.integers(0, len(WORDS), size=int(lengths.sum()))].tolist()
    out, at = [], 0
    for length in lengths.tolist():
        out.append(" ".join(words[at : at + length]).capitalize() + ".")
        at += length
    return out


def _write_clips(out: str) -> list[str]:
    import soundfile as sf

    os.makedirs(os.path.join(out, "refs"), exist_ok=True)
    names = []
    for k, freq in enumerate((180.0, 240.0)):
        t = np.arange(44_100 * 2) / 44_100
        name = f"refs/voice-{k}.flac"
        sf.write(os.path.join(out, name), 0.3 * np.sin(2 * np.pi * freq * t), 44_100)
        names.append(name)
    return names


def _share(count: int, files: int, k: int) -> int:
    return count // files + (1 if k < count % files else 0)


def _file_table(rng, first: int, n: int, plants: dict, clips: list[str], ref_fraction: float) -> pa.Table:
    """Rows first..first+n of the input, with this file's share of the planted rows."""
    speakers = rng.integers(0, SPEAKERS, size=n)
    ids: list = [f"spk{s:04d}/utt{first + i:09d}" for i, s in enumerate(speakers.tolist())]
    slots = iter(rng.permutation(n).tolist())  # each planted row its own position
    for _ in range(plants["duplicate_pairs"]):
        one, other = next(slots), next(slots)
        ids[other] = ids[one]
    for _ in range(plants["null_id"]):
        ids[next(slots)] = None
    for _ in range(plants["long_id"]):
        ids[next(slots)] = "spk9999/" + "u" * ID_MAX_CHARS
    with_ref = (rng.random(n) < ref_fraction).tolist()
    ref_ids = [f"spk{s:04d}" if r else None for s, r in zip(speakers.tolist(), with_ref)]
    ref_paths = [clips[s % 2] if r else None for s, r in zip(speakers.tolist(), with_ref)]
    for k in range(plants["conflict_rows"]):
        row = next(slots)
        ref_ids[row], ref_paths[row] = CONFLICT_REF, clips[k % 2]
    return pa.table(
        {
            "id": pa.array(ids, pa.string()),
            "text": _texts(rng, n),
            "speaker": pa.array([f"spk{s:04d}" for s in speakers.tolist()]).dictionary_encode(),
            "ref_id": pa.array(ref_ids, pa.string()),
            "ref_audio_path": pa.array(ref_paths, pa.string()),
        }
    )


def make(n: int, out: str, files: int, seed: int, ref_fraction: float) -> dict:
    """Write the input one file at a time (memory: one file's rows), planted rows spread
    over the files; returns the expected counts."""
    rng = np.random.default_rng(seed)
    os.makedirs(out, exist_ok=True)
    clips = _write_clips(out)
    counts = planted(n)
    per_file = -(-n // files)
    for k in range(files):
        first = k * per_file
        rows = min(per_file, n - first)
        if rows <= 0:
            break
        plants = {kind: _share(c, files, k) for kind, c in counts.items() if kind != "conflict_rows"}
        plants["conflict_rows"] = counts["conflict_rows"] if k == 0 else 0
        table = _file_table(rng, first, rows, plants, clips, ref_fraction)
        pq.write_table(table, os.path.join(out, f"part-{k:04d}.parquet"), row_group_size=ROW_GROUP_ROWS)
    rejected = {
        "duplicate_id": 2 * counts["duplicate_pairs"],
        "long_id": counts["long_id"],
        "null_id": counts["null_id"],
        "ref_id_conflict": counts["conflict_rows"],
    }
    expected = {"rows_total": n, "to_synthesize": n - sum(rejected.values()), "rejected": rejected}
    with open(os.path.join(out, "expected.json"), "w", encoding="utf-8") as f:
        json.dump(expected, f, indent=2)
    return expected


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("rows", type=int)
    parser.add_argument("out")
    parser.add_argument("--files", type=int, default=None, help="files to write (default: one per 250k rows, >= 4)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--ref-fraction", type=float, default=0.2)
    args = parser.parse_args(argv)
    files = args.files or max(4, -(-args.rows // 250_000))
    if args.rows < 20 * files:
        parser.error("rows must be >= 20 per file (room for every planted kind of bad row)")
    print(json.dumps(make(args.rows, args.out, files, args.seed, args.ref_fraction)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
