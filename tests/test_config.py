"""One config object from Hydra to the engine: the actor's groups reach it as the typed
dataclasses of actors/synth/settings.py (not dicts re-read with defaults of their own), and each
group's range checks -- its dataclass's validate() -- refuse bad settings before Ray starts,
naming the key."""

from __future__ import annotations

import pickle
from dataclasses import fields

import pytest

from actors.engine.settings import compile_mode
from actors.errors import ConfigError
from actors.quality.settings import QualitySettings
from actors.synth import SynthActor
from actors.synth.job_settings import ClusterSettings, DataSettings, OutputSettings
from actors.synth.settings import ActorSettings, EngineSettings, LongFormSettings, ModelSettings, SamplingSettings
from pipeline.cluster import Cluster
from pipeline.config import compose, compose_typed, typed
from pipeline.run.actor_settings import ACTOR_GROUPS, actor_arguments
from pipeline.run.steps import run
from tests.helpers import REPO

TYPES = {
    "model": ModelSettings,
    "data": DataSettings,
    "engine": EngineSettings,
    "long_form": LongFormSettings,
    "sampling": SamplingSettings,
    "quality": QualitySettings,
    "output": OutputSettings,
    "cluster": ClusterSettings,
}


def test_the_actor_receives_its_groups_as_dataclasses(tmp_path):
    config = compose_typed(
        [
            "data.max_text_chars=100",
            "long_form.segment_bytes=64",
            "sampling.temperature=0.5",
            "engine.codec_batch_rows=3",
            "engine.compile=true",  # Hydra makes a bool of it; the engine reads it as on
            f"data.audio_root=file://{tmp_path}",
        ]
    )
    args = actor_arguments(config, "/input/dir", run_id="typed")
    actor = args["settings"]
    assert set(ACTOR_GROUPS) == set(TYPES)
    for group, kind in TYPES.items():
        assert type(getattr(actor, group)) is kind, group
    assert actor.data.max_text_chars == 100 and actor.long_form.segment_bytes == 64
    assert actor.sampling.temperature == 0.5 and actor.engine.codec_batch_rows == 3
    assert compile_mode(actor.engine.compile) == "on" and actor.engine.engine_config().compile == actor.engine.compile
    # resolved: interpolations and URIs are values by now, the input's directory its own setting
    assert actor.data.name == "demo" and actor.data.audio_root == str(tmp_path)
    assert actor.run.input_dir == "/input/dir" and "input_dir" not in {f.name for f in fields(DataSettings)}
    # Ray ships them to every actor
    assert pickle.loads(pickle.dumps(args)) == args


def test_blocks_in_flight_cover_the_slots_unless_set():
    """engine.max_concurrent_blocks null: enough blocks of cluster.rows_per_block rows for the
    slots and the feed queue, plus two; the actor and its Ray stage get the resolved number."""

    def blocks(*overrides):
        return actor_arguments(compose_typed(list(overrides)), None, run_id="blocks")[
            "settings"
        ].engine.max_concurrent_blocks

    assert blocks("engine.max_rows=16", "engine.feed_queue_rows=8", "cluster.rows_per_block=16") == 2 + 2
    assert blocks("engine.max_rows=64", "engine.feed_queue_rows=0", "cluster.rows_per_block=8") == 8 + 2
    assert blocks("engine.max_rows=64", "cluster.rows_per_block=8", "engine.max_concurrent_blocks=3") == 3
    # a small job: no more than each actor's share of the input's blocks, so the actor that
    # starts first cannot take every block while the others idle
    small = compose_typed(["engine.max_rows=8", "cluster.rows_per_block=6", "cluster.num_actors=2"])
    for rows, expected in ((12, 1), (30, 3), (10_000, 3 + 2)):
        assert actor_arguments(small, None, run_id="b", rows=rows)["settings"].engine.max_concurrent_blocks == expected


def test_actor_restarts_grow_with_the_input_unless_set():
    """cluster.max_actor_restarts null: 10 restarts for deaths that are no row's fault, plus
    the cost of one actor-killing row (crash_quarantine_after + 1 deaths) per 100 blocks an
    actor takes: a long job survives a few such rows, and nothing restarts forever."""
    from pipeline.run.synthesis import actor_restarts

    def restarts(rows, *overrides):
        return actor_restarts(compose_typed(["cluster.rows_per_block=16", *overrides]).cluster, rows)

    assert restarts(100) == 10 + 3  # a small job: room for one such row (and ten other deaths)
    assert restarts(16 * 100) == 10 + 3
    assert restarts(16 * 101) == 10 + 2 * 3
    assert restarts(1_000_000, "cluster.num_actors=8") == 10 + 3 * 79  # 7,813 blocks an actor
    assert restarts(1_000_000, "cluster.crash_quarantine_after=1", "cluster.max_task_retries=2") == 10 + 2 * 625
    assert restarts(1_000_000, "cluster.max_actor_restarts=4") == 4  # set: taken as it is


def test_defaults_are_the_dataclasses():
    """What a run composes with no overrides is what the dataclasses say, for every key the
    YAML groups leave alone (the demo groups set data.path and a few engine keys)."""
    args = actor_arguments(compose_typed(), None, run_id="defaults")["settings"]
    assert args.long_form == LongFormSettings()
    assert args.sampling == SamplingSettings()
    assert args.quality == QualitySettings()
    data = args.data
    for f in fields(DataSettings):
        if f.name not in ("path", "name"):
            assert getattr(data, f.name) == getattr(DataSettings(), f.name), f.name


