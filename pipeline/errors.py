"""The driver's user errors: problems with the user's input, settings or output directory,
reported as one message naming the file, key or row and the fix, never as a traceback. A leaf."""

from __future__ import annotations

from actors.errors import ConfigError
from actors.input_types import InputSchemaError
from actors.storage import StoreError


def listed(names: list, shown: int = 5) -> str:
    """The first few of `names` for a message, and "..." when there are more."""
    return ", ".join(names[:shown]) + (", ..." if len(names) > shown else "")


class InputError(ValueError):
    """The input cannot be read as a table (no files, unreadable, wrong schema)."""


class OutputMismatch(RuntimeError):
    """The output directory holds rows of a different input or model, or is not chorus's."""


class OutputInUse(RuntimeError):
    """Another live driver holds the output directory's lease."""


class LeaseLost(RuntimeError):
    """This driver's lease could not be renewed in time, or was taken: it stopped launching work."""


class OutputFull(RuntimeError):
    """The output's filesystem has no space left for the next write."""


class Interrupted(KeyboardInterrupt):
    """A run stopped by Ctrl-C (or SIGTERM) while it streamed: `rows` were written by then, whole."""

    def __init__(self, rows: int):
        super().__init__(f"interrupted after {rows} rows")
        self.rows = rows


# what the entry points print as a message (ConfigError: a setting; InputSchemaError: a column;
# StoreError: an object store that refused a request or kept failing, naming the URI)
USER_ERRORS = (
    ConfigError,
    InputError,
    InputSchemaError,
    OutputMismatch,
    OutputInUse,
    LeaseLost,
    OutputFull,
    StoreError,
)

__all__ = [
    "USER_ERRORS",
    "ConfigError",
    "InputError",
    "InputSchemaError",
    "Interrupted",
    "LeaseLost",
    "OutputFull",
    "OutputInUse",
    "OutputMismatch",
    "StoreError",
]
