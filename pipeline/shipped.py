"""Where the folders chorus ships are: the YAML groups and the demo's tables and clips, inside
the installed wheel (pyproject.toml's package-dir maps the checkout's conf/ and data/demo/
there) or in the checkout. A leaf without Hydra, so code that runs where Hydra is absent
(scripts/gpu_job.py makes its rows with pipeline/bench/workload.py) finds them too."""

from __future__ import annotations

from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
REPO_ROOT = PACKAGE_DIR.parent  # the checkout, or the site-packages folder of an installed wheel


def _shipped(packaged: str, checkout: str) -> Path:
    """A folder the wheel ships inside this package, else the checkout's own."""
    installed = PACKAGE_DIR / packaged
    return installed if installed.is_dir() else REPO_ROOT / checkout


CONF_DIR = _shipped("_conf", "conf")  # the YAML groups
DEMO_DIR = _shipped("_demo", "data/demo")  # the demo's tables and clips
