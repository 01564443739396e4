"""docs/config.md, every key of every `chorus` command's configuration, generated from the
schema (pipeline/config.py) so that the page cannot drift from it: a key's type from its
dataclass field, its value as the default groups of conf/ compose it (and what each other
option of a group sets it to), its allowed range from the field's metadata (actors/bounds.py),
what it does from the comment above the field, and the README section that explains it.

    python -m pipeline.config_page            print the page
    python -m pipeline.config_page --write    write docs/config.md
    python -m pipeline.config_page --check    exit 1 when docs/config.md differs

`chorus <command> --help` prints the same keys for a terminal, with the values that invocation
would use (pipeline/cli/help.py).
tests/test_config_page.py fails when the committed page and the schema differ.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import sys
import typing
from collections import defaultdict
from dataclasses import dataclass

from omegaconf import OmegaConf

from actors.bounds import allowed_values

from .config import REPO_ROOT, ChorusConfig, ExportConfig, ReportConfig, compose_with_choices, group_options
from .schema_comments import class_intro, field_comments

PAGE = REPO_ROOT / "docs" / "config.md"
README = REPO_ROOT / "README.md"
WRITE_COMMAND = "python -m pipeline.config_page --write"

# the README section that explains each group (a heading of README.md, as written there)
GROUP_SECTIONS = {
    "model": "Real checkpoints",
    "data": "Input",
    "engine": "Configuration groups (`conf/`)",
    "long_form": "Long text",
    "sampling": "Configuration groups (`conf/`)",
    "quality": "Quality checks and regeneration",
    "output": "Output format",
    "cluster": "The cluster",
    "bench": "Configuration groups (`conf/`)",
    "preview": "Before a large job: `chorus preview`",
    "encode_refs": "Input",
}
EXPORT_SECTION = "Exports for training: `chorus export`"
REPORT_SECTION = "Output format"
# keys a section other than their group's explains
KEY_SECTIONS = {
    "data.uri_schemes": "Object storage (S3, GCS, S3-compatible stores)",
    "data.max_voices": "Dialogue rows: several voices in one row",
    "output.overwrite": "Resume",
    "output.on_change": "Resume",
    "output.retry_errors": "Resume",
    "output.retry_rejected": "Resume",
    "engine.cuda_graphs": "GPUs",
    "engine.memory_fraction": "GPUs",
    "cluster.gpus_per_actor": "GPUs",
    "cluster.address": "Running on a Ray cluster (Ray Jobs)",
}

# each part of the page: the commands it covers, their schema, where a group's README section
# comes from, and whether conf/'s YAML groups compose it
COMMANDS = (
    ("chorus run, preview, bench, encode-refs, config", ChorusConfig, GROUP_SECTIONS),
    (
        "chorus export",
        ExportConfig,
        {"output": EXPORT_SECTION, "export": EXPORT_SECTION, "cluster": EXPORT_SECTION},
    ),
    ("chorus report", ReportConfig, {"output": REPORT_SECTION, "report": REPORT_SECTION}),
)


@dataclass(frozen=True)
class Key:
    """One leaf key's row of the page."""

    name: str
    type: str
    default: str  # its value with the default groups of conf/ (the schema's where no YAML composes it)
    allowed: str
    description: str
    section: str
    options: tuple[str, ...] = ()  # what other options of conf/'s groups set it to: "engine=gpu: 1024"


@dataclass(frozen=True)
class Group:
    """One group of a command's configuration: its intro and its keys, nested groups flattened."""

    command: str
    name: str
    intro: str
    keys: tuple[Key, ...]


def type_name(hint: typing.Any) -> str:
    """A field's type as the page says it: int, list[str], "float or null"."""
    args = typing.get_args(hint)
    if typing.get_origin(hint) is typing.Union:
        present = [arg for arg in args if arg is not type(None)]
        return f"{type_name(present[0])} or null"
    if typing.get_origin(hint) in (list, tuple):
        return f"list[{type_name(args[0])}]"
    if hint in (list, tuple):
        return "list"
    return hint.__name__


def value_text(value: typing.Any) -> str:
    """A default as YAML and the command line spell it: null, true, [s3, gs]; `???` (required)
    and `${...}` interpolations as written."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(value_text(item) for item in value) + "]"
    return str(value)


def default_text(item: dataclasses.Field) -> str:
    if item.default is not dataclasses.MISSING:
        return value_text(item.default)
    return value_text(item.default_factory())


def flat_values(cfg) -> dict[str, str]:
    """Each leaf key of a composed config and its value as the page spells it (interpolations
    as written, `???` for a required value)."""
    found: dict[str, str] = {}

    def walk(node, prefix: str) -> None:
        for name, value in node.items():
            if isinstance(value, dict):
                walk(value, f"{prefix}{name}.")
            else:
                found[f"{prefix}{name}"] = value_text(value)

    walk(OmegaConf.to_container(cfg, resolve=False, throw_on_missing=False), "")
    return found


@functools.cache
def composed_values() -> tuple[dict[str, str], dict[str, tuple[str, ...]]]:
    """The run config's values with the default groups of conf/, and per key what each other
    option of a group sets it to where that differs ("engine=gpu: 1024")."""
    cfg, chosen = compose_with_choices()
    base = flat_values(cfg)
    options = defaultdict(list)
    for group, default in sorted(chosen.items()):
        for option in group_options(group):
            if option == default:
                continue
            for key, text in flat_values(compose_with_choices([f"{group}={option}"])[0]).items():
                if text != base.get(key):
                    options[key].append(f"{group}={option}: {text}")
    return base, {key: tuple(said) for key, said in options.items()}


def _keys(schema: type, prefix: str, section: str, composed: bool) -> typing.Iterator[Key]:
    """The leaf keys under a dataclass, in field order; a nested dataclass's keys in its place."""
    hints = typing.get_type_hints(schema)
    comments = field_comments(schema)
    values, options = composed_values() if composed else ({}, {})
    for item in dataclasses.fields(schema):
        name = f"{prefix}.{item.name}"
        hint = hints[item.name]
        if dataclasses.is_dataclass(hint):
            yield from _keys(hint, name, section, composed)
            continue
        yield Key(
            name=name,
            type=type_name(hint),
            default=values.get(name, default_text(item)),
            allowed=allowed_values(item.metadata),
            description=comments.get(item.name, ""),
            section=KEY_SECTIONS.get(name, section),
            options=options.get(name, ()),
        )


