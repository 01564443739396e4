"""Write an N-row finished chorus output without synthesis, for the export's scale test and bench.

    .venv/bin/python scripts/make_scale_output.py N OUT [--clips K] [--seed S]

The rows are the scale generator's (scripts/make_scale_input.py: `speaker/utt` ids over 2,000
speakers, corpus-like texts), each given one of K short FLAC clips (distinct tones, so Parquet
cannot fold the audio), a status (97% ok, 2% rejected, 1% error) and quality values; written as
shards of 50,000 rows (row groups of 4,096) with the marker and summary.json a run's end leaves,
so `python -m pipeline.export` takes it as a finished output.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from make_scale_input import SPEAKERS, _texts  # noqa: E402

from actors import schema as S  # noqa: E402
from pipeline.names import DATA_DIR, IDENTITY_FILE, SUMMARY_FILE, shard_name  # noqa: E402
from pipeline.output import hf_features  # noqa: E402
from pipeline.output.reading import conform  # noqa: E402

SHARD_ROWS = 50_000
ROW_GROUP_ROWS = 4_096
RATE = 44_100


def clips(count: int, seconds: float = 0.05) -> list[bytes]:
    import soundfile as sf

    t = np.arange(int(seconds * RATE)) / RATE
    out = []
    for k in range(count):
        buffer = io.BytesIO()
        sf.write(buffer, 0.3 * np.sin(2 * np.pi * (150.0 + 7.0 * k) * t), RATE, format="FLAC", subtype="PCM_16")
        out.append(buffer.getvalue())
    return out


def shard_table(rng: np.random.Generator, first: int, n: int, pool: list[bytes]) -> pa.Table:
    speakers = rng.integers(0, SPEAKERS, size=n)
    status = rng.choice([S.STATUS_OK, S.STATUS_REJECTED, S.STATUS_ERROR], size=n, p=[0.97, 0.02, 0.01])
    picks = rng.integers(0, len(pool), size=n)
    ok = status != S.STATUS_ERROR
    audio = [{S.AUDIO_BYTES: pool[p], S.AUDIO_PATH: None} if good else None for p, good in zip(picks, ok)]
    columns = {
        S.ID: [f"spk{s:04d}/utt{first + i:09d}" for i, s in enumerate(speakers.tolist())],
        S.STATUS: status.tolist(),
        S.AUDIO: pa.array(audio, S.AUDIO_TYPE),
        S.SAMPLE_RATE: pa.array(np.where(ok, RATE, 0).tolist(), pa.int32()),
        S.AUDIO_SECONDS: np.where(ok, 0.05, 0.0),
        S.TEXT: _texts(rng, n),
        S.SPEAKER: [f"spk{s:04d}" for s in speakers.tolist()],
        S.RUN: ["scale"] * n,
        S.MOS: rng.uniform(2.0, 4.5, size=n),
        S.SPEAKER_SIMILARITY: rng.uniform(0.7, 1.0, size=n),
        S.WER: rng.uniform(0.0, 0.5, size=n),
    }
    table = pa.table(columns)
    return hf_features.with_features(conform(table), RATE)


def make(n: int, out: str, clip_count: int = 64, seed: int = 0) -> dict:
    """Write the output one shard at a time (memory: one shard's rows); returns its counts."""
    rng = np.random.default_rng(seed)
    pool = clips(clip_count)
    os.makedirs(os.path.join(out, DATA_DIR), exist_ok=True)
    counts = {S.STATUS_OK: 0, S.STATUS_REJECTED: 0, S.STATUS_ERROR: 0}
    for k, first in enumerate(range(0, n, SHARD_ROWS)):
        table = shard_table(rng, first, min(SHARD_ROWS, n - first), pool)
        for status, count in zip(*np.unique(table.column(S.STATUS).to_numpy(zero_copy_only=False), return_counts=True)):
            counts[str(status)] += int(count)
        path = os.path.join(out, DATA_DIR, shard_name([f"scale-{k}"]))
        no_dictionary = [c for c in table.column_names if c != S.AUDIO]  # the clips' bytes stay apart
        pq.write_table(table, path, row_group_size=ROW_GROUP_ROWS, use_dictionary=no_dictionary)
    with open(os.path.join(out, IDENTITY_FILE), "w", encoding="utf-8") as f:
        json.dump({"model": "scale", "checkpoint": None}, f)
    with open(os.path.join(out, SUMMARY_FILE), "w", encoding="utf-8") as f:
        json.dump({"rows_total": n}, f)
    return {"rows": n, **counts}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("rows", type=int)
    parser.add_argument("out")
    parser.add_argument("--clips", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    print(json.dumps(make(args.rows, args.out, args.clips, args.seed)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
