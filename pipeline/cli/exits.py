"""chorus's exit statuses, a contract a scheduler can branch on (docs/operations.md, "Exit
statuses"), and the one line each failure prints.

    0    done: every row of the output ok (or of a status output.fail_on leaves out)
    1    a bug: chorus itself failed (the only case that prints a traceback)
    2    refused before any work: a setting, the input or the output is wrong; the line names
         the key, row, file or path and the fix; nothing was written
    3    done, but rows of the output ended with a status in output.fail_on (default error and
         rejected): summary.json counts them; output.fail_on=[] makes such a run exit 0
    4    stopped during the work by what lies beneath it (the lease lost, the disk full, an
         object store that kept failing); what was written is whole: rerun to resume
    130  interrupted (Ctrl-C, SIGINT); 143: terminated (SIGTERM); parts whole, the lease
         released: rerun the same command to resume
"""

from __future__ import annotations

import signal

from actors.cli import BAD_INPUT, error

from ..errors import LeaseLost, OutputFull

OK = 0
BUG = 1
REFUSED = BAD_INPUT  # 2, argparse's status for a usage error
ROWS_FAILED = 3
STOPPED = 4
INTERRUPTED = 128 + signal.SIGINT  # 130, the shell's status for a Ctrl-C
TERMINATED = 128 + signal.SIGTERM  # 143

# errors that end a run already at work: the infrastructure stopped it, not the user's input (an
# object store's StoreError is one too when the run marked it `at_work`: pipeline/run/steps.py)
STOPPED_BY = (LeaseLost, OutputFull)


def refused(message: object) -> int:
    """Print `error: message` (one line) and return the refusal's status."""
    return error(one_line(message))


def stopped(message: object) -> int:
    """Print `error: message` for a run stopped at work, and return its status."""
    error(one_line(message))
    return STOPPED


def one_line(message: object) -> str:
    """A message as one line: a multi-line library message keeps its first line and the
    lines that name the key (OmegaConf's `full_key: ...`)."""
    lines = [line.strip() for line in str(message).splitlines() if line.strip()]
    if not lines:
        return type(message).__name__
    kept = [lines[0]] + [line for line in lines[1:] if line.startswith("full_key:")]
    return "; ".join(kept)
