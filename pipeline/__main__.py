"""`python -m pipeline [group=option ...] [key=value ...]`: one synthesis run."""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig
from omegaconf.errors import MissingMandatoryValue

from actors.cli import error

from .config import CONF_DIR, typed
from .errors import USER_ERRORS
from .run.steps import run


@hydra.main(version_base=None, config_path=str(CONF_DIR), config_name="config")
def main(cfg: DictConfig) -> None:
    try:
        report = run(typed(cfg))  # the one conversion: below here the driver reads ChorusConfig
    except MissingMandatoryValue as e:
        sys.exit(error(f"missing mandatory value: {e.full_key}=..."))
    except USER_ERRORS as e:
        sys.exit(error(e))
    print(f"chorus: output written to {report.output} (summary: {report.output}/summary.json)", flush=True)


if __name__ == "__main__":
    # every key with its default, range and meaning, instead of Hydra's template (--hydra-help,
    # --cfg job and --info stay Hydra's)
    if {"--help", "-h"} & set(sys.argv[1:]):
        from .config_page import terminal_help

        print(terminal_help(), end="")
        sys.exit(0)
    main()
