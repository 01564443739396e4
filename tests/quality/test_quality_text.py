"""WER and CER as ASR evaluations compute them (actors/quality/text.py): Whisper's normalisers,
then a standard edit distance. Each pair is checked three ways: against the number worked out by
hand from Whisper's published rules, against transformers' own copy of Whisper's normalisers
(an independent packaging of openai/whisper's code) followed by a textbook Levenshtein written
here, and, for the normalised forms, against cases openai/whisper's own tests pin."""

from __future__ import annotations

import json
from importlib.resources import files

import pytest

from actors.quality import text
from actors.quality.text import BASIC, ENGLISH, char_error_rate, normalize, recipe_for, word_error_rate

pytest.importorskip("whisper_normalizer")
pytest.importorskip("jiwer")

# (reference, hypothesis, recipe, WER, CER) -- WER and CER worked out by hand from the rules
PAIRS = [
    # the pair: chorus's own rules said 0.40
    (
        "Mr. Smith paid twenty dollars on the third of May.",
        "Mister Smith paid $20 on the 3rd of May",
        ENGLISH,
        0.0,
        0.0,
    ),
    # numbers and a time: 3 45 p m / 345 pm, jan / january: 3 substitutions, 2 deletions over 10
    (
        "It's 3:45 p.m. on Jan. 1st, 2024.",
        "It is three forty five PM on January first twenty twenty four",
        ENGLISH,
        0.5,
        None,
    ),
    ("I have 2 cats and 1,000 dogs.", "i have two cats and one thousand dogs", ENGLISH, 0.0, 0.0),
    # currency and ordinals
    ("The ticket costs £77 thousand.", "the ticket costs seventy seven thousand pounds", ENGLISH, 0.0, 0.0),
    ("She finished twenty-first.", "she finished 21st", ENGLISH, 0.0, 0.0),
    ("Two dollars and seventy cents", "$2.70", ENGLISH, 0.0, 0.0),
    # abbreviations and British spellings
    ("Dr. Jones and Prof. Lee", "doctor jones and professor lee", ENGLISH, 0.0, 0.0),
    ("The colour of the centre", "the color of the center", ENGLISH, 0.0, 0.0),
    # punctuation and case only
    ("Hello, world! How are you?", "hello world how are you", ENGLISH, 0.0, 0.0),
    ("the cat sat on the mat", "the cat sit on mat", ENGLISH, 2 / 6, 4 / 17),
    # non-Latin scripts, basic normaliser: punctuation is a space, so 你好 世界 is two words
    ("你好，世界。", "你好世界", BASIC, 1.0, 0.0),
    ("你好世界", "你好", BASIC, 1.0, 0.5),
    ("こんにちは、世界！", "こんにちは世界", BASIC, 1.0, 0.0),
    ("Привет, мир!", "привет мир", BASIC, 0.0, 0.0),
    # the basic normaliser keeps ß and drops <tags>; full-width brackets survive its bracket rule
    ("<unk> Straße （注）", "strasse 注", BASIC, 0.5, 2 / 7),
    # insertions count: a rate may exceed 1
    ("a b", "c d e f", BASIC, 2.0, 2.0),
]


def textbook_distance(reference: list, hypothesis: list) -> int:
    row = list(range(len(hypothesis) + 1))
    for i, r in enumerate(reference, 1):
        previous, row[0] = row[0], i
        for j, h in enumerate(hypothesis, 1):
            previous, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, previous + (r != h))
    return row[-1]


@pytest.fixture(scope="module")
def transformers_normalizers():
    """Whisper's normalisers as transformers packages them (its English one takes the spelling
    list the checkpoints ship as normalizer.json: the same list openai/whisper's english.json is)."""
    pytest.importorskip("transformers")
    from transformers.models.whisper.english_normalizer import BasicTextNormalizer, EnglishTextNormalizer

    spellings = json.loads(files("whisper_normalizer").joinpath("normalizers/english.json").read_text("utf-8"))
    return {ENGLISH: EnglishTextNormalizer(spellings), BASIC: BasicTextNormalizer()}


@pytest.mark.parametrize("reference, hypothesis, recipe, wer, cer", PAIRS)
def test_error_rates_are_whispers_normaliser_and_a_standard_edit_distance(
    reference, hypothesis, recipe, wer, cer, transformers_normalizers
):
    assert word_error_rate(reference, hypothesis, recipe) == pytest.approx(wer, abs=1e-12)
    if cer is not None:
        assert char_error_rate(reference, hypothesis, recipe) == pytest.approx(cer, abs=1e-12)
    # the same numbers from the other packaging of the normaliser and a textbook distance
    other = transformers_normalizers[recipe]
    ref_words, hyp_words = other(reference).split(), other(hypothesis).split()
    assert word_error_rate(reference, hypothesis, recipe) == textbook_distance(ref_words, hyp_words) / max(
        len(ref_words), 1
    )
    ref_chars, hyp_chars = list("".join(ref_words)), list("".join(hyp_words))
    assert char_error_rate(reference, hypothesis, recipe) == textbook_distance(ref_chars, hyp_chars) / max(
        len(ref_chars), 1
    )


@pytest.mark.parametrize(
    "spoken, normalised",
    [  # cases openai/whisper's tests/test_normalizer.py pins
        ("Mr. Park visited Assoc. Prof. Kim Jr.", "mister park visited associate professor kim junior"),
        ("two point five million", "2500000"),
        ("$20 million", "$20000000"),
        ("nineteen fifties", "1950s"),
        ("three euros and sixty five cents", "€3.65"),
        ("$0.36", "¢36"),
        ("Let's", "let us"),
        ("10km", "10 km"),
    ],
)
def test_the_english_normaliser_is_whispers(spoken, normalised):
    assert normalize(spoken, ENGLISH) == normalised


def test_the_recipe_follows_the_language():
    assert [recipe_for(x) for x in ("en", "English", " EN ", "eng")] == [ENGLISH] * 4
    assert [recipe_for(x) for x in ("zh", "de", "japanese", None)] == [BASIC] * 4
    with pytest.raises(ValueError, match="unknown WER recipe 'nope'"):
        text.normalizer("nope")


def test_empty_texts():
    assert word_error_rate("", "") == 0.0 and char_error_rate("", "") == 0.0
    assert word_error_rate("", "uh huh") == 2.0  # jiwer's: the inserted words
    assert word_error_rate("hello", "") == 1.0


@pytest.mark.parametrize("reference, hypothesis, recipe, wer, cer", PAIRS)
def test_both_rates_at_once_are_the_same_numbers(reference, hypothesis, recipe, wer, cer):
    from actors.quality.text import error_rates

    both = error_rates(reference, hypothesis, recipe)
    assert both == (word_error_rate(reference, hypothesis, recipe), char_error_rate(reference, hypothesis, recipe))
