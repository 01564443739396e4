"""`python -m pipeline [settings]`: `chorus run [settings]` (pipeline/cli/)."""

from __future__ import annotations

import sys

from .cli import main

if __name__ == "__main__":
    args = sys.argv[1:]
    sys.exit(main(args if args[:1] == ["run"] else ["run", *args], filter_stderr=True))
