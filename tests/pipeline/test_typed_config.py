"""The typed config records what the plain one did: the driver once read the run config as
plain dicts (`OmegaConf.to_container(cfg, resolve=True)`), and outputs written then hold row
hashes made from that and a config snapshot written from the Hydra object. Reading
ChorusConfig instead must leave both as they were, or every row of an existing output would
count as changed and be redone."""

from __future__ import annotations

import hashlib
import json

import pytest
from omegaconf import OmegaConf

from pipeline.config import as_yaml, compose, typed
from pipeline.plan.identity import _ROW_SETTINGS, BUDGET_AS_HASHED, settings_digest

CONFIGS = [
    [],
    ["model=demo_s2", "data=demo_dialogue"],
    ["sampling=greedy"],
    ["quality=strict"],
    ["engine=gpu", "cluster=gpu"],
    ["model=s2_pro", "model.checkpoint=/ckpt/s2-pro", "model.dtype=bfloat16"],
    [
        "model.budget.frames_per_byte=2.5",
        "engine.compile=true",
        "data.audio_root=s3://bucket/clips",
        "data.max_text_bytes=4096",
        "data.columns.text=sentence",
        "long_form.max_turns=2",
        "sampling.temperature=0.5",
        "output.keep_codes=false",
        "output.channels=per_speaker",
    ],
]


# settings_digest as it was when the driver read plain dicts (f88eea5), over the same keys: the
# bytes hashed then are the bytes existing outputs hold
def _settings_digest_from_plain(plain: dict, fingerprint: str) -> str:
    relevant = {
        "model": {
            "name": plain["model"]["name"],
            "fingerprint": fingerprint,
            "dtype": plain["model"]["dtype"],
            "codec_dtype": plain["model"]["codec_dtype"],
        },
        "sampling": plain["sampling"],
        "keep_codes": plain["output"]["keep_codes"],
        **{group: {k: plain[group].get(k) for k in keys} for group, keys in _ROW_SETTINGS.items()},
    }
    # the budget, once engine.max_frames / frames_per_char / min_frames, is the model's now
    budget = plain["model"]["budget"]
    relevant["engine"].update({hashed: budget[name] for hashed, name in BUDGET_AS_HASHED.items()})
    if budget["on_cut"] != "accept":
        relevant["engine"]["on_budget_cut"] = budget["on_cut"]
    return hashlib.blake2b(json.dumps(relevant, sort_keys=True).encode(), digest_size=16).hexdigest()


@pytest.mark.parametrize("overrides", CONFIGS, ids=lambda o: " ".join(o) or "defaults")
def test_row_settings_digest_is_the_plain_configs(overrides):
    cfg = compose(overrides)
    plain = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    assert settings_digest(typed(cfg), "fingerprint") == _settings_digest_from_plain(plain, "fingerprint")


@pytest.mark.parametrize("overrides", CONFIGS, ids=lambda o: " ".join(o) or "defaults")
def test_config_snapshot_is_the_hydra_objects(overrides):
    cfg = compose(overrides)
    assert as_yaml(typed(cfg)) == OmegaConf.to_yaml(cfg, resolve=True)


def test_every_group_reads_as_its_plain_container():
    """What asdict gives of each group is what the plain config held (lists stay lists, None
    stays None, nested columns a dict), so anything hashed or written from them is unchanged."""
    from dataclasses import asdict

    cfg = compose(CONFIGS[-1])
    config, plain = typed(cfg), OmegaConf.to_container(cfg, resolve=True)
    assert {group: asdict(getattr(config, group)) for group in plain} == plain
