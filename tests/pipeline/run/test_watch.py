"""The driver's loop over the stream (pipeline/run/watch.py): the checks run while the stream
blocks, a failed check or a Ctrl-C ends a wait that would last for ever, and the stream is
closed in the main thread before the error leaves -- what keeps Ray Data's threads out of Ray
when the run then shuts Ray down."""

from __future__ import annotations

import queue
import signal
import threading
import time

import pytest

from pipeline.cli.interrupt import interruptible
from pipeline.run.watch import watched


class Stream:
    """A stream that hands out `ready` items, then blocks on an empty queue (no timeout) as a
    stream waiting for a block does, until a signal ends the wait (or `release`, which a test
    calls only to fail instead of hanging); `closed` once its generator's finally ran."""

    def __init__(self, ready: int):
        self.ready, self.closed, self.blocked = ready, threading.Event(), threading.Event()
        self.waiting: queue.Queue = queue.Queue()

    def __iter__(self):
        try:
            yield from range(self.ready)
            self.blocked.set()
            yield self.waiting.get()
        finally:
            self.closed.set()

    def release_after(self, seconds: float) -> None:
        threading.Timer(seconds, self.waiting.put, args=("released: the wait was never ended",)).start()


def test_every_item_once_checked_from_the_start_then_the_stream_is_closed():
    calls, closed = [], threading.Event()

    def finite():
        try:
            yield from range(5)
        finally:
            closed.set()

    assert list(watched(finite(), lambda: calls.append(1))) == [0, 1, 2, 3, 4]
    assert calls and closed.is_set()


def test_a_check_that_fails_while_the_stream_blocks_ends_the_wait():
    stream = Stream(2)
    began = time.monotonic()

    def check():
        if stream.blocked.is_set() and time.monotonic() - began > 0.3:
            raise RuntimeError("the lease was lost")

    got = []
    stream.release_after(30)
    with pytest.raises(RuntimeError, match="the lease was lost"):
        for item in watched(iter(stream), check, every_s=0.1):
            got.append(item)
    assert got == [0, 1]  # not the release's item: the failed check ended the wait
    assert time.monotonic() - began < 5
    assert stream.closed.is_set()  # closed before the error left


def test_a_check_that_fails_between_items_is_raised_at_the_next_wait_not_in_the_body():
    failing = threading.Event()
    finished_bodies = []

    def check():
        if failing.is_set():
            raise RuntimeError("stop")

    with pytest.raises(RuntimeError, match="stop"):
        for item in watched(iter(range(10)), check, every_s=0.05):
            failing.set()
            time.sleep(0.3)  # the helper fails meanwhile: the body is not interrupted
            finished_bodies.append(item)
    assert finished_bodies == [0]


def test_ctrl_c_while_the_stream_blocks_closes_it_first():
    stream = Stream(1)
    main = threading.main_thread().ident

    def press_ctrl_c():
        stream.blocked.wait(10)
        time.sleep(0.2)
        signal.pthread_kill(main, signal.SIGINT)

    threading.Thread(target=press_ctrl_c, daemon=True).start()
    stream.release_after(30)
    # chorus's own Ctrl-C handler (a process started in the background may inherit SIGINT ignored)
    with pytest.raises(KeyboardInterrupt), interruptible():
        for item in watched(iter(stream), lambda: None, every_s=0.1):
            assert item == 0, item
    assert stream.closed.is_set()
    assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL  # the wake handler is gone again
