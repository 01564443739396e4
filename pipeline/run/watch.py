"""The driver's loop over the synthesis stream, kept awake: `watched` runs the run's checks every
second in a helper thread, so that they run even while no block arrives (a block can take
minutes), and stops the stream at once when a check raises -- a lost lease -- instead of after
the blocks already handed out.

The stream itself is iterated in the caller's (the main) thread, and is closed there on the way
out, whatever ends it: Ray Data shuts its execution down in that close (its scheduling thread
joined). Were the stream left running in another thread, the run's `ray.shutdown()` would free
Ray's core worker under Ray Data's scheduling thread, still inside `ray.wait`: a segfault
(exit 139) in about one Ctrl-C out of ten, measured on Ray 2.60.

A failed check reaches the main thread while it waits for the stream as a signal (SIGUSR1, sent
to that thread alone: it ends a blocked wait), raised there only while it waits; between items
it is raised before the next wait.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from typing import TypeVar

T = TypeVar("T")

WAKE = signal.SIGUSR1  # what a failed check interrupts the waiting main thread with


class _CheckFailed(BaseException):
    """Raised in the main thread by the wake handler; the failure itself is kept aside."""


def watched(items: Iterator[T], check: Callable[[], None], every_s: float = 1.0) -> Iterator[T]:
    """`items`, one at a time; `check()` runs every `every_s` in a helper thread, and what it
    raises ends the iteration (raised here). `items` is closed on the way out."""
    if threading.current_thread() is not threading.main_thread():
        yield from _checked_between(items, check)  # no signal handler outside the main thread
        return
    failed: list[BaseException] = []
    state = {"waiting": False, "closed": False}
    lock = threading.Lock()
    stop = threading.Event()
    main = threading.main_thread().ident

    def wake(signum, frame) -> None:
        if state["waiting"]:  # only inside the wait below: elsewhere the loop sees `failed` itself
            raise _CheckFailed

    def watch() -> None:
        while not stop.wait(every_s):
            try:
                check()
            except BaseException as e:  # handed to the main thread
                with lock:
                    failed.append(e)
                    if state["waiting"] and not state["closed"]:
                        signal.pthread_kill(main, WAKE)
                return

    iterator = iter(items)
    previous = signal.signal(WAKE, wake)
    try:
        check()
        threading.Thread(target=watch, name="chorus-checks", daemon=True).start()
        while True:
            with lock:
                if failed:
                    raise failed[0]
                state["waiting"] = True
            try:
                item = next(iterator)
            except StopIteration:
                return
            finally:
                state["waiting"] = False
            yield item
    except _CheckFailed:
        raise failed[0] from None
    finally:
        stop.set()
        with lock:
            state["closed"] = True
        _close(iterator)
        signal.signal(WAKE, previous)


def _checked_between(items: Iterator[T], check: Callable[[], None]) -> Iterator[T]:
    iterator = iter(items)
    try:
        for item in iterator:
            check()
            yield item
    finally:
        _close(iterator)


def _close(iterator) -> None:
    close = getattr(iterator, "close", None)
    if close is not None:
        close()
