"""The driver's run config, without Ray: the defaults, typos and wrong types, checkpoints a
real model needs, the engine groups, and settings that cannot work
refused before any work."""

from __future__ import annotations

from dataclasses import asdict

import pytest
from hydra.errors import ConfigCompositionException, MissingConfigException
from omegaconf.errors import MissingMandatoryValue

from actors.engine.settings import EngineConfig
from pipeline.config import compose, compose_typed
from pipeline.errors import ConfigError
from pipeline.run.steps import run
from tests.helpers import REPO


def test_defaults_run_the_demo():
    config = compose_typed()
    assert config.model.checkpoint is None and config.model.name == "demo-s1-tiny"
    assert config.data.path == str(REPO / "data" / "demo" / "demo.parquet")
    # named after the input and a hash of where it is: two inputs of one name never share one
    assert config.output.dir.startswith("outputs/demo-") and len(config.output.dir) == len("outputs/demo-") + 6
    same_name = [compose_typed(["data=parquet", f"data.path=/data/{d}/input.parquet"]).output.dir for d in "ab"]
    assert same_name[0] != same_name[1] and all(d.startswith("outputs/input-") for d in same_name)
    assert compose_typed(["data=parquet", "data.path=/data/a/input.parquet"]).output.dir == same_name[0]
    # the budget is the model's: the demo's short one, real speech's for a checkpoint, on any engine
    assert (config.model.budget.max_frames, config.model.budget.on_cut) == (48, "accept")
    for engine in ("cpu", "gpu"):
        real = compose_typed(["model=s1_mini", "model.checkpoint=/ckpt", f"engine={engine}"]).model.budget
        assert (real.max_frames, real.frames_per_byte, real.min_frames, real.on_cut) == (1024, 2.5, 16, "grow")
    assert 0 < config.cluster.cpus_per_actor < 1  # never a whole CPU on the default local run
    # the demo's dialogue rows are a table of their own, for the S2 demo (S1 refuses several voices)
    dialogue = compose_typed(["model=demo_s2", "data=demo_dialogue"])
    assert dialogue.data.path == str(REPO / "data" / "demo" / "dialogue.parquet")
    assert dialogue.model.name == "demo-s2-tiny"


@pytest.mark.parametrize(
    "override",
    [
        "model.chekpoint=/x",
        "cluster.num_actors=two",
        "engine.max_rows=1.5",
        "output.keep_codes=maybe",
        "colour=blue",
        "engine=warp",
    ],
)
def test_typos_and_wrong_types_are_rejected(override):
    with pytest.raises((ConfigCompositionException, MissingConfigException)) as info:
        compose([override])
    assert override.split("=")[0] in str(info.value)


def test_real_models_need_a_checkpoint_path():
    with pytest.raises(MissingMandatoryValue):
        compose_typed(["model=s1_mini"])
    model = compose_typed(["model=s2_pro", "model.checkpoint=/ckpt/s2-pro"]).model
    assert model.checkpoint == "/ckpt/s2-pro" and model.name == "s2-pro"


def test_every_engine_setting_is_a_key_of_the_run_config():
    # one object from Hydra to the engine (that no YAML file restates a default:
    # tests/test_config_defined_once.py)
    assert set(asdict(EngineConfig())) <= set(asdict(compose_typed().engine))


@pytest.mark.parametrize(
    "override",
    ["engine.max_rows=0", "engine.prefill_chunk=0", "engine.codec_batch_rows=0", "model.budget.frames_per_byte=-1"],
)
def test_out_of_range_engine_settings_are_named_before_any_work(tmp_path, override):
    with pytest.raises(ConfigError, match=override.split("=")[0]):
        run(compose_typed([override, f"output.dir={tmp_path}/out"]))
    assert not (tmp_path / "out").exists()


def test_settings_that_cannot_work_fail_early(tmp_path):
    for overrides, message in [
        (["cluster.num_actors=0"], "num_actors"),
        (["output.progress_bar=sometimes"], "progress_bar"),
        (["cluster.crash_on_batch=2"], "crash_marker"),
        (["sampling.temperature=1e39"], "temperature 1e\\+39 is outside"),
        (["sampling.top_k=2147483648"], "top_k 2147483648 is outside"),
        (["cluster.max_task_retries=2", "cluster.crash_quarantine_after=2"], "must exceed"),
        (["output.on_change=ignore"], "on_change"),
        (["model=s1_mini", f"model.checkpoint={tmp_path}"], "no config.json"),
    ]:
        with pytest.raises(ConfigError, match=message):
            run(compose_typed(overrides + [f"output.dir={tmp_path}/out"]))
