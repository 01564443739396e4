"""The actor's settings built as plain dataclasses, as a caller without Hydra builds them
(scripts/gpu_job.py on the lent GPU image): every default is a value, not an OmegaConf
interpolation, and the demo's cache directory is the node's $CHORUS_CACHE."""

from __future__ import annotations

import dataclasses
import typing

from actors.synth.loading import model_paths
from actors.synth.settings import ActorSettings, ModelSettings, RunGroups
from pipeline.config import compose_typed
from pipeline.run.actor_settings import actor_arguments


def string_defaults(kind: type, prefix: str = "") -> dict[str, str]:
    """Every str default under a settings dataclass, by its key."""
    found, hints = {}, typing.get_type_hints(kind)
    for f in dataclasses.fields(kind):
        value = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        if dataclasses.is_dataclass(hints[f.name]):
            found |= string_defaults(hints[f.name], f"{prefix}{f.name}.")
        elif isinstance(value, str):
            found[f"{prefix}{f.name}"] = value
    return found


# interpolations the driver resolves for itself: the actor reads neither key
DRIVERS_OWN = {"data.name", "output.dir"}


def test_no_default_the_actor_reads_is_an_interpolation():
    defaults = string_defaults(RunGroups)
    assert "model.name" in defaults and DRIVERS_OWN <= set(defaults)  # the walk reaches the groups' fields
    assert {key: value for key, value in defaults.items() if "${" in value and key not in DRIVERS_OWN} == {}


def test_the_demo_is_built_in_the_nodes_cache_without_hydra(tmp_path, monkeypatch):
    monkeypatch.setenv("CHORUS_CACHE", str(tmp_path / "node-cache"))
    monkeypatch.chdir(tmp_path)  # a literal folder would land here
    settings = ActorSettings(model=ModelSettings(checkpoint=None))  # the demo
    settings.validate()
    checkpoint, codec = model_paths(settings.model)
    assert checkpoint.is_relative_to(tmp_path / "node-cache") and (checkpoint / "config.json").is_file()
    assert codec.is_relative_to(tmp_path / "node-cache")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["node-cache"]


def test_a_run_passes_the_drivers_cache_on(tmp_path, monkeypatch):
    monkeypatch.setenv("CHORUS_CACHE", str(tmp_path / "driver-cache"))
    settings = actor_arguments(compose_typed([]), str(tmp_path), run_id="cache")["settings"]
    assert settings.model.cache_dir == str(tmp_path / "driver-cache")
    monkeypatch.delenv("CHORUS_CACHE")
    assert actor_arguments(compose_typed([]), str(tmp_path), run_id="cache")["settings"].model.cache_dir is None
    configured = compose_typed([f"model.cache_dir={tmp_path / 'set'}"])
    assert actor_arguments(configured, str(tmp_path), run_id="cache")["settings"].model.cache_dir == str(
        tmp_path / "set"
    )
    assert ModelSettings().cache_dir is None
