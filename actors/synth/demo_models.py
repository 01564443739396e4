"""The built-in demo models: a tiny random checkpoint in the S1 format (model=demo) or the S2
format (model=demo_s2: the chat prompt, several voices per row) and a tiny codec that agrees
with both (10 codebooks of 128), built on first use into a cache directory.

Several actors may start at once on one machine, so the build runs under a file lock and
lands by renaming a finished temporary directory: a reader sees a complete build or none.
The directory name carries a fingerprint of the builders' source, so a change to the tiny
formats builds afresh instead of loading a stale cache. (In synth/, above the engine and the
codec whose builders it calls; the cache directory itself is actors/demo.py's.)
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path

from filelock import FileLock

from actors.demo import cache_root

DEMO_VERSION = "1"
NUM_CODEBOOKS = 10
CODEBOOK_SIZE = 128
MODEL_DIR = "model"
CODEC_DIR = "codec"


def _builders_fingerprint() -> str:
    from actors.codec import tiny as codec_tiny
    from actors.engine import tiny as engine_tiny

    digest = hashlib.blake2b(digest_size=6)
    for module in (engine_tiny, codec_tiny):
        digest.update(Path(module.__file__).read_bytes())
    return digest.hexdigest()


def _build(into: Path, family: str) -> None:
    from actors.codec.tiny import make_tiny as make_tiny_codec
    from actors.engine.tiny import make_tiny as make_tiny_model

    make_tiny_model(into / MODEL_DIR, fmt=family, seed=0, num_codebooks=NUM_CODEBOOKS, codebook_size=CODEBOOK_SIZE)
    make_tiny_codec(into / CODEC_DIR, seed=0, semantic_codebook_size=CODEBOOK_SIZE, codebook_size=CODEBOOK_SIZE)


def demo_assets(root: Path | None = None, family: str = "s1") -> tuple[Path, Path]:
    """(checkpoint dir, codec dir) of the demo of `family` (s1 or s2), building them once per
    cache directory."""
    root = Path(root) if root is not None else cache_root()
    root.mkdir(parents=True, exist_ok=True)
    name = "demo" if family == "s1" else f"demo-{family}"  # the S1 demo's folder as it always was
    final = root / f"{name}-{DEMO_VERSION}-{_builders_fingerprint()}"
    if not final.is_dir():
        with FileLock(str(final) + ".lock"):
            if not final.is_dir():  # another process may have finished while we waited
                staging = Path(tempfile.mkdtemp(prefix=".building-", dir=root))
                try:
                    _build(staging, family)
                    os.replace(staging, final)
                finally:
                    shutil.rmtree(staging, ignore_errors=True)
    return final / MODEL_DIR, final / CODEC_DIR
