"""Long-form segmentation (actors/engine/segment.py): where rows are cut, the byte budget, and which
previous segments a prompt keeps. Pure functions: no model, no torch."""

import re

import pytest

from actors.engine.segment import (
    MIN_SEGMENT_BYTES,
    group_turns,
    kept_history,
    segment_budget,
    segment_text,
    speaker_turns,
    split_text,
    utf8_len,
)

SPECIAL = re.compile(r"<\|[^<>|\s]+\|>")


def check_pieces(text: str, pieces: list[str], max_bytes: int) -> None:
    """What every split must keep: each piece fits, is stripped and non-empty, nothing is lost
    or reordered (whitespace at cuts aside), and every special token survives whole."""
    assert pieces, "no pieces"
    for piece in pieces:
        assert piece and piece == piece.strip()
        assert utf8_len(piece) <= max_bytes, (utf8_len(piece), piece)
    squeeze = lambda s: re.sub(r"\s+", "", s)  # noqa: E731
    assert squeeze("".join(pieces)) == squeeze(text)
    assert [t for p in pieces for t in SPECIAL.findall(p)] == SPECIAL.findall(text)


ENGLISH = (
    "The lighthouse keeper climbed the stairs at dusk. He counted each step, as he always did, "
    "and paused at the hundredth to catch his breath! Was the lamp still burning? It was.\n\n"
    "Below, the sea rolled in long grey swells. A gull cried once; then the wind took the sound "
    "away and there was only the hiss of foam on the rocks. "
) * 4


def test_english_paragraphs_cut_at_sentence_ends():
    pieces = split_text(ENGLISH, 120)
    check_pieces(ENGLISH, pieces, 120)
    # every sentence here is shorter than the budget, so every cut falls at a sentence end
    assert all(re.search(r"[.!?]$", p) for p in pieces), pieces
    # and neighbouring sentences are joined while they fit: no piece could take the next one
    for a, b in zip(pieces, pieces[1:]):
        first_sentence = re.match(r".+?[.!?](\s|$)", b).group(0).strip()
        assert utf8_len(a) + 1 + utf8_len(first_sentence) > 120


def test_upstream_examples():
    # upstream's splitter doc-tests, with the same budgets
    assert split_text("This is a test sentence. This is another test sentence. And a third one.", 50) == [
        "This is a test sentence.",
        "This is another test sentence. And a third one.",
    ]
    commas = (
        "This is a test sentence with only commas, and no dots, and no exclamation marks, "
        "and no question marks, and no newlines."
    )
    assert split_text(commas, 50) == [
        "This is a test sentence with only commas,",
        "and no dots, and no exclamation marks,",
        "and no question marks, and no newlines.",
    ]
    assert split_text("   ", 10) == []
    assert split_text("a", 10) == ["a"]


def test_decimals_and_abbreviation_dots_are_not_sentence_ends():
    text = "Pi is about 3.14159 and e is 2.71828 while the U.S.A. flag has fifty stars on it today"
    pieces = split_text(text, 40)
    check_pieces(text, pieces, 40)
    assert not any(p.endswith(("3.", "2.", "U.", "S.")) for p in pieces)


def test_cjk_without_spaces():
    text = "今天天气很好，我们去公园散步。公园里有很多人，有的在跑步，有的在下棋！你想一起去吗？" * 3
    pieces = split_text(text, 60)  # 20 CJK characters
    check_pieces(text, pieces, 60)
    assert all(p[-1] in "。！？，" for p in pieces), pieces
    # a sentence of 14 characters (42 bytes) fits, so sentence ends are preferred
    assert pieces[0] == "今天天气很好，我们去公园散步。"
    # Japanese with 「」 quotes: the closing quote stays with its sentence
    jp = "彼は「もう行く。」と言った。私は何も答えなかった。空は青かった。" * 2
    jp_pieces = split_text(jp, 45)
    check_pieces(jp, jp_pieces, 45)
    assert not any(p.startswith("」") for p in jp_pieces)


