"""Word and character error rates between a row's text and its transcript, as ASR evaluations
compute them: both texts normalised by Whisper's own normalisers, then a standard edit distance.

    recipe           normaliser (on both texts)                   then
    whisper-english  Whisper's EnglishTextNormalizer               jiwer.wer over words;
    whisper-basic    Whisper's BasicTextNormalizer (multilingual)  jiwer.cer over characters,
                                                                   whitespace removed

The English normaliser is the one Whisper's paper (Appendix C) and the Open ASR Leaderboard score
English with: numbers and currencies spelled as digits ("twenty dollars" == "$20"), ordinals
("third" == "3rd"), titles ("Mr." == "mister"), contractions, British spellings. The basic one
(every other language) folds case, drops [bracketed], <tagged> and (parenthesised) text and turns
punctuation, symbols and marks into spaces. Both come from the `whisper-normalizer` package, a
packaging of openai/whisper's `whisper/normalizers` (measured identical to it, and to
transformers' copy, on 25,000 generated strings). The edit distance is jiwer's (rapidfuzz's C++
Levenshtein). CER counts characters without whitespace: the measure for languages written without
spaces, where a space the normaliser left for a punctuation mark is not a character spoken (as
Seed-TTS-eval's Chinese test joins characters with punctuation and spaces removed).

A row's recipe is recorded beside its scores (`wer_recipe`), so numbers of different recipes are
never compared unknowingly. Imported only with quality.asr (the packages come with chorus[asr]).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Optional

ENGLISH = "whisper-english"
BASIC = "whisper-basic"
RECIPES = (ENGLISH, BASIC)
# the language names and codes Whisper (and quality.asr_language) use for English
_ENGLISH_NAMES = frozenset({"en", "eng", "english"})


def recipe_for(language: Optional[str]) -> str:
    """The recipe for text in `language` (a Whisper language code or name): the English
    normaliser for English, the basic one for any other language or none known."""
    return ENGLISH if language is not None and language.strip().lower() in _ENGLISH_NAMES else BASIC


@functools.cache
def normalizer(recipe: str) -> Callable[[str], str]:
    """Whisper's normaliser of a recipe (built once: the English one reads its spelling list)."""
    if recipe == ENGLISH:
        from whisper_normalizer.english import EnglishTextNormalizer

        return EnglishTextNormalizer()
    if recipe == BASIC:
        from whisper_normalizer.basic import BasicTextNormalizer

        return BasicTextNormalizer()
    raise ValueError(f"unknown WER recipe {recipe!r} (known: {', '.join(RECIPES)})")


def normalize(text: str, recipe: str = BASIC) -> str:
    """The text as the recipe scores it: normalised, runs of whitespace as one space, trimmed."""
    return " ".join(normalizer(recipe)(text).split())


def word_error_rate(reference: str, hypothesis: str, recipe: str = BASIC) -> float:
    """Word edits between the normalised texts over the reference's words (jiwer.wer: may exceed
    1; an empty reference gives 0 for an empty hypothesis, else the hypothesis's word count)."""
    return _wer(normalize(reference, recipe), normalize(hypothesis, recipe))


def char_error_rate(reference: str, hypothesis: str, recipe: str = BASIC) -> float:
    """Character edits between the normalised texts, whitespace removed, over the reference's
    characters (jiwer.cer)."""
    return _cer(normalize(reference, recipe), normalize(hypothesis, recipe))


def error_rates(reference: str, hypothesis: str, recipe: str) -> tuple[float, float]:
    """(WER, CER) of a pair, each text normalised once."""
    ref, hyp = normalize(reference, recipe), normalize(hypothesis, recipe)
    return _wer(ref, hyp), _cer(ref, hyp)


def _wer(reference: str, hypothesis: str) -> float:
    import jiwer

    return float(jiwer.wer(reference, hypothesis))


def _cer(reference: str, hypothesis: str) -> float:
    import jiwer

    return float(jiwer.cer(reference.replace(" ", ""), hypothesis.replace(" ", "")))
