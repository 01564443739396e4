"""An invocation's configuration: composed from conf/'s groups and the settings given (run,
preview, bench, encode-refs, config), or the command's schema with the settings given (export,
report). Every way composing can fail -- a value of the wrong type, a required key without a
value, an interpolation that cannot resolve -- becomes one ConfigError naming the key and the
fix; the typed object comes back with every group's range checks passed."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue, OmegaConfBaseException

from actors.errors import ConfigError

from ..config import compose_with_choices, typed
from ..config_page import key_descriptions
from .parse import Invocation


@dataclass
class Composed:
    """The untyped config (--help reads it, `???` and all) and the groups' chosen options."""

    cfg: DictConfig
    choices: dict[str, str] = field(default_factory=dict)


def compose_invocation(invocation: Invocation) -> Composed:
    command = invocation.command
    if command.composed:
        try:
            cfg, choices = compose_with_choices(invocation.overrides)
        except Exception as e:  # Hydra's ConfigCompositionException and friends: a value it refused
            raise ConfigError(_composition_message(e)) from None
        return Composed(cfg, choices)
    cfg = OmegaConf.structured(command.schema)
    for (key, value), text in zip(invocation.values, invocation.overrides):
        try:
            OmegaConf.update(cfg, key, value, merge=True)
        except OmegaConfBaseException as e:
            raise ConfigError(f"{text}: {_first_line(e)}") from None
    return Composed(cfg)


def typed_config(invocation: Invocation, composed: Composed):
    """The command's typed config (ChorusConfig, ExportConfig, ReportConfig), every group's
    range checks passed."""
    try:
        if invocation.command.composed:
            return typed(composed.cfg)
        config = OmegaConf.to_object(composed.cfg)
    except MissingMandatoryValue as e:
        raise ConfigError(missing_message(e.full_key, invocation, composed)) from None
    except OmegaConfBaseException as e:
        where = getattr(e, "full_key", None)
        raise ConfigError(f"{where}: {_first_line(e)}" if where else _first_line(e)) from None
    for group in vars(config).values():
        check = getattr(group, "validate", None)
        if check is not None:
            check()
    return config


def missing_message(key: str, invocation: Invocation, composed: Composed) -> str:
    """`data.path` has no value: which option asked for it and what it is."""
    command, group = invocation.command, key.split(".", 1)[0]
    option = composed.choices.get(group)
    why = f" with {group}={option}" if option else ""
    how = f"`chorus {command.name} {key.upper().replace('.', '_')}`" if key == command.positional else f"{key}=..."
    description = key_descriptions(command.schema).get(key, "").split(";")[0]
    return f"{key} is required{why}: pass {how}" + (f" ({description})" if description else "")


def _composition_message(error: BaseException) -> str:
    """Hydra's 'Error merging override engine.max_rows=abc' and OmegaConf's cause as one line."""
    cause: Optional[BaseException] = error.__cause__ or error.__context__
    head = _first_line(error)
    prefix = "Error merging override "
    if head.startswith(prefix) and cause is not None:
        return f"{head[len(prefix) :]}: {_first_line(cause)}"
    return head if cause is None else f"{head}: {_first_line(cause)}"


def _first_line(error: BaseException) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[0] if lines else type(error).__name__
