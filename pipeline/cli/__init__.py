"""`chorus`, the one command (the console script of the chorus-tts distribution; `python -m
pipeline` is `chorus run`, and each `python -m pipeline.<tool>` its subcommand):

    chorus run [group=option ...] [key=value ...]      synthesize; rerun to resume
    chorus preview [settings]                           what a run would do, nothing written
    chorus bench bench=smoke|sweep|... [settings]       the end-to-end benchmark
    chorus export OUTPUT_DIR [export.format=...]         the rows for training stacks
    chorus report OUTPUT_DIR [report.title=...]          (re)write report.html
    chorus encode-refs OUT.parquet [settings]           the input with its clips encoded
    chorus config [settings]                            the composed configuration

One parser (parse.py), one syntax (key=value), `--help` for each command with the values that
invocation would use (help.py), every mistake one line and exit status 2, and the exit
statuses a scheduler can read (exits.py). The work's modules load only once the settings are
checked, so `--help` and refusals start nothing.
"""

from __future__ import annotations

import difflib
import logging
import sys
from typing import Optional

from ..errors import USER_ERRORS, Interrupted
from . import exits
from .commands import BY_NAME, COMMANDS, Subcommand
from .compose import compose_invocation, typed_config
from .help import command_help, overview
from .interrupt import interruptible, status
from .parse import HELP_FLAGS, parse
from .quiet import quiet_logging

log = logging.getLogger("chorus")


def console() -> int:
    """The `chorus` console script (and `python -m pipeline[.tool]`): main() on this process's
    arguments, Ray's known noise dropped from its stderr (quiet.py)."""
    return main(sys.argv[1:], filter_stderr=True)


def main(argv: Optional[list[str]] = None, filter_stderr: bool = False) -> int:
    """`chorus <command> [settings]`; returns the exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in HELP_FLAGS:
        if argv:
            sys.stdout.write(overview())
            return exits.OK
        return exits.refused(f"choose a command: {', '.join(c.name for c in COMMANDS)} (chorus --help)")
    name, args = argv[0], argv[1:]
    command = BY_NAME.get(name)
    if command is None:
        guess = difflib.get_close_matches(name, list(BY_NAME), n=1)
        meant = f" (did you mean {guess[0]}?)" if guess else ""
        return exits.refused(f"unknown command {name!r}{meant}; the commands: {', '.join(BY_NAME)}")
    return run_command(command, args, filter_stderr)


def run_command(command: Subcommand, args: list[str], filter_stderr: bool = False) -> int:
    """One subcommand: settings parsed, composed and checked (each mistake one line, exit 2),
    then its work, which ends in an exit status of the contract (exits.py)."""
    try:
        invocation = parse(command, args)
        composed = compose_invocation(invocation)
        if invocation.help:
            sys.stdout.write(command_help(command, composed))
            return exits.OK
        config = typed_config(invocation, composed)
    except USER_ERRORS as e:
        return exits.refused(e)
    quiet_logging(filter_stderr)
    with interruptible() as received:
        try:
            return command.run(config)
        except KeyboardInterrupt as e:
            rows = e.rows if isinstance(e, Interrupted) else 0
            print(f"interrupted after {rows} rows; rerun the same command to resume", file=sys.stderr, flush=True)
            return status(received)
        except exits.STOPPED_BY as e:
            return exits.stopped(e)
        except USER_ERRORS as e:
            if getattr(e, "at_work", False):
                return exits.stopped(e)
            return exits.refused(e)
