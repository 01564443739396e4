"""The benchmark's generated workload: a seeded table of texts built from the demo's words,
a share of rows carrying one of the demo's real speech clips, a share of long texts, a share of
dialogues (two or three of the demo's voices taking two to four turns), and the same dialogues
as single-voice rows (what a dialogue's per-turn segments cost against them)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from actors import schema as S

# from the Hydra-free leaf: scripts/gpu_job.py makes its rows with this module on an image
# without Hydra
from ..shipped import DEMO_DIR

DEMO_TABLE = DEMO_DIR / "demo.parquet"
VOICE_TYPE = pa.struct([(S.VOICE_AUDIO, pa.binary()), (S.VOICE_TEXT, pa.string())])
SCHEMA = pa.schema(
    [
        (S.ID, pa.string()),
        (S.TEXT, pa.string()),
        (S.REF_AUDIO, pa.binary()),
        (S.REF_TEXT, pa.string()),
        (S.REF_ID, pa.string()),
        (S.VOICES, pa.list_(VOICE_TYPE)),
    ]
)


def _demo_words_and_clips() -> tuple[list[str], list[tuple[bytes, str, str]]]:
    """The demo's sentences' words (not its dialogues': their speaker tags are no words), and
    its distinct clips as (bytes, transcript, name)."""
    demo = [r for r in pq.read_table(DEMO_TABLE).to_pylist() if not r.get(S.VOICES)]
    words = sorted({w.strip(".,!?") for r in demo for w in r[S.TEXT].split() if w.strip(".,!?")})
    refs = []
    for r in demo:
        if r.get(S.REF_AUDIO_PATH) and r.get(S.REF_TEXT):
            clip = (DEMO_TABLE.parent / r[S.REF_AUDIO_PATH]).read_bytes()
            if all(clip != c for c, _, _ in refs):
                refs.append((clip, r[S.REF_TEXT], Path(r[S.REF_AUDIO_PATH]).stem))
    return words, refs


def _sentence(rng, words: list[str], n: int) -> str:
    return " ".join(rng.choice(words, n)).capitalize() + "."


def _dialogue(rng, words: list[str], refs: list, text_words: float) -> tuple[str, list]:
    """Two or three of the clips as voices, two to four turns of them (each lognormal words)."""
    voices = [refs[i] for i in rng.choice(len(refs), int(rng.integers(2, min(3, len(refs)) + 1)), replace=False)]
    turns = []
    for _ in range(int(rng.integers(2, 5))):
        n = max(1, int(round(rng.lognormal(math.log(text_words), 0.5))))
        turns.append(f"<|speaker:{int(rng.integers(len(voices)))}|>{_sentence(rng, words, n)}")
    return "".join(turns), voices


def make_workload(
    path: Path,
    rows: int,
    text_words: float,
    reference_fraction: float,
    seed: int,
    long_fraction: float = 0.0,
    long_chars: int = 3000,
    dialogue_fraction: float = 0.0,
    single_voice: bool = False,
) -> None:
    """A seeded table of `rows` texts (lognormal word counts around `text_words`, words from
    the demo texts) where a `reference_fraction` share of rows carries one of the demo's real
    speech clips as bytes (rows naming the same clip share its `ref_id`), a `long_fraction`
    share is long text (sentences of such words up to `long_chars` characters) and a
    `dialogue_fraction` share are dialogues (`voices`: the clips as bytes). `single_voice`: the
    same seed's table with each dialogue as a plain row of the same text and its first voice."""
    words, refs = _demo_words_and_clips()
    rng = np.random.default_rng(seed)
    table = {name: [] for name in SCHEMA.names}
    for i in range(rows):
        n = max(1, int(round(rng.lognormal(math.log(text_words), 0.5))))
        text, voices = _sentence(rng, words, n), None
        if long_fraction and rng.random() < long_fraction:
            sentences = []
            while sum(len(s) + 1 for s in sentences) < long_chars:
                sentences.append(_sentence(rng, words, int(rng.integers(6, 16))))
            text = " ".join(sentences)[:long_chars].rstrip() + "."
        if dialogue_fraction and refs and rng.random() < dialogue_fraction:
            text, voices = _dialogue(rng, words, refs, text_words)
        ref = refs[int(rng.integers(len(refs)))] if refs and rng.random() < reference_fraction else None
        if voices and single_voice:
            ref, voices = voices[0], None
        elif voices:
            ref = None
        table[S.ID].append(f"bench-{i:06d}")
        table[S.TEXT].append(text)
        table[S.REF_AUDIO].append(ref[0] if ref else None)
        table[S.REF_TEXT].append(ref[1] if ref else None)
        table[S.REF_ID].append(ref[2] if ref else None)
        table[S.VOICES].append([{S.VOICE_AUDIO: c, S.VOICE_TEXT: t} for c, t, _ in voices] if voices else None)
    pq.write_table(pa.table(table, schema=SCHEMA), path)
