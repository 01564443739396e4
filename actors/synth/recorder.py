"""The actor's test seam: a `Recorder` is told what happened (each engine step's blocks, each
row's segments), as `Engine.generate(observe=...)` is, so nothing test-only lives on the
production object. The base records nothing; `Trace` keeps what tests and debugging read."""

from __future__ import annotations

from collections import deque


class Recorder:
    def on_step(self, step: int, blocks: frozenset) -> None:
        """Engine step number `step` (over the actor's life) ran rows of these block numbers."""

    def on_row(self, row_id, segments: list, history: list) -> None:
        """A row's call returned: its segments as (engine step finished at, Result) in order,
        and how many previous segments each segment's prompt kept."""


class Trace(Recorder):
    """The last `max_steps` steps, and every row seen by id (the latest call wins): for tests and
    short debugging sessions, not for a run (it grows with the rows)."""

    def __init__(self, max_steps: int = 4096):
        self.steps: deque = deque(maxlen=max_steps)  # (step, frozenset of block numbers)
        self.segments: dict = {}
        self.history: dict = {}

    def on_step(self, step: int, blocks: frozenset) -> None:
        self.steps.append((step, blocks))

    def on_row(self, row_id, segments: list, history: list) -> None:
        self.segments[row_id] = segments
        self.history[row_id] = history
