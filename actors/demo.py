"""Where chorus caches what it builds or reads once per machine: the built-in demo models
(actors/synth/demo_models.py builds them) and the driver's file hashes. A leaf: the driver
and the actor both import it, and it imports nothing of either."""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "CHORUS_CACHE"


def cache_root() -> Path:
    """$CHORUS_CACHE (of this process), else ~/.cache/chorus."""
    configured = os.environ.get(CACHE_ENV)
    return Path(configured).expanduser() if configured else Path.home() / ".cache" / "chorus"
