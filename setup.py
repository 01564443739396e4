"""The packages of the chorus-tts distribution (the rest of its metadata: pyproject.toml).

The checkout's conf/ (the YAML groups) and data/demo/ (the demo's tables and clips) are
installed inside the driver's package, as pipeline/_conf and pipeline/_demo, so that an
installed wheel runs from any directory: pipeline/config.py looks there first, then in the
checkout. pyproject.toml cannot list packages whose folders lie elsewhere beside the ones it
finds, hence this file."""

from pathlib import Path

from setuptools import find_packages, setup

SHIPPED = {"pipeline._conf": "conf", "pipeline._demo": "data/demo"}


def shipped_packages() -> dict[str, str]:
    """Each shipped folder and its sub-folders as packages of data (setuptools wants every
    folder of a wheel's data to be one)."""
    found = {}
    for package, folder in SHIPPED.items():
        found[package] = folder
        for sub in sorted(p for p in Path(folder).rglob("*") if p.is_dir() and not p.name.startswith((".", "_"))):
            found[".".join([package, *sub.relative_to(folder).parts])] = sub.as_posix()
    return found


PACKAGE_DIRS = shipped_packages()
setup(packages=find_packages(include=["actors*", "pipeline*"]) + list(PACKAGE_DIRS), package_dir=PACKAGE_DIRS)
