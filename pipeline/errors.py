"""The driver's user errors: problems with the user's input, settings or output directory,
reported as one message naming the file, key or row and the fix, never as a traceback. A leaf."""

from __future__ import annotations

from actors.input_types import InputSchemaError
from actors.settings import ConfigError


class InputError(ValueError):
    """The input cannot be read as a table (no files, unreadable, wrong schema)."""


class OutputMismatch(RuntimeError):
    """The output directory holds rows of a different input or model, or is not chorus's."""


class OutputInUse(RuntimeError):
    """Another live driver holds the output directory's lease."""


# what the entry points print as a message (ConfigError: a setting; InputSchemaError: a column)
USER_ERRORS = (ConfigError, InputError, InputSchemaError, OutputMismatch, OutputInUse)

__all__ = ["USER_ERRORS", "ConfigError", "InputError", "InputSchemaError", "OutputInUse", "OutputMismatch"]
