"""The attempt logic of the quality gate, as plain host code: whether an attempt is rejected,
whether another follows, and which of a row's attempts is kept. Each attempt's seed is the
chain's (actors/synth/chain.py::segment_seed: attempt 0 is the row's own seed, later ones a
hash of it and the attempt).

A row (or one segment of a long row) that fails `quality.reject` is generated again with a new
seed, up to `quality.max_attempts` times; when every attempt fails the best one is kept and the
row is written as `rejected`.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from actors.quality.settings import FLAGS

# higher = worse; FLAGS lists the most severe first
_SEVERITY = {flag: len(FLAGS) - i for i, flag in enumerate(FLAGS)}


def is_rejected(flags: Collection[str], reject: Collection[str]) -> bool:
    return any(flag in reject for flag in flags)


def severity_key(flags: Collection[str]) -> tuple[int, ...]:
    """Orders attempts best first: the one whose worst flag is least severe, then the next
    worst, ..., then the one with fewer flags (a strict prefix sorts first). An attempt with
    audio and a few flaws beats one without audio; no flags at all beats everything."""
    return tuple(sorted((_SEVERITY[flag] for flag in set(flags)), reverse=True))


def best_attempt(flags_per_attempt: Sequence[Collection[str]]) -> int:
    """The index of the attempt to keep: least severe flags, the earliest among equals (so
    the choice does not depend on how many attempts ran after it)."""
    if not flags_per_attempt:
        raise ValueError("best_attempt needs at least one attempt")
    return min(range(len(flags_per_attempt)), key=lambda i: (severity_key(flags_per_attempt[i]), i))


def should_retry(flags: Collection[str], reject: Collection[str], attempt: int, max_attempts: int) -> bool:
    """Whether attempt `attempt` (0-based), showing `flags`, is followed by another."""
    return is_rejected(flags, reject) and attempt + 1 < max_attempts
