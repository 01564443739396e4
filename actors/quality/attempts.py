"""The attempt logic of the quality gate, as plain host code: each attempt's seed, whether an
attempt is rejected, and which of a row's attempts is kept.

A row (or one segment of a long row) that fails `quality.reject` is generated again with a new
seed, up to `quality.max_attempts` times; when every attempt fails the best one is kept and the
row is written as `rejected`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Sequence

from actors.quality.flags import FLAGS

SEED_MASK = (1 << 63) - 1  # seeds are stored as int64 (actors/synth.py)

# higher = worse; FLAGS lists the most severe first
_SEVERITY = {flag: len(FLAGS) - i for i, flag in enumerate(FLAGS)}


def attempt_seed(seed: int, attempt: int) -> int:
    """The seed attempt `attempt` (0-based) of a row or segment samples with.

    Attempt 0 is the seed itself, so a row that passes the gate first time has exactly the
    codes it had before the gate existed. Later attempts hash (seed, attempt): deterministic,
    a function of the row's own seed only (never of its batch, slot or actor), and unrelated
    between attempts, so a retry does not replay the stream that failed."""
    if attempt == 0:
        return seed
    digest = hashlib.blake2b(f"attempt\x00{seed}\x00{attempt}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & SEED_MASK


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
