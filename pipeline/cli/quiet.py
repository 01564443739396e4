"""The log a user reads: chorus's lines on stderr with their time, and nothing they cannot act on.

Every chorus logger is under `chorus` (one namespace to configure). Ray's and Hydra's own
chatter is held at WARNING; what Ray prints that a chorus run can do nothing about is switched
off where Ray offers a switch (its environment variables, read when Ray starts)."""

from __future__ import annotations

import logging
import os
import sys

FORMAT = "%(asctime)s %(levelname)s %(message)s"
DATE = "%H:%M:%S"
# loggers of the libraries below chorus, at WARNING: their INFO lines describe their machinery
LIBRARIES = ("ray", "hydra", "filelock", "urllib3", "botocore", "fsspec")


def quiet_logging(level: int = logging.INFO) -> None:
    """chorus's log on stderr at `level`; the libraries' at WARNING (idempotent)."""
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
    for variable, value in RAY_ENVIRONMENT.items():
        os.environ.setdefault(variable, value)


# Ray reads these when it starts (the driver's, and through the raylet its workers')
RAY_ENVIRONMENT: dict[str, str] = {}
