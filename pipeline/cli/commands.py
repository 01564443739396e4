"""The subcommands of `chorus`: what each reads (its schema; whether conf/'s groups compose it),
the groups its --help shows, the key a bare argument sets, and the function that does the work
(imported only when it runs, so `--help` and every refusal start nothing)."""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Optional

from ..config import ChorusConfig, ExportConfig, ReportConfig

# the groups an actor reads (RunGroups): every command that composes conf/'s groups shows them
RUN_GROUPS = ("model", "data", "engine", "long_form", "sampling", "quality", "output", "cluster")


@dataclass(frozen=True)
class Subcommand:
    name: str
    summary: str
    schema: type
    groups: tuple[str, ...]  # the schema's groups its --help shows, in order
    action: str  # "module:function" under pipeline/cli/actions.py's names
    composed: bool = True  # conf/'s YAML groups compose it (group=option); else the schema alone
    positional: Optional[str] = None  # the key a bare argument sets (`chorus export OUT`)
    example: str = ""

    def run(self, config) -> int:
        module, function = self.action.split(":")
        action: Callable[[object], int] = getattr(importlib.import_module(module), function)
        return action(config)

    @property
    def usage(self) -> str:
        groups = "[group=option ...] " if self.composed else ""
        bare = f"[{self.positional.upper().replace('.', '_')}] " if self.positional else ""
        return f"usage: chorus {self.name} {bare}{groups}[key=value ...]"


ACTIONS = "pipeline.cli.actions"

COMMANDS = (
    Subcommand(
        "run",
        "synthesize the input table into output.dir; rerun the same command to resume",
        ChorusConfig,
        RUN_GROUPS,
        f"{ACTIONS}:run",
        example="chorus run data=parquet data.path=texts.parquet output.dir=speech/",
    ),
    Subcommand(
        "preview",
        "plan what `chorus run` would do with these settings (rows to do, done, refused, frames, "
        "hours); writes nothing",
        ChorusConfig,
        (*RUN_GROUPS, "preview"),
        f"{ACTIONS}:preview",
        example="chorus preview data=parquet data.path=texts.parquet output.dir=speech/",
    ),
    Subcommand(
        "bench",
        "the end-to-end benchmark on a generated workload: bench.json, bench.md, report.html",
        ChorusConfig,
        (*RUN_GROUPS, "bench"),
        f"{ACTIONS}:bench",
        example="chorus bench bench=smoke output.dir=bench/",
    ),
    Subcommand(
        "export",
        "an output's rows as files, WebDataset, Lhotse Shar or Hub Parquet",
        ExportConfig,
        ("output", "export", "cluster"),
        f"{ACTIONS}:export",
        composed=False,
        positional="output.dir",
        example="chorus export speech/ export.format=webdataset export.dir=shards/",
    ),
    Subcommand(
        "report",
        "(re)write an output's report.html",
        ReportConfig,
        ("output", "report"),
        f"{ACTIONS}:report",
        composed=False,
        positional="output.dir",
        example="chorus report speech/",
    ),
    Subcommand(
        "encode-refs",
        "a copy of the input with its reference clips encoded (ref_codes), so runs encode none",
        ChorusConfig,
        ("encode_refs", "model", "data", "engine"),
        f"{ACTIONS}:encode_refs",
        positional="encode_refs.output",
        example="chorus encode-refs coded.parquet data=parquet data.path=texts.parquet",
    ),
    Subcommand(
        "config",
        "print the configuration these settings compose (YAML), every value resolved",
        ChorusConfig,
        tuple(f.name for f in dataclasses.fields(ChorusConfig)),
        f"{ACTIONS}:show_config",
        example="chorus config engine=gpu",
    ),
)

BY_NAME = {command.name: command for command in COMMANDS}
