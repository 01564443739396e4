"""`each_alone`: the one fallback for work done on a batch of items (a prefill group, codec
clips, output rows) when one bad item can make the whole call raise: the batch is run again
one item at a time, so the item that breaks it fails alone and the others come through.

Plain Python: the engine's scheduler and the Ray actor's parts both use it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Optional, TypeVar

T = TypeVar("T")
R = TypeVar("R")

log = logging.getLogger(f"chorus.{__name__}")  # one namespace: configuring "chorus" reaches every module


def each_alone(
    items: Sequence[T],
    work: Callable[[list[T]], Optional[Sequence[R]]],
    failed: Callable[[T, Exception], R],
    note: Optional[str] = None,
) -> list[Optional[R]]:
    """What `work(items)` returns (a list: one result per item, None each when it returns
    nothing; or one result standing for the whole batch, as a table of all rows). Should the
    batch raise, `work([item])` runs for every item by itself, and an item that raises
    alone gets `failed(item, error)` as its result. `note`: logged (with the batch's error)
    when the batch falls back."""
    batch = list(items)
    try:
        results = work(batch)
    except Exception as error:
        if note:
            log.warning("%s (%d items, %r); running each alone", note, len(batch), error)
        return [_alone(item, work, failed) for item in batch]
    return list(results) if results is not None else [None] * len(batch)


def _alone(item: T, work: Callable[[list[T]], Optional[Sequence[R]]], failed: Callable[[T, Exception], R]):
    try:
        results = work([item])
    except Exception as error:
        return failed(item, error)
    return results[0] if results is not None else None
