"""`python -m pipeline [group=option ...] [key=value ...]`: one synthesis run."""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig
from omegaconf.errors import MissingMandatoryValue

from actors.cli import error
from actors.schema import InputSchemaError

from .config import CONF_DIR
from .inputs import InputError
from .lease import OutputInUse
from .output import OutputMismatch
from .plan import ConfigError, run

# problems with the user's input or settings: a message, not a traceback
USER_ERRORS = (ConfigError, InputError, InputSchemaError, OutputMismatch, OutputInUse)


@hydra.main(version_base=None, config_path=str(CONF_DIR), config_name="config")
def main(cfg: DictConfig) -> None:
    try:
        report = run(cfg)
    except MissingMandatoryValue as e:
        sys.exit(error(f"missing mandatory value: {e.full_key}=..."))
    except USER_ERRORS as e:
        sys.exit(error(e))
    print(f"chorus: output written to {report.output} (summary: {report.output}/summary.json)", flush=True)


if __name__ == "__main__":
    main()
