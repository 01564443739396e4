"""Frame budgets are the model's (issue 57, actors/synth/budget.py): a real-format checkpoint
(the demo's own files, in the S1 on-disk format, loaded as model=s1_mini) on engine=cpu gets
real speech's budget, not the demo's short one; a segment its budget cut is generated again
with a larger budget (the same seed: what that budget gives at once) up to the ceiling, then
`rejected` naming the cut; `ok` only where the user asks (model.budget.on_cut=accept, a
max_frames column, EOS off). The demo keeps its short budget and its cut rows stay ok."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from actors import schema as S
from actors.synth import SynthActor, Trace
from actors.synth.budget import FrameBudget
from actors.synth.demo_models import demo_assets
from helpers import text_rows, tune
from pipeline.config import compose_typed
from pipeline.run.actor_settings import actor_arguments

TEXT = "Hello there, how are you?"  # 25 bytes: real speech's budget 16 + 2.5 x 25 = 79 frames
CEILING = 100


def test_a_budget_counts_utf8_bytes_and_grows_to_its_ceiling():
    budget = FrameBudget()  # real speech's
    assert budget.frames("Hello there, how are you?") == 16 + math.ceil(2.5 * 25)
    # four Chinese characters take about as long as twelve English letters: 3 bytes each
    assert budget.frames("你好世界") == budget.frames("twelve bytes") == 16 + 30
    assert budget.frames("x" * 10_000) == 1024 and FrameBudget(frames_per_byte=None).frames("x") == 1024
    assert [budget.grown(79, room) for room in (4096, 120, 79)] == [158, 120, None]
    assert budget.grown(1000, 4096) == 1024 and budget.grown(1024, 4096) is None
    assert FrameBudget(on_cut="reject").grown(79, 4096) is None and FrameBudget(on_cut="accept").grown(79, 4096) is None


@pytest.fixture(scope="module")
def real_actor() -> SynthActor:
    model, codec = demo_assets()  # the demo's own files, built once per cache
    settings = [
        "model=s1_mini",
        f"model.checkpoint={model}",
        f"model.codec={codec}",
        "engine=cpu",
        "model.dtype=float32",
        "model.codec_dtype=float32",
        f"model.budget.max_frames={CEILING}",  # the ceiling, low: a quick test
        "engine.codec_process=false",
        # greedy: the random model's argmax never draws <|im_end|> in 100 frames, so every
        # budget cuts it, the same every run (a sampled row ends by chance now and then)
        "sampling=greedy",
    ]
    config = compose_typed(settings)
    budget = config.model.budget
    assert (budget.frames_per_byte, budget.min_frames, budget.on_cut) == (2.5, 16, "grow")  # not the demo's
    return SynthActor(**actor_arguments(config, None, run_id="budgets"), recorder=Trace())


def cut_at(monkeypatch, actor, on_cut: str) -> None:
    """model.budget.on_cut for one test (every part reads the model group's budget at each use)."""
    monkeypatch.setattr(actor.settings.model, "budget", replace(actor.settings.model.budget, on_cut=on_cut))


def one(actor, **row) -> dict:
    return actor(text_rows([{S.ID: "r", S.TEXT: TEXT, S.SEED: 11, **row}])).to_pylist()[0]


@pytest.mark.slow
def test_a_real_checkpoint_on_cpu_gets_real_speechs_budget_and_a_cut_row_is_not_ok(real_actor, monkeypatch):
    # the random model never ends on its own: each budget cuts it, so it grows 79 -> 100 (the
    # ceiling, not 158), where every attempt is cut too: rejected, naming the cut
    row = one(real_actor)
    assert row[S.STATUS] == S.STATUS_REJECTED and "truncated" in row[S.QUALITY_FLAGS], row
    assert row[S.MAX_FRAMES] == CEILING and row[S.N_FRAMES] == CEILING
    assert f"cut off by its frame budget of {CEILING} frames" in row[S.ERROR]
    assert "model.budget.on_cut=accept" in row[S.ERROR]
    assert row[S.ATTEMPTS] == 3 and row[S.DISCARDED_FRAMES] == 79 + 2 * CEILING

    # the budget grew with the same seed: the kept attempt's first 79 frames are what the
    # 79-frame budget gives, which on_cut=accept keeps as it is (ok, flagged)
    cut_at(monkeypatch, real_actor, "accept")
    accepted = one(real_actor)
    assert accepted[S.STATUS] == S.STATUS_OK and accepted[S.QUALITY_FLAGS] == ["truncated"]
    assert accepted[S.MAX_FRAMES] == accepted[S.N_FRAMES] == 79 and accepted[S.ERROR] is None
    assert [codes[:79] for codes in row[S.CODES]] == accepted[S.CODES]


@pytest.mark.slow
def test_a_budget_the_user_chose_is_kept_as_it_is(real_actor, monkeypatch):
    chosen = one(real_actor, **{S.MAX_FRAMES: 30})  # a max_frames column: the row's own budget
    assert chosen[S.STATUS] == S.STATUS_OK and chosen[S.N_FRAMES] == chosen[S.MAX_FRAMES] == 30
    assert chosen[S.ATTEMPTS] == 1 and chosen[S.DISCARDED_FRAMES] == 0
    tune(monkeypatch, real_actor, "engine", stop_on_eos=False)  # every row runs to its budget, by request
    assert one(real_actor)[S.STATUS] == S.STATUS_OK


@pytest.mark.slow
def test_on_cut_reject_regenerates_at_the_same_budget(real_actor, monkeypatch):
    cut_at(monkeypatch, real_actor, "reject")
    row = one(real_actor)
    assert row[S.STATUS] == S.STATUS_REJECTED and row[S.MAX_FRAMES] == 79 and row[S.ATTEMPTS] == 3
    assert "cut off by its frame budget of 79 frames" in row[S.ERROR]


def test_the_demo_keeps_its_short_budget(small_settings):
    demo = compose_typed([])
    assert (demo.model.budget.max_frames, demo.model.budget.on_cut) == (48, "accept")
    settings = [s for s in small_settings if not s.startswith("model.budget")] + ["engine.stop_on_eos=true"]
    actor = SynthActor(**actor_arguments(compose_typed(settings), None, run_id="demo"))
    row = one(actor)
    # 8 + 0.5 x 25 bytes: cut there (or ended earlier by a chance <|im_end|>), and ok either way
    assert row[S.MAX_FRAMES] == 21 and row[S.STATUS] == S.STATUS_OK and row[S.ATTEMPTS] == 1
