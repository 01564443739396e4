"""One meaning per class name: no class name is defined twice under actors/ and pipeline/
(top-level or nested), so a name read in a log, a traceback or a review means one thing. Two
things that differ get names that say how (ModelArchitecture beside the actor's model
settings, the codec's CodecAttention beside the engine's Attention)."""

from __future__ import annotations

import ast
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

from tests.helpers import REPO

FOLDERS = ("actors", "pipeline")


def class_names(source: str) -> list[str]:
    """Every class a source defines, nested ones (in classes and functions) included."""
    return [node.name for node in ast.walk(ast.parse(source)) if isinstance(node, ast.ClassDef)]


def defined_twice(files: Iterable[tuple[str, str]]) -> dict[str, list[str]]:
    """(path, source) pairs -> each class name defined more than once and the paths that
    define it (a path twice when one file defines it twice)."""
    where = defaultdict(list)
    for path, source in files:
        for name in class_names(source):
            where[name].append(path)
    return {name: sorted(paths) for name, paths in where.items() if len(paths) > 1}


def project_sources() -> list[tuple[str, str]]:
    found = []
    for folder in FOLDERS:
        paths = sorted((REPO / folder).rglob("*.py"))
        assert paths, f"no Python files under {folder}/"
        found += [(str(Path(p).relative_to(REPO)), p.read_text()) for p in paths]
    return found


def test_the_scan_finds_a_planted_duplicate():
    files = [
        ("actors/a.py", "class Plan:\n    class Row:\n        pass\n"),
        ("pipeline/b.py", "def f():\n    class Row:\n        pass\n"),
        ("pipeline/c.py", "class Progress: pass\nclass Progress: pass\nclass Only: pass\n"),
    ]
    assert defined_twice(files) == {
        "Row": ["actors/a.py", "pipeline/b.py"],
        "Progress": ["pipeline/c.py", "pipeline/c.py"],
    }


def test_no_class_name_is_defined_twice():
    assert defined_twice(project_sources()) == {}


def loggers_outside_the_namespace(files: Iterable[tuple[str, str]]) -> list[str]:
    """Each module-level `logging.getLogger(...)` whose name does not start with "chorus"
    (a literal or an f-string), as "path: source": configuring the "chorus" logger must reach
    every module's lines."""
    outside = []
    for path, source in files:
        for node in ast.parse(source).body:
            call = node.value if isinstance(node, ast.Assign) else None
            if not (isinstance(call, ast.Call) and ast.unparse(call.func) == "logging.getLogger"):
                continue
            first = call.args[0] if call.args else None
            if isinstance(first, ast.JoinedStr) and first.values:
                first = first.values[0]
            if not (isinstance(first, ast.Constant) and str(first.value).startswith("chorus")):
                outside.append(f"{path}: {ast.unparse(node)}")
    return outside


def test_every_module_logs_under_chorus():
    assert loggers_outside_the_namespace(project_sources()) == []
    # the rule catches a module named by __name__ alone, and passes the namespace's forms
    planted = [("a.py", "import logging\nlog = logging.getLogger(__name__)\n")]
    assert loggers_outside_the_namespace(planted) == ["a.py: log = logging.getLogger(__name__)"]
    fine = 'import logging\nlog = logging.getLogger("chorus")\nlog2 = logging.getLogger(f"chorus.{__name__}")\n'
    assert loggers_outside_the_namespace([("b.py", fine)]) == []
