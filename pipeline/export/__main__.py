"""`python -m pipeline.export [settings]`: `chorus export [settings]` (pipeline/cli/)."""

from __future__ import annotations

import sys

from ..cli import main

if __name__ == "__main__":
    sys.exit(main(["export", *sys.argv[1:]], filter_stderr=True))
