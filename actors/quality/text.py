"""Word and character error rates between a row's text and its transcript, after the text
normalisation ASR evaluations apply to both sides.

The normaliser follows the rules of Whisper's multilingual `BasicTextNormalizer` (the one the
Whisper paper and TTS evaluations such as Seed-TTS-eval run for non-English text, and a
subset of its English one): NFKC, case folded, text in [brackets] or (parentheses) dropped,
every punctuation mark and symbol (Unicode categories P* and S*) and every combining mark
(M*) replaced by a space, whitespace collapsed. The English normaliser's extra rules
(spelled-out numbers, British spellings, contractions) need its word lists and are left out:
both texts pass the same rules, so they cancel where they matter most.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence

import numpy as np

_BRACKETED = re.compile(r"\[[^\]]*\]|\([^)]*\)")


def normalize(text: str) -> str:
    text = _BRACKETED.sub(" ", unicodedata.normalize("NFKC", text).casefold())
    kept = (" " if unicodedata.category(c)[0] in "PSM" else c for c in text)
    return " ".join("".join(kept).split())


def edit_distance(reference: Sequence, hypothesis: Sequence) -> int:
    """Levenshtein distance (substitutions, insertions, deletions, each 1) between two token
    sequences. One numpy pass per reference token: within a row the insertion chain
    cur[j] = min(cur[j-1] + 1, ...) is a running minimum of cur[k] - k, plus j."""
    if not reference or not hypothesis:
        return len(reference) + len(hypothesis)
    vocabulary: dict = {}
    ref = np.array([vocabulary.setdefault(t, len(vocabulary)) for t in reference])
    hyp = np.array([vocabulary.setdefault(t, len(vocabulary)) for t in hypothesis])
    columns = np.arange(len(hyp) + 1)
    previous = columns.copy()
    for i, token in enumerate(ref, start=1):
        current = np.empty_like(previous)
        current[0] = i
        current[1:] = np.minimum(previous[1:] + 1, previous[:-1] + (hyp != token))
        current = np.minimum.accumulate(current - columns) + columns
        previous = current
    return int(previous[-1])


def word_error_rate(reference: str, hypothesis: str) -> float:
    """Edits between the normalised word sequences over the reference's words (may exceed 1;
    an empty reference gives 0 for an empty hypothesis, else 1)."""
    ref, hyp = normalize(reference).split(), normalize(hypothesis).split()
    return _rate(edit_distance(ref, hyp), len(ref), len(hyp))


def char_error_rate(reference: str, hypothesis: str) -> float:
    """Edits between the normalised texts' characters, spaces removed (the measure for
    languages written without spaces), over the reference's characters."""
    ref, hyp = normalize(reference).replace(" ", ""), normalize(hypothesis).replace(" ", "")
    return _rate(edit_distance(ref, hyp), len(ref), len(hyp))


def _rate(edits: int, reference_length: int, hypothesis_length: int) -> float:
    if reference_length == 0:
        return 0.0 if hypothesis_length == 0 else 1.0
    return edits / reference_length
