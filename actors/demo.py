"""Where chorus caches what it builds or reads once per machine: the built-in demo models
(actors/synth/demo_models.py builds them) and the driver's file hashes. A leaf: the driver
and the actor both import it, and it imports nothing of either."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

CACHE_ENV = "CHORUS_CACHE"


def cache_dir_from_environment() -> Optional[str]:
    """$CHORUS_CACHE as this process has it (None when unset or empty): what a driver passes on
    to its actors as model.cache_dir."""
    return os.environ.get(CACHE_ENV) or None


def cache_root() -> Path:
    """$CHORUS_CACHE (of this process), else ~/.cache/chorus."""
    configured = cache_dir_from_environment()
    return Path(configured).expanduser() if configured else Path.home() / ".cache" / "chorus"
