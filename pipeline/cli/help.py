"""What `chorus --help` and `chorus <command> --help [settings]` print: the commands and the exit
statuses; a command's keys with the values this invocation would use -- after the groups it
chose and the settings it gave, interpolations resolved -- their types, ranges and meanings.
Nothing starts: the config is composed, not run."""

from __future__ import annotations

import textwrap

from omegaconf import OmegaConf

from ..config_page import schema_groups, value_text
from . import exits
from .commands import COMMANDS, Subcommand
from .compose import Composed

WIDTH = 100


def overview() -> str:
    """`chorus --help`: the commands, the settings' syntax, the exit statuses."""
    width = max(len(command.name) for command in COMMANDS)
    lines = [
        "usage: chorus <command> [group=option ...] [key=value ...]",
        "",
        "Batch speech synthesis on Ray for the Fish Audio dual-AR family (fish-speech, OpenAudio S1, S2-Pro).",
        "",
        "commands:",
    ]
    lines += [f"  {command.name:<{width}}  {command.summary}" for command in COMMANDS]
    lines += [
        "",
        "Settings are key=value (Hydra's grammar: engine=gpu picks an option of a conf/ group,",
        "engine.max_rows=8 sets a key, [a,b] is a list). `chorus <command> --help [settings]` lists a",
        "command's keys with the values those settings give; every key: docs/config.md.",
        "",
        "exit statuses:",
    ]
    statuses = textwrap.dedent(exits.__doc__.split("\n\n", 1)[1]).strip("\n")
    lines += [textwrap.indent(statuses, "  ")]
    return "\n".join(lines) + "\n"


def command_help(command: Subcommand, composed: Composed) -> str:
    """`chorus <command> --help [settings]`: its keys, each with the value this invocation gives it."""
    lines = [command.usage, "", f"{command.summary[0].upper()}{command.summary[1:]}."]
    if command.example:
        lines.append(f"e.g. {command.example}")
    if command.composed:
        chosen = " ".join(f"{group}={option}" for group, option in sorted(composed.choices.items()))
        lines += [
            "",
            f"Groups chosen: {chosen}",
            "The values below are this invocation's (after those groups and its settings).",
        ]
    lines.append("Every key as a table: docs/config.md in the repository. Exit statuses: chorus --help.")
    groups = {group.name: group for group in schema_groups(command.schema)}
    for name in command.groups:
        group = groups[name]
        lines += ["", f"{group.name}: {group.intro}".rstrip(": "), ""]
        lines += [_key_lines(key, composed) for key in group.keys]
    return "\n".join(lines) + "\n"


def _key_lines(key, composed: Composed) -> str:
    head = f"  {key.name} = {current_value(composed, key.name)}    ({key.type}; {key.allowed})"
    body = textwrap.fill(key.description, width=WIDTH, initial_indent=" " * 6, subsequent_indent=" " * 6)
    return f"{head}\n{body}"


def current_value(composed: Composed, key: str) -> str:
    """A key's value in the composed config, resolved; `???` when required and unset; as
    written when it cannot be resolved yet (an interpolation over a missing value)."""
    cfg = composed.cfg
    if OmegaConf.is_missing(cfg, key):
        return "???"
    try:
        value = OmegaConf.select(cfg, key, throw_on_missing=True)
        return value_text(OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value)
    except Exception:  # an interpolation that needs a missing value: show it as written
        parent, _, leaf = key.rpartition(".")
        node = OmegaConf.select(cfg, parent) if parent else cfg
        return value_text(OmegaConf.to_container(node, resolve=False)[leaf])
