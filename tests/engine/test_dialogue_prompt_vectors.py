"""A dialogue row's turn prompts against upstream-made S2 vectors for two and three voices.

The expected matrices were made by running upstream fish-speech's `generate_long` (generation
stubbed to return fixed codes) with several prompt texts and prompt codes on the tiny S2
checkpoint's tokenizer: tests/vectors/upstream-dialogue-prompts/README.md says how, with these
inputs. Here the row goes through chorus's own path: its text split into turns, each turn a
segment (ChainPlanner), each turn's prompt built with every voice and the turns before it."""

import hashlib
import re

import numpy as np
import pytest

from actors import schema as S
from actors.engine.architecture import load_config, with_semantic_ids
from actors.engine.prompt import PromptBuilder
from actors.engine.tokenizer import load_tokenizer
from actors.engine.types import STOP_EOS, Result, SamplingParams
from actors.synth.budget import FrameBudget
from actors.synth.chain import ChainPlanner
from actors.synth.rows import RefSpec, VoiceSpec, parse_row
from actors.synth.settings import ActorSettings, ModelSettings
from helpers import vector_set

FOLDER = "upstream-dialogue-prompts"


def rng(seed: int, frames: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 96, (5, frames))


# name -> (voice texts, voice codes, text, the codes "generated" for each turn)
CASES = {
    "s2_two_voices": (
        ["Hi there.", "Hello."],
        [rng(1, 7), rng(2, 6)],
        "<|speaker:0|>Good morning, café.<|speaker:1|> Morning! How are you?\n<|speaker:0|>Fine, thanks.",
        [rng(15, 5), rng(14, 4), rng(13, 3)],
    ),
    "s2_three_voices": (
        ["One.", "<|speaker:1|>Two voice.", "Third speaker here."],
        [rng(3, 5), rng(4, 6), rng(5, 4)],
        "<|speaker:2|>Start.<|speaker:0|>Then me.<|speaker:1|>And me, too!<|speaker:2|>Back again.",
        [rng(24, 4), rng(23, 3), rng(25, 5), rng(22, 2)],
    ),
}


@pytest.fixture(scope="module")
def planner() -> ChainPlanner:
    checkpoint = vector_set("dualar-s2-tiny") / "checkpoint"
    tok = load_tokenizer(checkpoint)
    config = with_semantic_ids(load_config(checkpoint), tok.semantic_begin_id, tok.semantic_end_id, tok.source)
    settings = ActorSettings(
        model=ModelSettings(checkpoint=None, budget=FrameBudget(max_frames=64, frames_per_byte=None))
    )
    return ChainPlanner(settings, PromptBuilder(tok, config), 4096, frozenset(tok.special))


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_turn_prompt_is_upstreams(planner, name):
    texts, codes, text, generated = CASES[name]
    voices = tuple(VoiceSpec(RefSpec(f"codes:{i}", codes=c), t) for i, (t, c) in enumerate(zip(texts, codes)))
    values = {S.ID: name, S.TEXT: text, S.VOICES: [{S.VOICE_TEXT: t} for t in texts]}
    spec, error = parse_row(0, values, planner.settings, SamplingParams(), lambda values: voices)
    assert error is None, error
    chain = planner.plan(spec, codes)
    assert len(chain.plan.texts) == len(generated)  # one segment per turn
    for k, frames in enumerate(generated):
        expected = np.load(vector_set(FOLDER) / f"{name}_k{k}.npy")
        prompt = chain.prompt()
        assert prompt.tokens.shape == expected.shape, (name, k)
        diff = np.argwhere(prompt.tokens != expected)
        assert diff.size == 0, f"{name} turn {k}: first difference at [row, column] {diff[0].tolist()}"
        assert prompt.history_kept == k
        # every turn shares the voices' part: one prefix, reused
        assert prompt.prefix_len == chain.planner.builder.build("x", references=chain.references).prefix_len
        chain.record(Result(f"{name}#{k}", frames, STOP_EOS, frames=frames.shape[1]), step=k)
    assert not chain.more


def test_the_vectors_are_the_files_their_readme_describes():
    folder = vector_set(FOLDER)
    listed = dict(re.findall(r"\| `(s2_\w+\.npy)` \| \d+ \| `([0-9a-f]{64})` \|", (folder / "README.md").read_text()))
    assert sorted(listed) == sorted(p.name for p in folder.glob("*.npy")) and len(listed) == 7
    for name, digest in listed.items():
        assert hashlib.sha256((folder / name).read_bytes()).hexdigest() == digest, name
