"""The one parser of every `chorus` subcommand: `key=value` settings in Hydra's override grammar
(`engine=gpu` chooses a group's option, `engine.max_rows=8` sets a key, `[a,b]` is a list,
`'...'` quotes), `--help`, and a bare argument for the one key a command names (`chorus export
OUT`). Every key is checked against the command's schema before anything is composed: an
unknown key, with or without Hydra's `+`, is refused naming the nearest key; a group's unknown
option names the options. Errors are ConfigError, one line each."""

from __future__ import annotations

import dataclasses
import difflib
import re
import typing
from dataclasses import dataclass, field

from actors.errors import ConfigError

from ..config import group_options
from ..config_page import key_descriptions
from .commands import Subcommand

HELP_FLAGS = ("-h", "--help")


@dataclass
class Invocation:
    """A subcommand and its settings as given: `overrides` are `key=value` strings (a leading
    `+` dropped), `values` the same parsed (key -> Python value), in order."""

    command: Subcommand
    overrides: list[str] = field(default_factory=list)
    values: list[tuple[str, object]] = field(default_factory=list)
    help: bool = False


def schema_keys(schema: type, prefix: str = "") -> list[str]:
    """Every key of a schema, dotted: its groups, nested groups and leaves, in field order."""
    hints = typing.get_type_hints(schema)
    keys = []
    for item in dataclasses.fields(schema):
        name = f"{prefix}{item.name}"
        keys.append(name)
        if dataclasses.is_dataclass(hints[item.name]):
            keys += schema_keys(hints[item.name], f"{name}.")
    return keys


def nearest(key: str, known: list[str], descriptions: dict[str, str]) -> str:
    """The known key a misspelled one most likely meant ("" when none is close), tried in turn:
    a key of the same group that starts with it or is spelled close to it; a key of that group whose description uses the
    misspelled word (`engine.slots` -> engine.max_rows, "... KV-cache slots"); a close spelling
    anywhere; a key with the same last part in another group (`max_frames` -> model.budget.max_frames)."""
    group, _, word = key.rpartition(".")
    siblings = {k.rpartition(".")[2]: k for k in known if group and k.rpartition(".")[0] == group}
    close = [name for name in siblings if name.startswith(word)] or difflib.get_close_matches(word, siblings, n=1)
    if close:
        return siblings[close[0]]
    pattern = re.compile(rf"\b{re.escape(word)}\b", re.IGNORECASE)
    described = [k for k in siblings.values() if pattern.search(descriptions.get(k, ""))]
    if described:
        return described[0]
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    if close:
        return close[0]
    return next((k for k in known if k.rpartition(".")[2] == word), "")


def parse(command: Subcommand, args: list[str]) -> Invocation:
    """`args` (after the subcommand's name) as an Invocation; ConfigError for anything wrong."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    invocation = Invocation(command, help=any(a in HELP_FLAGS for a in args))
    texts, bare = [], []
    for arg in args:
        if arg in HELP_FLAGS:
            continue
        if arg.startswith("-"):
            raise ConfigError(f"unknown option {arg!r}: settings are key=value ({_help_hint(command)})")
        (texts if "=" in arg or arg.startswith("~") else bare).append(arg)
    if bare:
        texts.insert(0, _positional(command, bare))
    parser = OverridesParser.create()
    known = schema_keys(command.schema)
    for text in texts:
        try:
            override = parser.parse_overrides([text])[0]
        except OverrideParseException as e:
            raise ConfigError(f"cannot read {text!r}: {str(e).splitlines()[0]}; write key=value") from None
        key, value = _checked(command, override, known)
        invocation.overrides.append(text.lstrip("+"))
        invocation.values.append((key, value))
    return invocation


def _positional(command: Subcommand, bare: list[str]) -> str:
    """The override a bare argument stands for, quoted so that any path reads as itself."""
    if command.positional is None or len(bare) > 1:
        extra = bare if command.positional is None else bare[1:]
        raise ConfigError(f"unexpected argument {extra[0]!r}: settings are key=value ({_help_hint(command)})")
    quoted = bare[0].replace("\\", "\\\\").replace("'", "\\'")
    return f"{command.positional}='{quoted}'"


def _checked(command: Subcommand, override, known: list[str]) -> tuple[str, object]:
    """(key, value) of one parsed override, refused unless it names a key of the command."""
    from hydra.core.override_parser.types import OverrideType

    key = override.key_or_group
    if override.type == OverrideType.DEL:
        raise ConfigError(f"{override.input_line!r}: keys cannot be removed; set a value instead (key=value)")
    if override.is_sweep_override():
        raise ConfigError(f"{override.input_line!r}: one value per key (chorus runs one configuration)")
    if override.package is not None:
        raise ConfigError(f"{override.input_line!r}: write key=value, without a package (@...)")
    options = group_options(key) if command.composed else []
    if options:
        value = override.value()
        if value not in options:
            raise ConfigError(f"{key}={value}: no such option of {key}; the options are {', '.join(options)}")
        return key, value
    if key not in known:
        guess = nearest(key, known, key_descriptions(command.schema))
        meant = f" (did you mean {guess}?)" if guess else ""
        raise ConfigError(f"unknown key {key!r}{meant}; {_help_hint(command)} lists every key")
    return key, override.value()


def _help_hint(command: Subcommand) -> str:
    return f"`chorus {command.name} --help`"
