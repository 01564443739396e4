"""The command-line style every chorus tool shares (`python -m actors.engine`, `actors.codec`,
`pipeline.report`, and the Hydra entry points `pipeline`, `pipeline.bench`, `pipeline.export`):
argparse with subcommands where a tool has several (Hydra overrides where a run config is
composed), results on stdout, and bad input reported on stderr as `error: ...` with exit
status 2, as argparse reports a bad argument. A traceback means a bug, never bad input."""

from __future__ import annotations

import argparse
import sys

BAD_INPUT = 2  # the exit status of a usage error (argparse's own)


def error(message: object) -> int:
    """Report bad input; returns the exit status for the command to return."""
    print(f"error: {message}", file=sys.stderr)
    return BAD_INPUT


def dispatch(args: argparse.Namespace, bad_input: tuple[type[BaseException], ...] = ()) -> int:
    """Run the chosen subcommand (`set_defaults(func=...)`); the exceptions in `bad_input`
    (a missing file, a corrupt checkpoint, ...) become `error: ...` and status 2."""
    try:
        return args.func(args)
    except bad_input as e:
        return error(e)
