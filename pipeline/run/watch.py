"""The driver's loop over the synthesis stream, kept awake: `watched` pulls the stream's items
in a helper thread, so that the driver's own thread runs its checks every second even while no
block arrives (a block can take minutes), and stops the run at once when a check raises -- a
lost lease -- instead of after the blocks already handed out."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from typing import TypeVar

T = TypeVar("T")

_ITEM, _ERROR, _END = "item", "error", "end"


def watched(items: Iterator[T], check: Callable[[], None], every_s: float = 1.0) -> Iterator[T]:
    """`items`, one at a time (the helper thread holds at most one ahead); `check()` runs before
    each and every `every_s` while waiting, and what it raises ends the iteration. The helper
    thread is a daemon: a stream abandoned mid-block ends with the process."""
    box: queue.Queue = queue.Queue(maxsize=1)
    stop = threading.Event()

    def hand_over(kind: str, value) -> None:
        while not stop.is_set():
            try:
                box.put((kind, value), timeout=every_s)
                return
            except queue.Full:
                continue

    def pull() -> None:
        try:
            for item in items:
                hand_over(_ITEM, item)
                if stop.is_set():
                    return
            hand_over(_END, None)
        except BaseException as e:  # handed to the driver's thread, which raises it
            hand_over(_ERROR, e)

    threading.Thread(target=pull, name="chorus-stream", daemon=True).start()
    try:
        while True:
            check()
            try:
                kind, value = box.get(timeout=every_s)
            except queue.Empty:
                continue
            if kind == _ERROR:
                raise value
            if kind == _END:
                return
            yield value
    finally:
        stop.set()
