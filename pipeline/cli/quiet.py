"""The log a user reads: chorus's lines on stderr with their time, and no line they cannot act on.

Every chorus logger is under `chorus` (one namespace to configure). Ray's own INFO chatter is
held at WARNING (pipeline/cluster.py starts Ray so). A few lines Ray prints on every run --
from its C++ core, which no logging setting reaches, or about a choice chorus made on purpose
-- are dropped from the process's stderr by a filter on its file descriptor (KNOWN_NOISE: each
line and why it is noise); everything else passes through unchanged, as it comes."""

from __future__ import annotations

import atexit
import logging
import os
import sys
import threading

FORMAT = "%(asctime)s %(levelname)s %(message)s"
DATE = "%H:%M:%S"
# loggers of the libraries below chorus, at WARNING: their INFO lines describe their machinery
LIBRARIES = ("ray", "hydra", "filelock", "urllib3", "botocore", "fsspec")

KNOWN_NOISE = (
    # Ray 2.60 turns token authentication on by default and says so at every start, though a
    # run's own local Ray needs nothing from the user (a cluster's token: README, The cluster)
    b"Token authentication is enabled for this Ray cluster",
    # core_worker.cc, at every actor pool: Ray Data passes its actors their context as object
    # references, and chorus's actors restart (cluster.max_actor_restarts): the notice is about
    # Ray Data's own arguments, which outlive the run's actors
    b"has constructor arguments in the object store and max_restarts > 0",
    # chorus turns Ray Data's bars off on purpose: its own progress counts rows, audio, errors
    b"Progress bars disabled. To enable, set",
    # task_manager.cc, when a stopped run shuts its Ray down with tasks still in flight
    b"Failed to push error to driver for task",
)


def quiet_logging(filter_stderr: bool, level: int = logging.INFO) -> None:
    """chorus's log on stderr at `level`, the libraries' at WARNING; with `filter_stderr`, Ray's
    known noise dropped from file descriptor 2 (the command line's process: not a caller's,
    such as a test's, whose stderr is its own). Idempotent."""
    root = logging.getLogger()
    if not any(getattr(h, "chorus", False) for h in root.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(FORMAT, DATE))
        handler.chorus = True
        root.addHandler(handler)
        root.setLevel(logging.WARNING)
    logging.getLogger("chorus").setLevel(level)
    for name in LIBRARIES:
        logging.getLogger(name).setLevel(logging.WARNING)
    # a Ray call from one of Ray Data's threads after a stopped run shut Ray down must fail, not
    # start a new local Ray that outlives the command (read when ray is first imported)
    os.environ.setdefault("RAY_ENABLE_AUTO_CONNECT", "0")
    if filter_stderr:
        StderrFilter.install()


class StderrFilter:
    """Lines of file descriptor 2 (this process's and Ray's forwarded worker output) minus
    KNOWN_NOISE, copied by a daemon thread to the original stderr. Pieces without a newline (a
    progress bar's `\\r` updates) pass at once."""

    installed = False

    @classmethod
    def install(cls) -> None:
        if cls.installed:
            return
        sys.stderr.flush()
        original = os.dup(2)
        read, write = os.pipe()
        os.dup2(write, 2)
        os.close(write)
        copier = threading.Thread(target=cls._copy, args=(read, original), name="chorus-stderr", daemon=True)
        copier.start()
        atexit.register(cls._restore, original, copier)
        cls.installed = True

    @staticmethod
    def _restore(original: int, copier: threading.Thread) -> None:
        """At exit: stderr back to the original, and the copier given a moment to pass on the
        last lines (it ends when no process holds the pipe any more)."""
        sys.stderr.flush()
        os.dup2(original, 2)
        copier.join(timeout=1.0)

    @staticmethod
    def _copy(read: int, out: int) -> None:
        pending = b""
        while True:
            chunk = os.read(read, 65536)
            if not chunk:
                break
            pending += chunk
            *lines, pending = pending.split(b"\n")
            kept = [line + b"\n" for line in lines if not any(noise in line for noise in KNOWN_NOISE)]
            if b"\r" in pending:  # a bar's update: show it now, keep only what follows its last \r
                head, _, pending = pending.rpartition(b"\r")
                kept.append(head + b"\r")
            if kept:
                os.write(out, b"".join(kept))
        if pending:
            os.write(out, pending)
