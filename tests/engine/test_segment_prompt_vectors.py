"""Segment k's prompt (PromptBuilder.build_segment) against upstream-made S2 vectors.

The expected matrices were made by running upstream fish-speech's `generate_long` (with its
generation stubbed to return fixed codes) on the tiny S2 checkpoint's tokenizer; see
tests/vectors/upstream-segment-prompts/README.md. The inputs are those of
test_segment_k_matches_upstream_conversation in tests/engine/test_segment_prompt.py."""

import hashlib
import re

import numpy as np
import pytest

from actors.engine.architecture import load_config, with_semantic_ids
from actors.engine.prompt import PreviousSegment, PromptBuilder
from actors.engine.tokenizer import load_tokenizer
from helpers import vector_set

TEXTS = ["First segment, café.", "<|speaker:0|>Second one.\n<|speaker:1|>Third voice!", "Last words."]


@pytest.fixture(scope="module")
def setup():
    checkpoint = vector_set("dualar-s2-tiny") / "checkpoint"
    tok = load_tokenizer(checkpoint)
    config = with_semantic_ids(load_config(checkpoint), tok.semantic_begin_id, tok.semantic_end_id, tok.source)
    return PromptBuilder(tok, config), config


def random_codes(config, frames, seed):
    return np.random.default_rng(seed).integers(0, config.codebook_size, (config.num_codebooks, frames))


@pytest.mark.parametrize("k", [0, 1, 2])
@pytest.mark.parametrize("with_reference", [True, False])
def test_segment_k_matches_upstream_vector(setup, with_reference, k):
    builder, config = setup
    name = f"s2_{'ref' if with_reference else 'noref'}_k{k}.npy"
    expected = np.load(vector_set("upstream-segment-prompts") / name)
    assert expected.dtype == np.int64 and expected.shape[0] == 1 + config.num_codebooks

    codes = [random_codes(config, n, 10 + n) for n in (5, 3)]
    prompt = builder.build_segment(
        TEXTS[k],
        [PreviousSegment(t, c) for t, c in zip(TEXTS[:k], codes[:k])],
        ref_text="Hi." if with_reference else None,
        ref_codes=random_codes(config, 7, 1) if with_reference else None,
    )
    assert prompt.tokens.dtype == np.int64
    assert prompt.tokens.shape == expected.shape, name
    diff = np.argwhere(prompt.tokens != expected)
    assert diff.size == 0, f"{name}: first difference at [row, column] {diff[0].tolist()}"
    assert prompt.history_kept == k


def test_the_vectors_are_the_files_their_readme_describes():
    folder = vector_set("upstream-segment-prompts")
    listed = dict(re.findall(r"\| `(s2_\w+\.npy)` \| \d+ \| `([0-9a-f]{64})` \|", (folder / "README.md").read_text()))
    assert sorted(listed) == sorted(p.name for p in folder.glob("*.npy")) and len(listed) == 6
    for name, digest in listed.items():
        assert hashlib.sha256((folder / name).read_bytes()).hexdigest() == digest, name