def test_other_scripts_sentence_marks():
    hindi = "यह पहला वाक्य है। यह दूसरा वाक्य है। यह तीसरा वाक्य है।"
    pieces = split_text(hindi, 60)
    check_pieces(hindi, pieces, 60)
    assert all(p.endswith("।") for p in pieces)
    arabic = "هل أنت بخير؟ نعم أنا بخير. شكرا لك على السؤال؟ " * 3
    pieces = split_text(arabic, 50)
    check_pieces(arabic, pieces, 50)
    assert all(p[-1] in "؟." for p in pieces)


def test_no_punctuation_at_all_cuts_at_spaces():
    text = " ".join(f"word{i}" for i in range(200))
    pieces = split_text(text, 64)
    check_pieces(text, pieces, 64)
    # cuts at whitespace keep every word whole
    assert [w for p in pieces for w in p.split(" ")] == text.split(" ")
    assert max(utf8_len(p) for p in pieces) > 64 - 8  # pieces are filled, not tiny


def test_a_single_5000_byte_word():
    word = "Ω" * 2500  # 2 bytes each
    pieces = split_text(word, 300)
    check_pieces(word, pieces, 300)
    assert [utf8_len(p) for p in pieces] == [300] * 16 + [200]
    ascii_word = "x" * 5000
    assert [len(p) for p in split_text(ascii_word, 300)] == [300] * 16 + [200]


def test_emoji_and_special_tokens_at_cut_points():
    emoji = "🎉" * 40  # 4 bytes each, no cut point but between them
    pieces = split_text(emoji, 30)
    check_pieces(emoji, pieces, 30)
    assert [utf8_len(p) for p in pieces] == [28] * 5 + [20]
    # what a reader sees as one character is never cut: a flag (two regional indicators), a
    # ZWJ sequence, a skin tone, a combining accent
    flags = "ab" + "🇫🇷" * 10
    pieces = split_text(flags, 9)
    check_pieces(flags, pieces, 9)
    assert pieces == ["ab"] + ["🇫🇷"] * 10  # 8 bytes a flag: one per piece, never half of one
    for unit in (
        "👩\u200d💻",
        "👍🏽",
        "e\u0301",
        "❤\ufe0f",
        "🏴\U000e0067\U000e0062\U000e0065\U000e006e\U000e0067\U000e007f",
    ):
        text = unit * 12
        for budget in range(utf8_len(unit), 3 * utf8_len(unit) + 2):
            pieces = split_text(text, budget)
            assert "".join(pieces) == text
            assert all(len(p) % len(unit) == 0 and p.startswith(unit) for p in pieces), (unit, budget, pieces)
    # a special token straddling every possible budget edge is never cut
    text = "abc<|im_end|>defgh<|voice|>ij" * 6
    for budget in range(12, 40):
        check_pieces(text, split_text(text, budget), budget)
    # a token longer than the budget stands alone rather than being broken
    assert split_text("ab<|interleave|>cd", 8) == ["ab", "<|interleave|>", "cd"]


def test_speaker_turns_like_upstream():
    text = "ignored <|speaker:0|> Hi there.  <|speaker:1|>Yo <|speaker:0|>"
    assert speaker_turns(text) == ["<|speaker:0|> Hi there.", "<|speaker:1|>Yo", "<|speaker:0|>"]
    assert speaker_turns("no tags here") == []


def test_grouping_by_bytes_and_turn_count():
    turns = [f"<|speaker:{i % 2}|>turn {i}." for i in range(12)]  # 21-22 bytes each
    groups = group_turns(turns, max_bytes=70, max_turns=5)
    assert groups[0] == "\n".join(turns[:3])  # 3 x 21 + 2 newlines = 65; a 4th would be 87
    assert all(utf8_len(g) <= 70 for g in groups)
    assert "\n".join(groups) == "\n".join(turns)
    by_count = group_turns(turns, max_bytes=10_000, max_turns=5)
    assert [g.count("<|speaker:") for g in by_count] == [5, 5, 2]


