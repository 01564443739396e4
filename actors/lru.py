"""A least-recently-used map with a fixed capacity: what the actor's reference cache and the
engine's prompt-prefix cache keep."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from typing import Generic, Optional, TypeVar

V = TypeVar("V")


class LRU(Generic[V]):
    """get() and put() make an entry the most recent; a put beyond `capacity` drops the least
    recent. Capacity 0 keeps nothing."""

    def __init__(self, capacity: int):
        self.capacity = max(0, int(capacity))
        self.items: OrderedDict[str, V] = OrderedDict()

    def get(self, key: str) -> Optional[V]:
        if key in self.items:
            self.items.move_to_end(key)
            return self.items[key]
        return None

    def put(self, key: str, value: V) -> None:
        if self.capacity == 0:
            return
        self.items[key] = value
        self.items.move_to_end(key)
        while len(self.items) > self.capacity:
            self.items.popitem(last=False)

    def values(self) -> Iterator[V]:
        return iter(self.items.values())

    def __len__(self) -> int:
        return len(self.items)
