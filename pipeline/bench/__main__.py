"""`python -m pipeline.bench bench=smoke|sweep|overhead|quality|dialogue [settings]`: `chorus bench`
(pipeline/cli/): the end-to-end pipeline on a generated workload, once per (actors, slots)
configuration of the `bench` group (pipeline/bench/sweep.py); writes bench.json, bench.md and
report.html under output.dir. Nothing here imports torch: the actors do the work."""

from __future__ import annotations

import sys

from ..cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", *sys.argv[1:]], filter_stderr=True))