def test_dialogue_segments_keep_the_speaker_on_every_piece():
    long_turn = "I remember the summer we spent by the lake. " * 8
    text = f"<|speaker:0|>Tell me a story. <|speaker:1|>{long_turn}<|speaker:0|>Go on."
    segments = segment_text(text, 120)
    for s in segments:
        assert utf8_len(s) <= 120
        assert s.startswith("<|speaker:")
        for line in s.split("\n"):  # every turn of a segment names its speaker
            assert re.match(r"<\|speaker:\d\|>", line)
    # the long turn's pieces are filled (13-byte tag + two 44-byte sentences), so the short
    # opening turn cannot join the first of them
    assert segments[:2] == ["<|speaker:0|>Tell me a story.", "<|speaker:1|>" + long_turn[:88].strip()]
    assert segments[-1].endswith("<|speaker:0|>Go on.")
    spoken = "".join(re.sub(r"<\|speaker:\d\|>|\s", "", s) for s in segments)
    assert spoken == re.sub(r"<\|speaker:\d\|>|\s", "", text)


def test_text_that_fits_is_one_unchanged_segment():
    assert segment_text("  Short, with spaces.  ", 300) == ["  Short, with spaces.  "]
    assert segment_text("<|speaker:0|>a <|speaker:1|>b", 300) == ["<|speaker:0|>a <|speaker:1|>b"]


def test_segmenting_50000_characters_is_quick_and_linear():
    text = ENGLISH * 60
    assert len(text) > 50_000
    pieces = segment_text(text, 300)
    check_pieces(text, pieces, 300)


def test_budget_from_engine_settings():
    # frames per byte: text bytes + (min_frames + fpc x bytes) frames must fit the room
    b = segment_budget(cap=300, max_tokens=512, fixed_tokens=100, max_frames=1000, frames_per_byte=0.5, min_frames=8)
    assert (b.max_bytes, b.limited_by) == ((512 - 100 - 8) // 1.5, "max_tokens")
    # the text must also be speakable within max_frames
    b = segment_budget(cap=300, max_tokens=4096, fixed_tokens=100, max_frames=48, frames_per_byte=0.5, min_frames=8)
    assert (b.max_bytes, b.limited_by) == (80, "max_frames")
    # without frames per character every segment reserves max_frames
    b = segment_budget(cap=300, max_tokens=512, fixed_tokens=100, max_frames=300, frames_per_byte=None)
    assert (b.max_bytes, b.limited_by) == (112, "max_tokens")
    b = segment_budget(cap=300, max_tokens=8192, fixed_tokens=100, max_frames=1024, frames_per_byte=1.6, min_frames=16)
    assert (b.max_bytes, b.limited_by) == (300, "segment_bytes")
    with pytest.raises(ValueError, match=r"raise engine.max_tokens, shorten the reference"):
        segment_budget(cap=300, max_tokens=512, fixed_tokens=500, max_frames=48, frames_per_byte=0.5)
    assert MIN_SEGMENT_BYTES <= 16


def test_budget_leaves_room_for_the_previous_segment():
    # half the room kept for history: a segment of the largest size plus its frames fits the
    # other half, so the previous segment (same size at most) stays in the next prompt
    full = segment_budget(cap=300, max_tokens=512, fixed_tokens=100, max_frames=1000, frames_per_byte=0.5, min_frames=8)
    half = segment_budget(
        cap=300,
        max_tokens=512,
        fixed_tokens=100,
        max_frames=1000,
        frames_per_byte=0.5,
        min_frames=8,
        history_fraction=0.5,
    )
    assert half.max_bytes == (206 - 8) // 1.5 < full.max_bytes
    cost = half.max_bytes + 8 + 0.5 * half.max_bytes  # text positions + frames of one segment
    assert 100 + 2 * cost <= 512  # the previous one and this one fit together
    # a large context: the byte cap binds first, the reserve changes nothing
    big = dict(cap=300, max_tokens=8192, fixed_tokens=100, max_frames=1024, frames_per_byte=1.6, min_frames=16)
    assert segment_budget(**big, history_fraction=0.5) == segment_budget(**big)


def test_oldest_previous_segments_drop_first():
    # columns of previous segments 0..3 (oldest first)
    assert kept_history([10, 20, 30, 40], room=1000) == 0  # all fit
    assert kept_history([10, 20, 30, 40], room=70) == 2  # 30 + 40
    assert kept_history([10, 20, 30, 40], room=69) == 3  # only the newest
    assert kept_history([10, 20, 30, 40], room=39) == 4  # none
    # never a gap: an old short segment is not kept once a newer one was dropped
    assert kept_history([1, 50, 10], room=20) == 2
    assert kept_history([], room=5) == 0
