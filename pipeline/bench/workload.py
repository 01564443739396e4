"""The benchmark's generated workload: a seeded table of texts built from the demo's words,
a share of rows carrying one of the demo's real speech clips, a share of long texts."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from actors import schema as S

from ..config import REPO_ROOT

DEMO_TABLE = REPO_ROOT / "data" / "demo" / "demo.parquet"


def make_workload(
    path: Path,
    rows: int,
    text_words: float,
    reference_fraction: float,
    seed: int,
    long_fraction: float = 0.0,
    long_chars: int = 3000,
) -> None:
    """A seeded table of `rows` texts (lognormal word counts around `text_words`, words from
    the demo texts) where a `reference_fraction` share of rows carries one of the demo's real
    speech clips as bytes (rows naming the same clip share its `ref_id`), and a
    `long_fraction` share is long text: sentences of such words up to `long_chars` characters."""
    demo = pq.read_table(DEMO_TABLE).to_pylist()
    words = sorted({w.strip(".,!?") for r in demo for w in r[S.TEXT].split() if w.strip(".,!?")})
    refs = []
    for r in demo:
        if r.get(S.REF_AUDIO_PATH) and r.get(S.REF_TEXT):
            clip = (DEMO_TABLE.parent / r[S.REF_AUDIO_PATH]).read_bytes()
            if all(clip != c for c, _, _ in refs):
                refs.append((clip, r[S.REF_TEXT], Path(r[S.REF_AUDIO_PATH]).stem))
    rng = np.random.default_rng(seed)
    table = {S.ID: [], S.TEXT: [], S.REF_AUDIO: [], S.REF_TEXT: [], S.REF_ID: []}
    for i in range(rows):
        n = max(1, int(round(rng.lognormal(math.log(text_words), 0.5))))
        text = " ".join(rng.choice(words, n)).capitalize() + "."
        if long_fraction and rng.random() < long_fraction:
            sentences = []
            while sum(len(s) + 1 for s in sentences) < long_chars:
                sentences.append(" ".join(rng.choice(words, int(rng.integers(6, 16)))).capitalize() + ".")
            text = " ".join(sentences)[:long_chars].rstrip() + "."
        ref = refs[int(rng.integers(len(refs)))] if refs and rng.random() < reference_fraction else None
        table[S.ID].append(f"bench-{i:06d}")
        table[S.TEXT].append(text)
        table[S.REF_AUDIO].append(ref[0] if ref else None)
        table[S.REF_TEXT].append(ref[1] if ref else None)
        table[S.REF_ID].append(ref[2] if ref else None)
    pq.write_table(
        pa.table(
            table,
            schema=pa.schema(
                [
                    (S.ID, pa.string()),
                    (S.TEXT, pa.string()),
                    (S.REF_AUDIO, pa.binary()),
                    (S.REF_TEXT, pa.string()),
                    (S.REF_ID, pa.string()),
                ]
            ),
        ),
        path,
    )
