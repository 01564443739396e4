"""Ctrl-C and a scheduler's stop, ended as one: SIGINT and SIGTERM raise KeyboardInterrupt in the
driver's thread, once. What the run holds is released on the way out (the read-ahead and the
stream stop, the lease is given back, the Ray this run started is shut down); signals that come
while that happens are let be, so the cleanup finishes -- unless the user insists (a third
signal ends the process at once, the lease left to go stale)."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Iterator

from . import exits

HARD_STOP_AFTER = 3  # signals: the third ends the process without its cleanup


@contextlib.contextmanager
def interruptible() -> Iterator[list[int]]:
    """Within the block, SIGINT and SIGTERM interrupt the work (KeyboardInterrupt); yields the
    signals received, so the caller can tell a Ctrl-C (130) from a SIGTERM (143)."""
    received: list[int] = []

    def handler(signum, frame) -> None:
        received.append(signum)
        if len(received) == 1:
            raise KeyboardInterrupt
        if len(received) >= HARD_STOP_AFTER:
            print("interrupted again: stopped without cleaning up", file=sys.stderr, flush=True)
            os._exit(status(received))

    previous = {number: signal.signal(number, handler) for number in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield received
    finally:
        for number, old in previous.items():
            signal.signal(number, old)


def status(received: list[int]) -> int:
    """130 for a Ctrl-C, 143 for a SIGTERM (the first signal decides)."""
    return exits.TERMINATED if received and received[0] == signal.SIGTERM else exits.INTERRUPTED
