"""The vendored reference vectors are exactly the upstream-made files their manifests describe
(tests/vectors/PROVENANCE.md): a byte changed by an editor, a line-ending filter or a partial
copy fails here rather than as a puzzling numeric mismatch elsewhere."""

from __future__ import annotations

import hashlib
import json

import pytest

from helpers import DUALAR_SETS, VECTORS


def _sha256(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("name", DUALAR_SETS)
def test_dualar_set_matches_its_manifest(name):
    root = VECTORS / name
    files = json.loads((root / "manifest.json").read_text())["files"]
    for file, meta in files.items():
        assert _sha256(root / file) == meta["sha256"], f"{name}/{file} differs from its manifest"
    assert len(files) >= 12


def test_codec_set_matches_its_manifest():
    root = VECTORS / "codec-tiny"
    manifest = json.loads((root / "manifest.json").read_text())
    assert _sha256(root / manifest["checkpoint"]["file"]) == manifest["checkpoint"]["sha256"]
    for file, meta in manifest["files"].items():
        assert (root / file).stat().st_size == meta["bytes"], f"codec-tiny/{file} has the wrong size"
