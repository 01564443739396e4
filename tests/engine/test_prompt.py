"""Prompt building beyond the upstream vectors: formats without a reference, several
references, speaker turns, and the text checks."""

import re

import numpy as np
import pytest

from actors.engine import PromptBuilder, PromptError, Reference, load_model
from actors.engine.prompt import split_speaker_turns
from helpers import vector_set


@pytest.fixture(scope="module", params=["dualar-s1-tiny", "dualar-s2-tiny"])
def builder(request):
    lm = load_model(vector_set(request.param) / "checkpoint", device="cpu", dtype="float32")
    return PromptBuilder.for_model(lm), lm


def decode_text(lm, tokens):
    """Row 0 back to text (the byte-level tokenizers of the vectors: ids < 256 are bytes)."""
    special = {v: k for k, v in lm.tokenizer.special.items()}
    out, raw = [], bytearray()
    for t in tokens[0]:
        if t < 256:
            raw.append(int(t))
        else:
            out.append(raw.decode("utf-8"))
            raw = bytearray()
            semantic = lm.config.semantic_begin_id <= int(t) <= lm.config.semantic_end_id
            out.append("<sem>" if semantic else special[int(t)])
    out.append(raw.decode("utf-8"))
    return "".join(out)


def test_no_reference_formats(builder):
    b, lm = builder
    p = b.build("Hello world.")
    text = decode_text(lm, p.tokens)
    assert not p.tokens[1:].any()  # no reference codes anywhere
    if lm.config.family == "s2":
        assert text == (
            "<|im_start|>system\nconvert the provided text to speech<|im_end|>\n"
            "<|im_start|>user\nHello world.<|im_end|>\n<|im_start|>assistant\n<|voice|>"
        )
        assert decode_text(lm, p.tokens[:, : p.prefix_len]).endswith("<|im_start|>user\n")
    else:
        assert text == "<|interleave|><|speaker:0|>Hello world."
        assert p.prefix_len == 1 + len("<|speaker:0|>")


def test_multiple_references(builder):
    b, lm = builder
    c = lm.config
    rng = np.random.default_rng(0)
    refs = [
        Reference("First voice.", rng.integers(0, c.codebook_size, (c.num_codebooks, 3))),
        Reference("<|speaker:7|>Second.", rng.integers(0, c.codebook_size, (c.num_codebooks, 2))),
    ]
    p = b.build("Go.", references=refs)
    semantic = (p.tokens[0] >= c.semantic_begin_id) & (p.tokens[0] <= c.semantic_end_id)
    assert semantic.sum() == 5 and np.array_equal(p.tokens[1:, semantic], np.concatenate([r.codes for r in refs], 1))
    assert np.array_equal(p.tokens[0, semantic] - c.semantic_begin_id, p.tokens[1, semantic])
    text = decode_text(lm, p.tokens)
    if c.family == "s2":  # tagged per index unless already tagged, joined by newlines, codes together
        assert (
            "Text:\n<|speaker:0|>First voice.\n<|speaker:7|>Second.\n\nSpeech:\n<sem><sem><sem><sem><sem><|im_end|>"
            in text
        )
    else:  # each reference its own speaker turn ending in <|im_end|>
        assert text.startswith(
            "<|interleave|><|speaker:0|>First voice.<sem><sem><sem><|im_end|>"
            "<|speaker:0|><|speaker:7|>Second.<sem><sem><|im_end|><|speaker:0|>Go."
        )


def test_speaker_turns_are_split_stripped_and_joined():
    assert (
        split_speaker_turns("<|speaker:0|> Hi there.  <|speaker:1|>Yo ") == "<|speaker:0|> Hi there.\n<|speaker:1|>Yo"
    )
    assert split_speaker_turns("  plain text  ") == "  plain text  "


@pytest.mark.parametrize(
    "text, message",
    [
        ("bell\x07here", "control character U+0007 at position 4"),
        ("nul\x00", "control character U+0000"),
        ("c1\x85x", "control character U+0085"),
        (b"\xff\xfe bad", "not valid UTF-8"),
        ("lone \ud800 surrogate", "unpaired surrogate"),
        ("   ", "text is empty"),
        (42, "must be a string"),
    ],
)
def test_bad_text_is_rejected_with_a_clear_message(builder, text, message):
    b, _ = builder
    with pytest.raises(PromptError, match=re.escape(message)):
        b.build(text)


def test_tabs_newlines_and_utf8_bytes_are_fine(builder):
    b, lm = builder
    assert decode_text(lm, b.build(b"caf\xc3\xa9\tline\nnext").tokens).count("café\tline\nnext") == 1


def test_bad_reference_codes(builder):
    b, lm = builder
    c = lm.config
    with pytest.raises(PromptError, match=r"reference 0: codes must lie in \[0, "):
        b.build("x", ref_text="r", ref_codes=np.full((c.num_codebooks, 2), c.codebook_size))
    with pytest.raises(PromptError, match="shape"):
        b.build("x", ref_text="r", ref_codes=np.zeros((c.num_codebooks + 1, 2), np.int64))
    with pytest.raises(PromptError, match="ref_text was given without"):
        b.build("x", ref_text="r")
    with pytest.raises(PromptError, match="reference 0 text contains control character"):
        b.build("x", ref_text="a\x1bb", ref_codes=np.zeros((c.num_codebooks, 2), np.int64))
