"""`python -m pipeline.bench bench=smoke|sweep|overhead output.dir=PATH [any run setting]`:
the end-to-end pipeline on a generated workload, once per (actors, slots) configuration of the
`bench` group (pipeline/bench/sweep.py); writes bench.json, bench.md and report.html under
output.dir. Nothing here imports torch: the actors do the work."""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig

from actors.cli import error

from ..config import CONF_DIR, typed
from .sweep import run_bench


@hydra.main(version_base=None, config_path=str(CONF_DIR), config_name="config")
def main(cfg: DictConfig) -> None:
    config = typed(cfg)  # the one conversion: below here the bench reads ChorusConfig
    if not config.bench.enabled:
        sys.exit(error("choose a benchmark: bench=smoke, bench=sweep or bench=overhead"))
    run_bench(config)


if __name__ == "__main__":
    main()
