"""The import layering, read from the source (every import statement, also those inside
functions): the actors never import the driver; the engine and the codec are plain torch
(no Ray, Hydra, OmegaConf or pyarrow), so they run anywhere a model runs; the driver never
names torch. That the driver's modules do not load torch when imported is checked by running
them (tests/test_pipeline.py::test_driver_never_imports_torch)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.helpers import REPO

ORCHESTRATION = ("ray", "hydra", "omegaconf", "pyarrow")


def imported_modules(source: str, package: str) -> set[str]:
    """Absolute names of every module a source file of `package` imports (relative imports
    resolved)."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = parts[: len(parts) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module
            names.add(module)
            # `from actors import schema` imports the module actors.schema
            names.update(f"{module}.{alias.name}" for alias in node.names)
    return names


def sources(folder: str) -> list[Path]:
    found = sorted((REPO / folder).rglob("*.py"))
    assert found, f"no Python files under {folder}/"
    return found


def offending(folder: str, forbidden: tuple[str, ...]) -> dict[str, list[str]]:
    bad = {}
    for path in sources(folder):
        package = ".".join(path.relative_to(REPO).parts[:-1])
        hits = sorted(m for m in imported_modules(path.read_text(), package) if m.split(".")[0] in forbidden)
        if hits:
            bad[str(path.relative_to(REPO))] = hits
    return bad


def test_the_scan_sees_every_import_form():
    # the rules are only as good as this parser: relative, aliased and from-imports, and
    # imports inside functions, all count
    source = "from ..codec import y\nfrom . import z\ndef f():\n    import ray.data as rd\n"
    found = imported_modules(source, "actors.engine")
    assert found >= {"actors.codec", "actors.codec.y", "actors.engine.z", "ray.data"}


def test_actors_never_import_the_driver():
    assert offending("actors", ("pipeline",)) == {}


@pytest.mark.parametrize("folder", ["actors/engine", "actors/codec"])
def test_engine_and_codec_are_plain_torch(folder):
    assert offending(folder, ORCHESTRATION) == {}


def test_actor_settings_are_plain_python():
    # the driver's Hydra schema nests them and the actor receives them: neither side's
    # machinery belongs in them (required values are OmegaConf's "???" spelled out)
    path = REPO / "actors" / "settings.py"
    hits = {m for m in imported_modules(path.read_text(), "actors") if m.split(".")[0] in ORCHESTRATION + ("torch",)}
    assert hits == set()


def test_driver_never_names_torch():
    assert offending("pipeline", ("torch",)) == {}
