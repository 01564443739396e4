"""The actor's model-busy clock: seconds during which at least one piece of model work (an
engine step, a codec call) was running, the union of their intervals, so work that overlaps
(the engine feeder's and the finisher's threads) counts once."""

from __future__ import annotations

import contextlib
import threading
import time


class BusyClock:
    def __init__(self):
        self._lock = threading.Lock()
        self._active = 0
        self._since = 0.0
        self._total = 0.0

    @contextlib.contextmanager
    def busy(self):
        with self._lock:
            if self._active == 0:
                self._since = time.perf_counter()
            self._active += 1
        try:
            yield
        finally:
            with self._lock:
                self._active -= 1
                if self._active == 0:
                    self._total += time.perf_counter() - self._since

    def seconds(self) -> float:
        with self._lock:
            return self._total + (time.perf_counter() - self._since if self._active else 0.0)
