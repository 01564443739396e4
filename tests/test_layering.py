"""The import layering, read from the source (every import statement, also those inside
functions and under TYPE_CHECKING): the actors never import the driver; the engine and the
codec are plain torch (no Ray, Hydra, OmegaConf or pyarrow), so they run anywhere a model runs;
the driver never names torch; no module of pipeline/ or actors/ is part of an import cycle; and
the driver's rooms keep their one-way doors (pipeline/__init__.py draws them). That the
driver's modules do not load torch when imported is checked by running them
(test_driver_never_imports_torch, at the end)."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from collections.abc import Mapping
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


SETTINGS_MODULES = [
    "actors/synth/settings.py",
    "actors/synth/job_settings.py",
    "actors/engine/settings.py",
    "actors/quality/settings.py",
]


@pytest.mark.parametrize("module", SETTINGS_MODULES)
def test_actor_settings_are_plain_python(module):
    # the driver's Hydra schema nests them and the actor receives them: neither side's
    # machinery belongs in them (required values are OmegaConf's "???" spelled out)
    path = REPO / module
    package = ".".join(path.relative_to(REPO).parts[:-1])
    hits = {m for m in imported_modules(path.read_text(), package) if m.split(".")[0] in ORCHESTRATION + ("torch",)}
    assert hits == set()


def test_driver_never_names_torch():
    assert offending("pipeline", ("torch",)) == {}


# ---- import cycles and the driver's rooms ----------------------------------------------------


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(folders: tuple[str, ...] = ("pipeline", "actors")) -> dict[str, set[str]]:
    """Module -> the modules of `folders` it imports, by any form: `from pkg import name` is an
    edge to pkg.name when that is a module, else to pkg."""
    files = {module_name(p): p for folder in folders for p in sources(folder)}
    graph = {}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        found = imported_modules(path.read_text(), package)
        # imported_modules names both `pkg` and `pkg.name` for a from-import: keep `pkg` only
        # where no `pkg.name` of it is a module (the name is then an attribute of pkg)
        edges = {m for m in found if m in files}
        edges -= {m for m in edges if any(other.startswith(m + ".") for other in edges)} - _bare_imports(path)
        graph[name] = edges - {name}
    return graph


def _bare_imports(path: Path) -> set[str]:
    """Modules named whole by `import a.b` (they are edges even when a.b.c is imported too)."""
    return {
        alias.name
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Import)
        for alias in node.names
    }


def cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in graph.get(node, ()):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def test_the_cycle_finder_finds_a_planted_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}
    assert cycles(graph) == [["a", "b", "c"]]
    # a lazy import and one under TYPE_CHECKING are edges too
    source = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .layout import X\ndef f():\n    from ..plan import job\n"
    assert imported_modules(source, "pipeline.output") >= {"pipeline.output.layout", "pipeline.plan.job"}


def test_no_import_cycle_in_the_driver_or_the_actors():
    assert cycles(import_graph()) == []


LEAVES = {
    "pipeline.location",
    "pipeline.names",
    "pipeline.shipped",
    "pipeline.errors",
    "pipeline.config",
    "pipeline.config_page",
    "pipeline.schema_comments",
    "pipeline.cluster",
}
# each room of the driver and the rooms it may import besides its own and the leaves
ROOMS = {
    "pipeline.output": set(),
    "pipeline.plan": {"pipeline.output"},
    "pipeline.report": {"pipeline.output"},
    "pipeline.run": {"pipeline.output", "pipeline.plan", "pipeline.report"},
    "pipeline.export": {"pipeline.output"},
}


def _room(module: str) -> str:
    if module.endswith(".__main__"):  # a package's command line (`python -m pipeline.export`): an entry point
        return module
    for room in (*ROOMS, *LEAVES):
        if module == room or module.startswith(room + "."):
            return room
    return module


def test_the_drivers_rooms_keep_their_doors():
    """output/ imports none of plan/, run/, report/; plan/ and report/ only output/; run/ no
    entry point; the leaves only each other."""
    crossings = {}
    for module, imported in import_graph(("pipeline",)).items():
        room = _room(module)
        allowed = {room, "pipeline"} | LEAVES | ROOMS.get(room, set())
        if room in LEAVES:
            allowed = LEAVES | {"pipeline"}
        elif room not in ROOMS:
            continue  # the entry points and bench/ may import any room
        bad = sorted(m for m in imported if _room(m) not in allowed)
        if bad:
            crossings[module] = bad
    assert crossings == {}


# ---- the actors' layers ---------------------------------------------------------------------

# each layer of actors/ and its rank: a module imports its own layer and lower ranks only (the
# engine and the codec share a rank and import neither each other). The leaves are actors/'s
# top-level modules and actors/storage/; actors/__init__.py draws the layers
ACTOR_LAYERS = {"leaves": 0, "engine": 1, "codec": 1, "quality": 2, "synth": 3}


def actor_layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in ACTOR_LAYERS else "leaves"


def out_of_reach(importer: str, imported: str) -> bool:
    """Whether `imported` is in a layer of actors/ that `importer` may not import."""
    ours, theirs = actor_layer(importer), actor_layer(imported)
    return theirs != ours and ACTOR_LAYERS[theirs] >= ACTOR_LAYERS[ours]


def arrows_up(imports: Mapping[str, set[str]]) -> dict[str, list[str]]:
    """module -> the modules of actors/ it imports from a higher layer, or from the other layer
    of its rank."""
    found = {}
    for module, imported in imports.items():
        ours = [m for m in imported if m == "actors" or m.startswith("actors.")]
        bad = sorted(m for m in ours if out_of_reach(module, m))
        if bad:
            found[module] = bad
    return found


def actor_imports() -> dict[str, set[str]]:
    """Every module of actors/ -> every module name its import statements give (any form)."""
    imports = {}
    for path in sources("actors"):
        name = module_name(path)
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        imports[name] = imported_modules(path.read_text(), package)
    return imports


def test_the_layer_rule_refuses_a_planted_arrow_up():
    planted = {
        "actors.codec.loader": {"actors.engine.precision", "actors.precision"},  # across its rank
        "actors.quality.gate": {"actors.synth.jobs", "actors.engine.types"},  # up
        "actors.schema": {"actors.engine", "actors.engine.types", "actors"},  # a leaf, up
        "actors.storage.retry": {"actors.files"},  # a leaf may import a leaf
        "actors.synth.actor": {"actors.engine", "actors.quality.gate", "actors.schema", "actors.synth.jobs"},
    }
    assert arrows_up(planted) == {
        "actors.codec.loader": ["actors.engine.precision"],
        "actors.quality.gate": ["actors.synth.jobs"],
        "actors.schema": ["actors.engine", "actors.engine.types"],
    }


def test_the_actors_layers_keep_their_order():
    """Leaves (actors/*.py, actors/storage/) import no layer above them; the engine and the codec
    only leaves; quality the leaves, the engine and the codec; synth anything below it."""
    assert arrows_up(actor_imports()) == {}


# ---- the driver at run time ---------------------------------------------------------------


def test_driver_never_imports_torch():
    code = (
        "import sys, importlib, pkgutil, pipeline;"
        "[importlib.import_module(m.name) for m in pkgutil.walk_packages(pipeline.__path__, 'pipeline.')];"
        # what the driver uses from the actors' side: the column contract, the actor's and the
        # engine's settings, the engine's types, the actor class (it loads torch in its constructor)
        "import actors, actors.schema, actors.synth.settings, actors.synth, actors.engine.settings, actors.engine.types;"
        "print('torch' in sys.modules)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"