def command_groups(command: str, schema: type, sections: dict[str, str]) -> list[Group]:
    """Each top-level group of one command's schema, with its keys."""
    hints = typing.get_type_hints(schema)
    groups = []
    for item in dataclasses.fields(schema):
        group_class = hints[item.name]
        keys = tuple(_keys(group_class, item.name, sections[item.name], composed=schema is ChorusConfig))
        groups.append(Group(command, item.name, class_intro(group_class), keys))
    return groups


def all_groups() -> list[Group]:
    """Every group of every command, in page order."""
    return [group for command in COMMANDS for group in command_groups(*command)]


def schema_groups(schema: type) -> list[Group]:
    """The groups of the page's part that covers `schema`."""
    return next(command_groups(*command) for command in COMMANDS if command[1] is schema)


def key_descriptions(schema: type) -> dict[str, str]:
    """Key -> what it does, for every leaf key of `schema` (messages and --help quote them)."""
    return {key.name: key.description for group in schema_groups(schema) for key in group.keys}


def heading_anchor(heading: str) -> str:
    """GitHub's anchor for a Markdown heading: lowercase, punctuation dropped, spaces to '-'."""
    kept = "".join(ch for ch in heading.lower() if ch.isalnum() or ch in " -_")
    return kept.replace(" ", "-")


def _cell(text: str) -> str:
    """Text for a Markdown table cell: '|' would end the cell (escaped everywhere, as GFM
    wants); outside `code` spans, '<' would start HTML and '*' emphasis."""
    pieces = text.replace("|", "\\|").split("`")
    for outside in range(0, len(pieces), 2):
        pieces[outside] = pieces[outside].replace("<", "&lt;").replace("*", "\\*")
    return "`".join(pieces)


def _markdown_row(key: Key) -> str:
    link = f"[{key.section}](../README.md#{heading_anchor(key.section)})"
    value = f"`{key.default}`" + "".join("<br>{}: `{}`".format(*option.split(": ", 1)) for option in key.options)
    cells = (
        f"`{key.name}`",
        _cell(key.type),
        value,
        _cell(key.allowed),
        _cell(key.description),
        link,
    )
    return "| " + " | ".join(cells) + " |"


PAGE_INTRO = f"""# Configuration: every key

<!-- Generated from the schema by `{WRITE_COMMAND}`; edit the dataclasses, not this page. -->

Every key of the `chorus` commands (`ChorusConfig`, `ExportConfig`, `ReportConfig` in
`pipeline/config.py`), one table per group, generated from the schema: the type, the value a
run uses with the default groups of `conf/` (`model=demo data=demo engine=cpu ...`) and, below
it, what each other option of a group sets it to (`engine=gpu: ...`), the allowed range
(checked before anything runs; a key whose range involves other keys says so in words), what
the key does (the comment above its field) and the README section that explains it. `???` is a
required value; `${{...}}` is an OmegaConf interpolation, resolved when the config is composed.
Set a key on the command line as `group.key=value`; `chorus <command> --help [settings]` prints
the values that invocation would use, and `chorus config [settings]` the whole composed config.
"""

TABLE_HEADER = "| key | type | value (other options) | allowed | what it does | README |\n|---|---|---|---|---|---|"


def _markdown_group(group: Group) -> str:
    rows = "\n".join(_markdown_row(key) for key in group.keys)
    intro = f"{group.intro}\n\n" if group.intro else ""
    return f"### `{group.name}`\n\n{intro}{TABLE_HEADER}\n{rows}\n"


def markdown_page(groups: typing.Optional[list[Group]] = None) -> str:
    """docs/config.md as it should be."""
    groups = all_groups() if groups is None else groups
    parts = [PAGE_INTRO]
    for command, _, _ in COMMANDS:
        parts.append(f"## `{command}`\n")
        parts.extend(_markdown_group(group) for group in groups if group.command == command)
    return "\n".join(parts)


def main(argv: typing.Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline.config_page", description=__doc__.split("\n\n")[0])
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--write", action="store_true", help=f"write {PAGE.relative_to(REPO_ROOT)}")
    action.add_argument("--check", action="store_true", help="exit 1 when the page differs from the schema")
    args = parser.parse_args(argv)
    page = markdown_page()
    if args.write:
        PAGE.write_text(page)
        return 0
    if args.check:
        if not PAGE.exists() or PAGE.read_text() != page:
            print(f"{PAGE.relative_to(REPO_ROOT)} differs from the schema: run `{WRITE_COMMAND}`", file=sys.stderr)
            return 1
        return 0
    sys.stdout.write(page)
    return 0


if __name__ == "__main__":
    sys.exit(main())
