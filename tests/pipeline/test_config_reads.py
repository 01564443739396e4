"""The driver reads its configuration one way (issue 49): the entry points hold Hydra's object
and convert it once (pipeline/config.py typed); every other module of pipeline/ reads the
typed groups, so a renamed key is found by the type checker, not by grep. This reads each
module's syntax tree and fails on the other ways: a plain dict indexed by a group's name, an
attribute of the raw Hydra object, a conversion to plain containers, Hydra imported."""

from __future__ import annotations

import ast
from dataclasses import fields
from pathlib import Path

from pipeline.config import ChorusConfig, ExportConfig, ReportConfig
from tests.helpers import REPO

# where Hydra's object is allowed, and why
ENTRY_POINTS = {
    "pipeline/cli/compose.py": "`chorus`: composes each command's config from its settings, converts it once",
    "pipeline/cli/help.py": "`chorus <command> --help`: reads the composed config's values before any conversion",
    "pipeline/cli/parse.py": "`chorus`: Hydra's override grammar reads the command line",
    "pipeline/config_page.py": "docs/config.md: the values conf/'s groups compose, as written",
    "pipeline/config.py": "the schema, Hydra's composition and the conversion itself",
}
GROUPS = {f.name for schema in (ChorusConfig, ExportConfig, ReportConfig) for f in fields(schema)}
# names a module gives the raw Hydra object or its plain-container copy
RAW_NAMES = {"cfg", "run_cfg", "plain"}
CONVERSIONS = {"to_container", "to_plain"}
HYDRA_MODULES = ("hydra", "omegaconf")


def _name_of(node: ast.AST) -> str | None:
    """`x` for the name x and for an attribute `.x` (job.plain): what the value is called."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _raw(node: ast.AST) -> bool:
    name = _name_of(node)
    return name is not None and (name in RAW_NAMES or "plain" in name)


def violations(source: str, filename: str = "<source>") -> list[str]:
    """Each way `source` reads the config other than typed, as `file:line: what`."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        line = f"{filename}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Subscript) and _raw(node.value):
            key = node.slice
            if isinstance(key, ast.Constant) and key.value in GROUPS:
                found.append(f"{line}: {ast.unparse(node)} indexes a plain config by its group")
        elif isinstance(node, ast.Attribute) and node.attr in GROUPS and _raw(node.value):
            found.append(f"{line}: {ast.unparse(node)} reads the raw Hydra object")
        elif isinstance(node, ast.Call) and _name_of(node.func) in CONVERSIONS:
            found.append(f"{line}: {ast.unparse(node.func)}() makes plain containers of the config")
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            modules = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            for module in modules:
                if module.split(".")[0] in HYDRA_MODULES:
                    found.append(f"{line}: imports {module} (Hydra stays at the entry points)")
    return found


def test_the_check_finds_planted_reads():
    planted = (
        "from omegaconf import DictConfig\n"
        "def f(cfg, job, plain_cluster):\n"
        "    a = plain['cluster']['rows_per_block']\n"
        "    b = cfg.output.keep_codes\n"
        "    c = job.plain['model']\n"
        "    d = OmegaConf.to_container(cfg.engine)\n"
        "    e = plain_cluster['num_actors']\n"  # a group's own dict indexed by a key: not a group name
    )
    lines = sorted(int(v.split(":")[1]) for v in violations(planted))
    assert lines == [1, 3, 4, 5, 6, 6], violations(planted)
    typed = "def f(config, job, row):\n    return config.cluster.rows_per_block, job.config.output.dir, row['text']\n"
    assert violations(typed) == []


def test_the_driver_reads_one_typed_config():
    modules = sorted(p for p in (REPO / "pipeline").rglob("*.py"))
    assert len(modules) > 50
    for entry in ENTRY_POINTS:
        assert (REPO / entry).is_file(), entry  # an entry point renamed: say so here
    found = [
        v
        for path in modules
        if str(path.relative_to(REPO)) not in ENTRY_POINTS
        for v in violations(Path(path).read_text(), str(path.relative_to(REPO)))
    ]
    assert found == []
