"""A helper process of the actor's: a fresh interpreter (`python -m MODULE FD ARGS...`) serving
calls over a socket pair, one call at a time. The codec's child (codec_process.py) and each
process of the listen pool (listen_pool.py) are one.

A fresh interpreter, not multiprocessing's spawn or fork: spawn re-imports the parent's
__main__, which in a Ray worker or a script is nothing a helper should run, and fork copies a
process holding threads and, on a GPU, a CUDA context. The child exits when the pipe closes
(its actor exited or was killed). A child that died is started again on the next call; the
call that found it dead raises, and its caller decides what fails (its rows, as retryable).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from multiprocessing.connection import Connection
from typing import Any, Optional

# the children's scheduling priority below the engine's: on a CPU node the engine loop is what
# the node is for, and a child's work waits in a queue at no cost while the engine has the cores
# (demo, 1 actor x 16 slots on 2 vCPUs, Sapphire Rapids: vs_engine_only 0.82 at 10 against
# 0.77 at 0, the codec's child busy 0.75-0.9 of a core either way; SCHED_IDLE measured the same
# as 10). When the engine has no rows, the children have the CPU: the work is the same, only its
# order changes
NICENESS = 10
READY = "ready"


def serve(conn: Connection, methods: Mapping[str, Callable[..., Any]], after_call: Callable[[], Any] = lambda: None):
    """The child's side: answer ("ok", value) or ("error", text) to each (method, args, kwargs)
    until the parent closes the pipe. Call it once the child is ready to serve."""
    conn.send((READY, None))
    while True:
        try:
            method, args, kwargs = conn.recv()
        except (EOFError, OSError):  # the actor is gone
            return
        try:
            if method not in methods:
                raise ValueError(f"unknown method {method!r}")
            conn.send(("ok", methods[method](*args, **kwargs)))
        except Exception as e:  # the caller decides what fails: report, keep serving
            conn.send(("error", f"{type(e).__name__}: {e}"))
        after_call()


def child_connection(fd: str) -> Connection:
    """In the child: its end of the pipe (argv's FD), at NICENESS."""
    os.nice(NICENESS)
    return Connection(int(fd))


class ChildProcess:
    """`python -m module fd *args` as a helper, called with `call(method, ...)`. One call at a
    time (callers' threads take turns); started at once, and again on the call after it died."""

    def __init__(self, module: str, args: Sequence[str] = (), env: Optional[Mapping[str, str]] = None, name: str = ""):
        self._module, self._args = module, [str(a) for a in args]
        self._env = dict(env or {})  # over the actor's own environment
        self.name = name or module
        self._lock = threading.Lock()
        self._conn: Optional[Connection] = None
        self._process: Optional[subprocess.Popen] = None
        self._start()

    def _start(self) -> None:
        self._stop()  # a dead child's connection and process go before a new one starts
        ours, theirs = socket.socketpair()
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p), **self._env)
        self._process = subprocess.Popen(
            [sys.executable, "-m", self._module, str(theirs.fileno()), *self._args],
            pass_fds=[theirs.fileno()],
            env=env,
        )
        theirs.close()
        self._conn = Connection(ours.detach())
        try:
            kind, _ = self._conn.recv()  # EOFError if the child could not start
        except (EOFError, OSError) as e:
            self._stop()
            raise RuntimeError(f"{self.name} did not start: {e!r}") from None
        if kind != READY:
            raise RuntimeError(f"{self.name} did not start: {kind}")

    @property
    def pid(self) -> Optional[int]:
        return None if self._process is None else self._process.pid

    def call(self, method: str, *args, **kwargs) -> Any:
        with self._lock:
            if self._process is None or self._process.poll() is not None:
                self._start()
            try:
                self._conn.send((method, args, kwargs))
                kind, value = self._conn.recv()
            except (EOFError, OSError) as e:
                exitcode = self._process.poll()
                self._stop()  # started again on the next call
                raise RuntimeError(f"{self.name} died (exit code {exitcode}): {e!r}") from None
        if kind != "ok":
            raise RuntimeError(f"{self.name}: {value}")
        return value

    def close(self) -> None:
        with self._lock:
            self._stop()

    def _stop(self) -> None:
        if self._conn is not None:
            self._conn.close()  # the child's recv sees EOF and returns
            self._conn = None
        if self._process is not None:
            try:
                self._process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
            self._process = None
