"""`python -m pipeline.report OUTPUT_DIR [settings]`: `chorus report` (pipeline/cli/)."""

from __future__ import annotations

import sys

from ..cli import main

if __name__ == "__main__":
    sys.exit(main(["report", *sys.argv[1:]], filter_stderr=True))
