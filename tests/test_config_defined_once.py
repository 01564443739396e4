"""Each setting is defined once: its default lives in its dataclass only (a YAML file of conf/
states what differs from it, never the default again), no key is defined twice under one name
or copied into the actor under another, and the sampling group holds only overrides of the
engine's own SamplingParams."""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from actors.engine.types import SamplingParams
from actors.synth.job_settings import InputColumns
from actors.synth.presets import GPU_ENGINE, PRESET_GROUPS, engine_settings
from actors.synth.settings import ActorSettings, RunContext, SamplingSettings
from pipeline.config import CONF_DIR, ChorusConfig, ExportConfig, compose, compose_typed, typed
from pipeline.run.actor_settings import ACTOR_GROUPS, actor_arguments

# keys spelled alike in two groups that are two settings, not one copied: each line says why
SAME_NAME_DIFFERENT_SETTING = {
    "dir": "output.dir is the run's output; export.dir where an export goes; the export's output.dir its source",
    "name": "model.name names the model, data.name the input",
    "overwrite": "output.overwrite restarts a run's output, export.overwrite an export's",
    "progress_interval_s": "the run's and the export's progress lines",
    "seed": "sampling.seed seeds rows, bench.seed the generated workload",
    "shard_rows": "the run's output shards and an export's shards (formats recommend their own)",
    "shard_bytes": "the run's output shards and an export's shards (formats recommend their own)",
    "min_mos": "quality.min_mos raises a flag; export.min_mos filters rows (null: no filter)",
    "max_wer": "quality.max_wer raises a flag; export.max_wer filters rows (null: no filter)",
    "min_speaker_similarity": "quality's raises a flag; export's filters rows (null: no filter)",
}


def defining_class(cls: type, name: str) -> type:
    """The class of `cls`'s MRO whose own body defines field `name` (a base shared by two
    groups defines its fields once)."""
    return next(k for k in reversed(cls.__mro__) if name in getattr(k, "__annotations__", {}))


def field_owners(root: type, path: str = "", found: dict | None = None) -> dict[str, set[tuple[str, str]]]:
    """Leaf key name -> {(group path, the class defining it)} under a schema root. InputColumns
    is skipped: its values are column names, its keys the canonical columns."""
    found = {} if found is None else found
    hints = typing.get_type_hints(root)
    for f in dataclasses.fields(root):
        kind = hints[f.name]
        if dataclasses.is_dataclass(kind):
            if kind is not InputColumns:
                field_owners(kind, f"{path}{f.name}.", found)
        else:
            found.setdefault(f.name, set()).add((path.rstrip("."), defining_class(root, f.name).__name__))
    return found


def test_no_key_is_defined_twice_under_one_name():
    owners = field_owners(ChorusConfig)
    field_owners(ExportConfig, "export:", owners)
    twice = {name: sorted(where) for name, where in owners.items() if len({cls for _, cls in where}) > 1}
    assert set(twice) - set(SAME_NAME_DIFFERENT_SETTING) == set(), twice
    stale = set(SAME_NAME_DIFFERENT_SETTING) - set(twice)
    assert not stale, f"allowed twice but defined once now: {stale}"


def test_the_run_context_copies_no_setting():
    # what the driver decides for a run (id, input dir, threads, ledger), never a key of a group
    group_keys = set(field_owners(ChorusConfig))
    assert {f.name for f in dataclasses.fields(RunContext)} & group_keys == set()


def test_the_actor_holds_the_run_configs_groups_themselves(tmp_path):
    # not copies of some of their keys: every value the driver validated, under its own name
    cfg = compose(["cluster.block_timeout_s=77", "cluster.crash_quarantine_after=3", "output.keep_codes=false"])
    actor = actor_arguments(typed(cfg), str(tmp_path), run_id="once")["settings"]
    assert {f.name for f in dataclasses.fields(ActorSettings)} == {*ACTOR_GROUPS, "run"}
    plain = OmegaConf.to_container(cfg, resolve=True)
    for group in ("output", "cluster", "sampling", "long_form"):
        assert dataclasses.asdict(getattr(actor, group)) == plain[group], group
    assert actor.cluster.block_timeout_s == 77 and actor.cluster.crash_quarantine_after == 3
    assert actor.output.keep_codes is False


def test_sampling_settings_are_overrides_of_the_engines_own():
    # one default per knob: the engine's SamplingParams (or the family's upstream values);
    # the run's group only names what it overrides (null = not overridden)
    engine = {f.name for f in dataclasses.fields(SamplingParams)}
    for f in dataclasses.fields(SamplingSettings):
        if f.name == "seed":
            continue
        assert f.name in engine, f.name
        assert f.default is None, f"sampling.{f.name} restates a default ({f.default!r})"


def yaml_files() -> list[Path]:
    found = sorted(p for p in CONF_DIR.glob("*/*.yaml"))
    assert found
    return found


def leaves(tree: dict, prefix: str = "") -> dict[str, object]:
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(leaves(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def stated_in(path: Path) -> dict[str, object]:
    """What a group's YAML file states: its own keys over the presets it selects (an entry
    `/presets/<group>/<name>@_here_` of its defaults list: actors/synth/presets.py). Another
    file of its group that it builds on (model=demo_s2 on demo) is checked on its own."""
    tree = OmegaConf.to_container(OmegaConf.load(path), resolve=False) or {}
    stated = {}
    for entry in tree.pop("defaults", []):
        if entry.startswith("/presets/"):
            group, _, name = entry.removeprefix("/").removesuffix("@_here_").rpartition("/")
            stated |= PRESET_GROUPS[group][name]
    return leaves(stated | tree)


@pytest.mark.parametrize("path", yaml_files(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_no_yaml_value_restates_its_default(path):
    group = path.parent.name
    defaults = leaves(OmegaConf.to_container(OmegaConf.structured(ChorusConfig)[group], resolve=False))
    stated = stated_in(path)
    unknown = set(stated) - set(defaults)
    assert not unknown, f"{path.name}: keys the schema lacks: {unknown}"
    # 8 restates 8.0; true never restates 1 (nor 1 true)
    restated = {
        key: value
        for key, value in stated.items()
        if value == defaults[key] and isinstance(value, bool) == isinstance(defaults[key], bool)
    }
    assert restated == {}, f"{group}/{path.name} restates the default of {restated}: remove it (the dataclass holds it)"


def test_a_preset_is_the_same_with_hydra_and_without():
    # engine=gpu (conf/engine/gpu.yaml selecting the preset) and the preset built in Python
    # (scripts/gpu_job.py, no Hydra) are one engine group
    assert stated_in(CONF_DIR / "engine" / "gpu.yaml") == GPU_ENGINE
    assert compose_typed(["engine=gpu"]).engine == engine_settings("gpu")
    assert compose_typed(["engine=gpu", "engine.max_rows=7"]).engine == engine_settings("gpu", max_rows=7)