def test_the_text_byte_cap_admits_every_text_within_max_text_chars():
    # the cap that refuses a 20 MB text before tokenizing must not refuse a 50,000-character
    # Chinese chapter (3 bytes a character) that max_text_chars admits
    data = DataSettings()
    assert data.max_text_chars == 50_000
    for char in ("a", "Ж", "語", "😀"):
        assert len((char * data.max_text_chars).encode("utf-8")) <= data.text_byte_limit
    assert DataSettings(max_text_chars=10).text_byte_limit == 40
    assert DataSettings(max_text_bytes=100).text_byte_limit == 100  # set: taken as it is


@pytest.mark.parametrize(
    "override, message",
    [
        ("long_form.segment_bytes=10", "long_form.segment_bytes must be >= 16, got 10"),
        ("long_form.max_turns=0", "long_form.max_turns must be >= 1, got 0"),
        ("long_form.history_fraction=1.0", r"long_form.history_fraction must be in \[0, 1\), got 1.0"),
        ("data.max_text_chars=0", "data.max_text_chars must be >= 1, got 0"),
        ("data.max_reference_bytes=0", "data.max_reference_bytes must be >= 1, got 0"),
        ("data.reference_timeout_s=0", "data.reference_timeout_s must be > 0"),
        ("data.uri_schemes=[s3,S3]", "data.uri_schemes must be lowercase URI schemes .* got 'S3'"),
        ("sampling.top_p=0", "sampling.top_p 0 is outside"),
        ("sampling.repetition_penalty=0", "sampling.repetition_penalty must be > 0"),
        ("sampling.ras_window=-1", "sampling.ras_window"),
        ("model.device=gpu", "model.device must be .* got 'gpu'"),
        ("model.dtype=half", "model.dtype must be auto or one of .* got 'half'"),
        ("model.codec_dtype=half", "model.codec_dtype must be auto or one of .* got 'half'"),
        ("engine.max_concurrent_blocks=0", "engine.max_concurrent_blocks must be >= 1, got 0"),
        ("engine.feed_queue_rows=-1", "engine.feed_queue_rows must be >= 0, got -1"),
        ("engine.compile=sometimes", "engine.compile must be one of off, on, auto .* got 'sometimes'"),
        ("output.channels=stereo", "output.channels must be one of mono, per_speaker, got 'stereo'"),
        ("data.max_voices=0", "data.max_voices must be >= 1, got 0"),
        ("model.demo_family=s3", "model.demo_family must be one of s1, s2, got 's3'"),
    ],
)
def test_bad_settings_are_refused_before_ray_starts(tmp_path, monkeypatch, override, message):
    def connect(cluster):
        raise AssertionError("Ray was started")

    monkeypatch.setattr(Cluster, "connect", connect)
    with pytest.raises(ConfigError, match=message):
        run(compose_typed([override, f"output.dir={tmp_path}/out"]))
    assert not (tmp_path / "out").exists()


GROUP_OPTIONS = [
    (group.name, option.stem)
    for group in sorted((REPO / "conf").iterdir())
    if group.is_dir()
    for option in sorted(group.glob("*.yaml"))
]


@pytest.mark.parametrize("group, option", GROUP_OPTIONS)
def test_every_shipped_group_option_passes_its_checks(group, option):
    required = ["data.path=/in.parquet"]  # data=parquet names no table
    if group == "model" and option != "demo":
        required.append("model.checkpoint=/ckpt")  # a real model needs its checkpoint
    compose_typed([f"{group}={option}", *required])


def test_the_actor_refuses_dicts_and_bad_values_before_loading_anything(monkeypatch):
    import actors.engine

    def load_model(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(actors.engine, "load_model", load_model)
    typed = {"model": ModelSettings(checkpoint=None), "engine": EngineSettings(), "sampling": SamplingSettings()}
    for group, plain in [("model", {"checkpoint": None}), ("engine", {}), ("sampling", {"seed": 0})]:
        with pytest.raises(TypeError, match=f"SynthActor's {group} must be a {TYPES[group].__name__}"):
            SynthActor(ActorSettings(**{**typed, group: plain}))
    with pytest.raises(TypeError, match="SynthActor's data must be a DataSettings"):
        SynthActor(ActorSettings(**typed, data={"max_text_chars": 10}))
    # a caller that builds the actor itself (tests, encode_refs) gets the driver's checks
    with pytest.raises(ConfigError, match="long_form.segment_bytes must be >= 16"):
        SynthActor(ActorSettings(**typed, long_form=LongFormSettings(segment_bytes=10)))
    with pytest.raises(ConfigError, match="engine.codec_batch_rows must be >= 1"):
        SynthActor(ActorSettings(**{**typed, "engine": EngineSettings(codec_batch_rows=0)}))
    with pytest.raises(TypeError, match="SynthActor takes an ActorSettings"):
        SynthActor(typed)


def test_a_config_built_without_the_schema_is_typed_by_it():
    """A run config made with OmegaConf.create (a notebook, a script) gets the same
    dataclasses and the same checks as a composed one."""
    from omegaconf import OmegaConf

    untyped = OmegaConf.create(OmegaConf.to_container(compose(["long_form.max_turns=3"]), resolve=False))
    args = actor_arguments(typed(untyped), None, run_id="untyped")["settings"]
    assert type(args.long_form) is LongFormSettings and args.long_form.max_turns == 3
    untyped.long_form.segment_bytes = 10
    with pytest.raises(ConfigError, match="long_form.segment_bytes must be >= 16, got 10"):
        typed(untyped)
