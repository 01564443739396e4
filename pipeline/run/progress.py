"""Progress of a run: rows done/total, rows/s, audio hours, errors, ETA.

On a terminal a tqdm bar; otherwise (a Ray Job's log, CI) one log line every
`interval_s`, written by a timer thread so that a line appears even while one long batch
is still running.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable
from typing import Optional

from ..report.markup import format_duration

log = logging.getLogger("chorus.progress")


class Progress:
    """`status()`, when given, adds what else happened to the line (nodes lost, retries)."""

    def __init__(
        self,
        total: int,
        already_done: int = 0,
        interval_s: float = 15.0,
        bar: str = "auto",
        status: Optional[Callable[[], str]] = None,
    ):
        self.total, self.already_done = total, already_done
        self.status = status
        self.rows = self.errors = 0
        self.audio_seconds = 0.0
        self.slot_rows = self.slot_steps = 0.0  # the engines' live rows and slots over their steps
        self.started = time.monotonic()
        self.interval_s = interval_s
        self._lock = threading.Lock()
        self._stop = threading.Event()
        use_bar = bar == "on" or (bar == "auto" and sys.stderr.isatty())
        self._bar = None
        self._ticker = None
        if use_bar:
            from tqdm import tqdm

            self._bar = tqdm(
                total=total, initial=already_done, unit="row", dynamic_ncols=True, desc="chorus", smoothing=0.1
            )
        elif interval_s > 0:
            self._ticker = threading.Thread(target=self._tick, name="chorus-progress", daemon=True)
            self._ticker.start()

    # -- numbers ---------------------------------------------------------------------
    @property
    def done(self) -> int:
        return self.already_done + self.rows

    def rate(self) -> float:
        elapsed = time.monotonic() - self.started
        return self.rows / elapsed if elapsed > 0 else 0.0

    def eta_seconds(self) -> Optional[float]:
        rate = self.rate()
        return (self.total - self.done) / rate if rate > 0 else None

    def occupancy(self) -> Optional[float]:
        """Mean share of the engines' slots holding a row per step, over the blocks so far."""
        return self.slot_rows / self.slot_steps if self.slot_steps else None

    def _slots_text(self) -> str:
        occupancy = self.occupancy()
        return "" if occupancy is None else f", slots {occupancy:.0%} full"

    def _status_text(self) -> str:
        said = self.status() if self.status is not None else ""
        return f", {said}" if said else ""

    def line(self) -> str:
        with self._lock:
            percent = 100.0 * self.done / self.total if self.total else 100.0
            return (
                f"{self.done}/{self.total} rows ({percent:.0f}%), {self.rate():.2f} rows/s, "
                f"{self.audio_seconds / 3600:.3f} h audio, {self.errors} errors{self._slots_text()}, "
                f"ETA {format_duration(self.eta_seconds())}{self._status_text()}"
            )

    # -- events ----------------------------------------------------------------------
    def update(
        self, rows: int, errors: int, audio_seconds: float, slot_rows: float = 0.0, slot_steps: float = 0.0
    ) -> None:
        with self._lock:
            self.rows += rows
            self.errors += errors
            self.audio_seconds += audio_seconds
            self.slot_rows += slot_rows
            self.slot_steps += slot_steps
        if self._bar is not None:
            self._bar.set_postfix_str(
                f"{self.audio_seconds / 3600:.3f} h audio, {self.errors} errors{self._slots_text()}", refresh=False
            )
            self._bar.update(rows)

    def _tick(self) -> None:
        while not self._stop.wait(self.interval_s):
            log.info("progress: %s", self.line())

    def close(self) -> None:
        self._stop.set()
        if self._bar is not None:
            self._bar.close()
        log.info("progress: %s", self.line())
