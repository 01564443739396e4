"""docs/config.md is the schema's: every key of the `chorus` commands once, each described by the
comment above its field, each README section it names present, its value the one the default
groups of conf/ give it (and each other option's); the allowed ranges it shows are the ones
`validate()` enforces (actors/bounds.py). `chorus <command> --help`: tests/pipeline/test_cli.py."""

from __future__ import annotations

import dataclasses
import re
import typing

import pytest

from actors.bounds import at_least, check_bounds, described, one_of, within
from actors.errors import ConfigError
from pipeline.config import ChorusConfig, ExportConfig, ReportConfig, compose_typed
from pipeline.config_page import PAGE, README, WRITE_COMMAND, all_groups, heading_anchor, markdown_page
from pipeline.schema_comments import field_comments
from tests.helpers import REPO


def leaf_keys(schema: type, prefix: str = "") -> list[str]:
    """Every leaf key of a dataclass schema, walked independently of the generator."""
    hints = typing.get_type_hints(schema)
    keys = []
    for item in dataclasses.fields(schema):
        name = f"{prefix}{item.name}"
        if dataclasses.is_dataclass(hints[item.name]):
            keys += leaf_keys(hints[item.name], f"{name}.")
        else:
            keys.append(name)
    return keys


def page_keys(command: str) -> list[str]:
    return [key.name for group in all_groups() if group.command == command for key in group.keys]


def test_the_committed_page_is_the_generators():
    assert PAGE.read_text() == markdown_page(), f"docs/config.md differs from the schema: run `{WRITE_COMMAND}`"


@pytest.mark.parametrize(
    "command, schema",
    [
        ("chorus run, preview, bench, encode-refs, config", ChorusConfig),
        ("chorus export", ExportConfig),
        ("chorus report", ReportConfig),
    ],
)
def test_every_leaf_key_is_on_the_page_once(command, schema):
    expected = leaf_keys(schema)
    assert len(expected) >= 4
    assert page_keys(command) == expected
    page = PAGE.read_text()
    section = page.split(f"## `{command}`\n", 1)[1].split("\n## `", 1)[0]
    for key in expected:
        assert len(re.findall(rf"^\| `{re.escape(key)}` \|", section, flags=re.M)) == 1, key


def test_every_key_says_what_it_does():
    # a new field without a comment above it (or in a commented run of fields) fails here
    undescribed = [key.name for group in all_groups() for key in group.keys if not key.description.strip()]
    assert undescribed == []


def test_a_comment_covers_the_run_of_fields_below_it():
    @dataclasses.dataclass
    class Sample:
        # the first two
        first: int = 1
        second: int = 2

        third: int = 3
        # the fourth
        fourth: int = 4

    assert field_comments(Sample) == {
        "first": "the first two",
        "second": "the first two",
        "third": "",
        "fourth": "the fourth",
    }


def test_every_readme_section_named_exists():
    readme = README.read_text()
    headings = {line.lstrip("#").strip() for line in readme.splitlines() if line.startswith("#")}
    named = {key.section for group in all_groups() for key in group.keys}
    assert named - headings == set()
    assert heading_anchor("Exports for training: `chorus export`") == "exports-for-training-chorus-export"


def test_the_page_is_linked_from_the_readme_and_the_architecture():
    assert "docs/config.md" in README.read_text()
    assert "config.md" in (REPO / "docs" / "architecture.md").read_text()


def test_bounds_refuse_out_of_range_values_naming_the_key():
    @dataclasses.dataclass
    class Sample:
        count: int = dataclasses.field(default=1, metadata=at_least(1))
        share: typing.Optional[float] = dataclasses.field(
            default=None, metadata=within(0, 1, closed="[)", or_null=True)
        )
        mode: str = dataclasses.field(default="a", metadata=one_of("a", "b"))
        free: int = dataclasses.field(default=0, metadata=described("anything the code allows"))

    check_bounds(Sample(), "sample")
    for values, message in [
        ({"count": 0}, "sample.count must be >= 1, got 0"),
        ({"share": 1.0}, r"sample.share must be in \[0, 1\), got 1.0"),
        ({"mode": "c"}, "sample.mode must be one of a, b, got 'c'"),
    ]:
        with pytest.raises(ConfigError, match=message):
            check_bounds(Sample(**values), "sample")


@pytest.mark.parametrize(
    "override, message",
    [
        ("cluster.rows_per_block=0", "cluster.rows_per_block must be >= 1, got 0"),
        ("quality.max_silence_ratio=1.5", r"quality.max_silence_ratio must be in \[0, 1\], got 1.5"),
        ("output.progress_bar=sometimes", "output.progress_bar must be one of auto, on, off, got 'sometimes'"),
        ("engine.max_tokens=1", "engine.max_tokens must be >= 2, got 1"),
    ],
)
def test_the_runs_keys_are_refused_by_their_bounds(override, message):
    compose_typed()
    with pytest.raises(ConfigError, match=message):
        compose_typed([override])


def test_the_page_shows_the_bounds_that_are_enforced():
    keys = {key.name: key for group in all_groups() for key in group.keys}
    assert keys["cluster.rows_per_block"].allowed == ">= 1"
    assert keys["engine.max_concurrent_blocks"].allowed == ">= 1 or null"
    assert keys["quality.asr"].allowed == "null or one of whisper"
    # the values a run uses: the default groups' (engine=cpu, model=demo), each other option's below
    assert keys["engine.max_rows"].default == "8" and "engine=gpu: 256" in keys["engine.max_rows"].options
    assert keys["model.checkpoint"].default == "null" and "model=s1_mini: ???" in keys["model.checkpoint"].options
    assert keys["data.name"].default == "${chorus_stem:${.path}}"
    assert keys["data.uri_schemes"].type == "list[str]"
