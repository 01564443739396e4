"""Segment chains without an engine (actors/synth/chain.py): a long row is planned into
segments whose prompts carry the segments before them; a result is recorded or rejected, and a
rejected segment is asked for again with the same prompt and a seed of its own. The prompt
builder is the real one, on the tiny checkpoints' tokenizers; results are the engine's type
filled in by hand (what an engine step would return)."""

from __future__ import annotations

import numpy as np
import pytest

from actors import schema as S
from actors.engine.architecture import load_config, with_semantic_ids
from actors.engine.prompt import PromptBuilder
from actors.engine.tokenizer import load_tokenizer
from actors.engine.types import STOP_BUDGET, STOP_EOS, STOP_ERROR, Result, SamplingParams
from actors.synth.budget import FrameBudget
from actors.synth.chain import ChainPlanner, segment_seed
from actors.synth.rows import RowSpec, parse_row
from actors.synth.settings import ActorSettings, LongFormSettings, ModelSettings, SamplingSettings
from helpers import vector_set

POSITIONS = 512


@pytest.fixture(scope="module")
def planner() -> ChainPlanner:
    checkpoint = vector_set("dualar-s1-tiny") / "checkpoint"
    tok = load_tokenizer(checkpoint)
    config = with_semantic_ids(load_config(checkpoint), tok.semantic_begin_id, tok.semantic_end_id, tok.source)
    settings = ActorSettings(
        model=ModelSettings(checkpoint=None, budget=FrameBudget(frames_per_byte=0.1, min_frames=2, max_frames=64)),
        sampling=SamplingSettings(),
        long_form=LongFormSettings(segment_bytes=120),
    )
    return ChainPlanner(settings, PromptBuilder(tok, config), POSITIONS, frozenset(tok.special))


def spec_of(planner: ChainPlanner, text: str, seed: int = 7) -> RowSpec:
    values = {S.ID: "row", S.TEXT: text, S.SEED: seed}
    spec, error = parse_row(0, values, planner.settings, SamplingParams(), lambda values: None)
    assert error is None, error
    return spec


def result(request_id: str, frames: int, stop: str = STOP_BUDGET, codebooks: int = 8) -> Result:
    codes = np.arange(codebooks * frames, dtype=np.int64).reshape(codebooks, frames) % 100
    return Result(request_id, codes, stop, frames=frames, prompt_tokens=10, total_ms=5.0)


TEXT = " ".join(f"Sentence number {i} is here to be spoken aloud." for i in range(12))


def test_a_long_row_is_a_chain_whose_prompts_carry_the_segments_before(planner):
    spec = spec_of(planner, TEXT)
    chain = planner.plan(spec, None)
    segments = len(chain.plan.texts)
    assert segments >= 4 and "".join(chain.plan.texts).replace(" ", "") == TEXT.replace(" ", "")
    assert chain.plan.frames == tuple(2 + int(np.ceil(0.1 * len(t))) for t in chain.plan.texts)
    codebooks = planner.builder.config.num_codebooks
    lengths = []
    for k in range(segments):
        request = chain.request("3.0")
        assert request.request_id == f"3.0#{k}" and request.max_frames == chain.plan.frames[k]
        assert request.sampling.seed == (7 if k == 0 else segment_seed(7, k))
        lengths.append(request.prompt.shape[1])
        assert chain.record(result(request.request_id, 5, codebooks=codebooks), step=10 * k) is None
        assert chain.more == (k < segments - 1)
    assert chain.history[0] == 0 and all(kept >= 1 for kept in chain.history[1:])
    assert lengths[1] > lengths[0]  # segment 1's prompt holds segment 0's text and codes
    joined = chain.joined()
    assert (
        joined.request_id == "3.0"
        and joined.frames == 5 * segments
        and chain.steps == [10 * k for k in range(segments)]
    )
    np.testing.assert_array_equal(joined.codes, np.concatenate([r.codes for r in chain.results], axis=1))


def test_a_rejected_segment_is_asked_for_again_with_the_same_prompt_and_a_new_seed(planner):
    chain = planner.plan(spec_of(planner, TEXT), None)
    codebooks = planner.builder.config.num_codebooks
    first = chain.request("0.0")
    chain.record(result(first.request_id, 4, codebooks=codebooks), step=1)
    before = chain.request("0.0")  # segment 1, attempt 0
    chain.retry()
    again = chain.request("0.0")  # segment 1, attempt 1
    np.testing.assert_array_equal(again.prompt, before.prompt)  # the same history
    assert again.request_id == "0.0#1~1" and again.sampling.seed != before.sampling.seed
    assert again.sampling.seed == segment_seed(7, 1, attempt=1) and len(chain.history) == 2
    chain.record(result(again.request_id, 4, codebooks=codebooks), step=2)
    assert chain.attempt == 0 and chain.request("0.0").request_id == "0.0#2"


def test_a_segment_that_fails_or_makes_no_audio_names_itself(planner):
    codebooks = planner.builder.config.num_codebooks
    chain = planner.plan(spec_of(planner, TEXT), None)
    n = len(chain.plan.texts)
    chain.record(result(chain.request("r").request_id, 3, codebooks=codebooks), step=1)
    empty = chain.record(result(chain.request("r").request_id, 0, STOP_EOS, codebooks=codebooks), step=2)
    assert empty == f"segment 2 of {n}: generation produced no audio (stopped on eos before the first frame)"
    one = planner.plan(spec_of(planner, "Short."), None)
    assert len(one.plan.texts) == 1 and one.label(0) == ""
    failed = Result("x#0", np.zeros((codebooks, 0), np.int64), STOP_ERROR, error="prompt is empty")
    one.request("x")
    assert one.record(failed, step=1) == "generation: prompt is empty"
