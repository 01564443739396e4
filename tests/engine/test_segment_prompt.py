"""Segment k's prompt (PromptBuilder.build_segment) against upstream's conversation format.

The expected matrices are written here from upstream's encoding rules, not from the builder:
a conversation is a list of parts; each text part is tokenized on its own; a code part [C, n]
becomes n columns with row 0 = semantic_begin_id + codebook 0 and rows 1.. = the codes. For
S2, `generate_long` appends per segment a user message and then an assistant voice message
holding the generated codes; each message is `<|im_start|>{role}\\n{modality token}`, its
parts, `<|im_end|>\\n` (the message being generated has no end). For S1, a text + codes pair
is `<|speaker:0|>`, text, codes, `<|im_end|>` (the interleave sequence's `append(...,
add_end=True, speaker=0)`)."""

import numpy as np
import pytest

from actors.engine.architecture import load_config, with_semantic_ids
from actors.engine.prompt import PreviousSegment, PromptBuilder, PromptError
from actors.engine.tokenizer import load_tokenizer
from helpers import vector_set

SYSTEM_REF = "convert the provided text to speech reference to the following:\n\nText:\n"


@pytest.fixture(scope="module", params=["dualar-s1-tiny", "dualar-s2-tiny"])
def setup(request):
    checkpoint = vector_set(request.param) / "checkpoint"
    tok = load_tokenizer(checkpoint)
    config = with_semantic_ids(load_config(checkpoint), tok.semantic_begin_id, tok.semantic_end_id, tok.source)
    return PromptBuilder(tok, config), tok, config


def encode_parts(tok, config, parts) -> np.ndarray:
    columns = []
    for part in parts:
        if isinstance(part, str):
            ids = tok.encode(part)
            col = np.zeros((1 + config.num_codebooks, len(ids)), np.int64)
            col[0] = ids
        else:
            col = np.concatenate([part[:1] + config.semantic_begin_id, part], axis=0)
        columns.append(col)
    return np.concatenate(columns, axis=1)


def upstream_s2_parts(ref_text, ref_codes, previous, text):
    parts = ["<|im_start|>system\n"]
    if ref_codes is not None:
        parts += [SYSTEM_REF, "<|speaker:0|>" + ref_text, "\n\nSpeech:\n", ref_codes]
    else:
        parts += ["convert the provided text to speech"]
    parts += ["<|im_end|>\n"]
    for prev_text, prev_codes in previous:
        parts += ["<|im_start|>user\n", prev_text, "<|im_end|>\n"]
        parts += ["<|im_start|>assistant\n<|voice|>", prev_codes, "<|im_end|>\n"]
    parts += ["<|im_start|>user\n", text, "<|im_end|>\n", "<|im_start|>assistant\n<|voice|>"]
    return parts


def upstream_s1_parts(ref_text, ref_codes, previous, text):
    parts = ["<|interleave|>"]
    if ref_codes is not None:
        parts += ["<|speaker:0|>", ref_text, ref_codes, "<|im_end|>"]
    for prev_text, prev_codes in previous:
        parts += ["<|speaker:0|>", prev_text, prev_codes, "<|im_end|>"]
    parts += ["<|speaker:0|>", text]
    return parts


def random_codes(config, frames, seed):
    return np.random.default_rng(seed).integers(0, config.codebook_size, (config.num_codebooks, frames))


@pytest.mark.parametrize("with_reference", [True, False])
def test_segment_k_matches_upstream_conversation(setup, with_reference):
    builder, tok, config = setup
    ref_codes = random_codes(config, 7, 1) if with_reference else None
    texts = ["First segment, café.", "<|speaker:0|>Second one.\n<|speaker:1|>Third voice!", "Last words."]
    codes = [random_codes(config, n, 10 + n) for n in (5, 3)]
    upstream = upstream_s2_parts if config.family == "s2" else upstream_s1_parts
    for k in range(3):
        previous = list(zip(texts[:k], codes[:k]))
        expected = encode_parts(tok, config, upstream("Hi.", ref_codes, previous, texts[k]))
        prompt = builder.build_segment(
            texts[k],
            [PreviousSegment(t, c) for t, c in previous],
            ref_text="Hi." if with_reference else None,
            ref_codes=ref_codes,
        )
        assert prompt.tokens.dtype == np.int64
        assert np.array_equal(prompt.tokens, expected), f"segment {k}"
        assert prompt.history_kept == k
        # the reference part is the same shareable prefix for every segment
        assert (
            prompt.prefix_len
            == builder.build(texts[0], ref_text="Hi." if with_reference else None, ref_codes=ref_codes).prefix_len
        )


def test_first_segment_is_the_upstream_vector_prompt(setup):
    """Segment 0 is the plain prompt: the vendored upstream-built greedy prompt."""
    builder, tok, config = setup
    family_dir = vector_set("dualar-s2-tiny" if config.family == "s2" else "dualar-s1-tiny")
    expected = np.load(family_dir / "vectors" / "greedy_prompt.npy")
    text = "<|speaker:0|>Hello! <|speaker:1|>Hi." if config.family == "s2" else "Read this line aloud."
    ref = expected[1:, expected[0] >= config.semantic_begin_id]
    prompt = builder.build_segment(text, [], ref_text="Yes.", ref_codes=ref)
    assert np.array_equal(prompt.tokens, expected)


def test_oldest_previous_segments_drop_first_never_the_reference(setup):
    builder, tok, config = setup
    ref = random_codes(config, 6, 2)
    previous = [PreviousSegment(f"Segment number {i}.", random_codes(config, 4 + i, 20 + i)) for i in range(4)]
    full = builder.build_segment("Now.", previous, ref_text="Ref.", ref_codes=ref)
    base = builder.build_segment("Now.", [], ref_text="Ref.", ref_codes=ref)
    block = [
        builder.build_segment("Now.", [p], ref_text="Ref.", ref_codes=ref).tokens.shape[1] - base.tokens.shape[1]
        for p in previous
    ]
    assert full.tokens.shape[1] == base.tokens.shape[1] + sum(block)
    # room for the newest two blocks, one column short of the third
    limit = base.tokens.shape[1] + block[2] + block[3] + block[1] - 1
    cut = builder.build_segment("Now.", previous, ref_text="Ref.", ref_codes=ref, max_columns=limit)
    assert cut.history_kept == 2
    expected = builder.build_segment("Now.", previous[2:], ref_text="Ref.", ref_codes=ref)
    assert np.array_equal(cut.tokens, expected.tokens)
    assert np.array_equal(cut.tokens[:, : cut.prefix_len], base.tokens[:, : base.prefix_len])
    # no room for any history: the reference part and the segment's text remain
    bare = builder.build_segment("Now.", previous, ref_text="Ref.", ref_codes=ref, max_columns=base.tokens.shape[1])
    assert bare.history_kept == 0 and np.array_equal(bare.tokens, base.tokens)
    # too small even for that: the prompt is left whole for the engine to reject by budget
    tiny = builder.build_segment("Now.", previous, ref_text="Ref.", ref_codes=ref, max_columns=3)
    assert np.array_equal(tiny.tokens, base.tokens)


def test_bad_previous_segment_is_named(setup):
    builder, tok, config = setup
    bad = PreviousSegment("ok", np.full((config.num_codebooks, 2), config.codebook_size))
    with pytest.raises(PromptError, match=r"previous segment 0: codes must lie in"):
        builder.build_segment("Next.", [bad])
    with pytest.raises(PromptError, match=r"previous segment 0: codes have no frames"):
        builder.build_segment("Next.", [PreviousSegment("ok", np.zeros((config.num_codebooks, 0), np.int64))])
