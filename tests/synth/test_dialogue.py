"""Dialogue rows (a `voices` list, speaker-tagged text) on the tiny S2 demo model, one actor, no
Ray: each turn its own segment, the turns' spans at frame seams, a channel per voice, the checks
per turn (a planted fault: a turn in another voice's clip, a zeroed turn), every bad input an
error row naming its problem, S1's refusal, and encode_refs filling each voice's codes."""

from __future__ import annotations

import io

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import soundfile as sf

from actors import schema as S
from actors.engine.architecture import load_config, with_semantic_ids
from actors.engine.prompt import PromptBuilder
from actors.engine.tokenizer import load_tokenizer
from actors.engine.types import SamplingParams
from actors.lru import LRU
from actors.quality import hearing
from actors.quality.tiny import build_tiny_wavlm
from actors.synth import SynthActor, Trace
from actors.synth.budget import FrameBudget
from actors.synth.chain import ChainPlanner
from actors.synth.rows import RefSpec, RowError, VoiceSpec, parse_row
from actors.synth.settings import ActorSettings, ModelSettings
from helpers import REPO, plant, tune, vector_set
from pipeline.config import compose_typed
from pipeline.run.actor_settings import actor_arguments

FRAME = 2048  # the demo codec's samples per frame
RATE = 44100
TURN_FRAMES = 16  # with a max_frames column and EOS off, every segment has exactly this many
NAMES = ("ada", "ben", "cal")
WORDS = {
    "ada": "The quick brown fox jumps over the lazy dog.",
    "ben": "Please call Stella and ask her to bring these things.",
    "cal": "A rainbow is a division of white light.",
}
TEXT = "<|speaker:0|>Good morning.<|speaker:1|> Morning! How are you?\n<|speaker:2|>Hello, both.<|speaker:0|>Fine."
SPOKEN = [(0, "Good morning."), (1, "Morning! How are you?"), (2, "Hello, both."), (0, "Fine.")]


def voices(*names: str) -> list[dict]:
    return [{S.VOICE_AUDIO_PATH: f"{name}.flac", S.VOICE_TEXT: WORDS[name]} for name in names]


VOICE = pa.struct(
    [
        (S.VOICE_AUDIO, pa.binary()),
        (S.VOICE_AUDIO_PATH, pa.string()),
        (S.VOICE_TEXT, pa.string()),
        (S.VOICE_CODES, pa.list_(pa.list_(pa.int64()))),
    ]
)
SCHEMA = pa.schema(
    [
        (S.ID, pa.string()),
        (S.TEXT, pa.string()),
        (S.SEED, pa.int64()),
        (S.MAX_FRAMES, pa.int64()),
        (S.REF_TEXT, pa.string()),
        (S.VOICES, pa.list_(VOICE)),
    ]
)


def rows(*specs: dict) -> pa.Table:
    return pa.Table.from_pylist(list(specs), schema=SCHEMA)


def dialogue(row_id: str = "talk", text: str = TEXT, names=NAMES, **fields) -> dict:
    return {S.ID: row_id, S.TEXT: text, S.SEED: 11, S.MAX_FRAMES: TURN_FRAMES, S.VOICES: voices(*names), **fields}


def audio(row: dict) -> np.ndarray:
    return sf.read(io.BytesIO(row[S.AUDIO][S.AUDIO_BYTES]), dtype="float32")[0]


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    """The demo's three voices, each cut to exactly TURN_FRAMES frames at the codec's rate, so a
    turn's stretch can be a voice's very clip."""
    from actors.audio import load_reference_audio

    folder = tmp_path_factory.mktemp("voices")
    for name in NAMES:
        wave = load_reference_audio(str(REPO / "data" / "demo" / "refs" / f"{name}.flac"), target_sample_rate=RATE)
        sf.write(folder / f"{name}.flac", wave[: TURN_FRAMES * FRAME], RATE, format="FLAC", subtype="PCM_16")
    return folder


@pytest.fixture(scope="module")
def actor(small_settings, clips, tmp_path_factory) -> SynthActor:
    pytest.importorskip("transformers")
    wavlm = build_tiny_wavlm(tmp_path_factory.mktemp("wavlm") / "wavlm")
    settings = small_settings + [
        "model=demo_s2",
        "engine.max_tokens=512",
        "output.channels=per_speaker",
        "data.max_voices=9",
        "quality.speaker=wavlm",
        f"quality.speaker_model={wavlm}",
    ]
    return SynthActor(**actor_arguments(compose_typed(settings), str(clips), run_id="dialogue"), recorder=Trace())


def test_turns_span_the_audio_at_frame_seams_each_voice_on_its_channel(actor, monkeypatch):
    (row,) = actor(rows(dialogue())).to_pylist()
    assert row[S.STATUS] == S.STATUS_OK, row[S.ERROR]
    turns = row[S.TURNS]
    assert [(t[S.TURN_SPEAKER], t[S.TURN_TEXT]) for t in turns] == SPOKEN  # the tagged speakers, in order
    assert row[S.SEGMENTS] == 4 and row[S.SEGMENT_FRAMES] == [TURN_FRAMES] * 4  # a segment per turn
    # from 0 to the audio's end, each turn starting where the one before ends, at a frame seam
    assert turns[0][S.TURN_START_S] == 0.0 and turns[-1][S.TURN_END_S] == row[S.AUDIO_SECONDS]
    for k, turn in enumerate(turns):
        assert turn[S.TURN_START_S] == k * TURN_FRAMES * FRAME / RATE
        assert turn[S.TURN_END_S] == (k + 1) * TURN_FRAMES * FRAME / RATE
        assert turn[S.TURN_SPEAKER_SIMILARITY] is not None
    assert row[S.SPEAKER_SIMILARITY] == min(t[S.TURN_SPEAKER_SIMILARITY] for t in turns)
    channels = audio(row)
    assert channels.shape == (4 * TURN_FRAMES * FRAME, 3)  # one channel per voice
    for voice in range(3):
        inside = np.zeros(len(channels), dtype=bool)
        for turn in turns:
            if turn[S.TURN_SPEAKER] == voice:
                inside[round(turn[S.TURN_START_S] * RATE) : round(turn[S.TURN_END_S] * RATE)] = True
        assert not channels[~inside, voice].any()  # exact silence outside its own turns
        assert np.abs(channels[inside, voice]).max() > 0
    # the same row mono: the same codes, and its audio is the channels' sum, sample for sample
    tune(monkeypatch, actor, "output", channels=S.CHANNELS_MONO)
    (mono,) = actor(rows(dialogue())).to_pylist()
    assert mono[S.CODES] == row[S.CODES] and mono[S.TURNS] == turns
    np.testing.assert_array_equal(audio(mono), channels.sum(axis=1))


def test_a_dialogue_row_is_the_same_in_any_block(actor):
    (alone,) = actor(rows(dialogue())).to_pylist()
    mates = [{S.ID: f"plain-{i}", S.TEXT: f"A sentence, number {i}.", S.SEED: i} for i in range(3)]
    other = dialogue("other", "<|speaker:1|>First.<|speaker:0|>Second.", names=("cal", "ada"))
    batch = {r[S.ID]: r for r in actor(rows(mates[0], other, mates[1], dialogue(), mates[2])).to_pylist()}
    assert all(r[S.STATUS] == S.STATUS_OK for r in batch.values()), [r[S.ERROR] for r in batch.values()]
    assert batch["talk"][S.CODES] == alone[S.CODES]
    assert batch["talk"][S.AUDIO][S.AUDIO_BYTES] == alone[S.AUDIO][S.AUDIO_BYTES]
    assert batch["plain-0"][S.TURNS] == [
        {
            S.TURN_SPEAKER: 0,
            S.TURN_TEXT: "A sentence, number 0.",
            S.TURN_START_S: 0.0,
            S.TURN_END_S: batch["plain-0"][S.AUDIO_SECONDS],
            S.TURN_SPEAKER_SIMILARITY: None,  # no reference to compare with
        }
    ]
    assert audio(batch["plain-0"]).ndim == 1  # plain rows stay mono


def test_a_shared_voice_is_encoded_once_and_the_voices_prefix_reused(actor, monkeypatch):
    encoded = []
    real = actor.codec.encode_batch
    monkeypatch.setattr(
        actor.codec, "encode_batch", lambda waves, **kw: encoded.append(len(waves)) or real(waves, **kw)
    )
    monkeypatch.setattr(actor.references, "cache", LRU(8))
    pair = [
        dialogue(f"pair-{i}", "<|speaker:0|>Hi.<|speaker:1|>Hello.<|speaker:0|>Bye.", names=("ada", "ben"))
        for i in range(2)
    ]
    out = actor(rows(*pair, dialogue("trio"))).to_pylist()
    assert all(r[S.STATUS] == S.STATUS_OK for r in out) and sum(encoded) == 3  # three clips, five uses
    # every turn after a row's first prefills only its history and its text: the voices' K/V,
    # the prompts' shared prefix, is restored (two voices' prefix is shorter than three's)
    reused = {
        i: {r.prefix_reused_tokens for _, r in actor.recorder.segments[i][1:]} for i in ("pair-0", "pair-1", "trio")
    }
    assert reused["pair-0"] == reused["pair-1"] and len(reused["pair-0"]) == len(reused["trio"]) == 1
    assert 0 < min(reused["pair-0"]) < min(reused["trio"])
    actor(rows(*pair))
    assert sum(encoded) == 3  # from the cache now


def test_bad_dialogue_rows_are_errors_naming_the_problem(actor):
    codebooks = actor.lm.config.num_codebooks
    nine = [voices("ada")[0]] * 9
    bad = {
        "missing-voice": (
            dialogue(text="<|speaker:0|>Hi.<|speaker:3|>Who?"),
            "tagged <|speaker:3|>, but the row has 3 voices",
        ),
        "too-many-voices": (dialogue(**{S.VOICES: nine + nine[:1]}), "10 voices, more than data.max_voices=9"),
        "over-flac": (dialogue(**{S.VOICES: nine}), "a FLAC file holds at most 8"),
        "no-clip": (
            dialogue(**{S.VOICES: [voices("ada")[0], {S.VOICE_TEXT: "words"}]}),
            "voices[1] has no audio, audio_path or codes",
        ),
        "codes-shape": (
            dialogue(**{S.VOICES: [voices("ada")[0], {S.VOICE_CODES: [[1, 2]] * (codebooks - 1)}]}),
            f"voices[1].codes must be [{codebooks}][frames]",
        ),
        "empty-turn": (
            dialogue(text="<|speaker:0|>Hi.<|speaker:1|>  <|speaker:2|>Yes."),
            "turn 2 (<|speaker:1|>) is empty",
        ),
        "untagged": (dialogue(text="Nobody says who speaks."), "has no <|speaker:N|> tag, but the row has 3 voices"),
        "words-before": (dialogue(text="Stray words <|speaker:0|>Hi."), "comes before the first speaker tag"),
        "both": (dialogue(**{S.REF_TEXT: "a reference"}), "sets both voices and ref_text"),
        "mislabelled": (
            dialogue(**{S.VOICES: [voices("ada")[0], {**voices("ben")[0], S.VOICE_TEXT: "<|speaker:0|>Hi."}]}),
            "voices[1].text contains <|speaker:0|>",
        ),
        "lost-clip": (
            dialogue(**{S.VOICES: [voices("ada")[0], {S.VOICE_AUDIO_PATH: "nope.flac"}]}),
            "voices[1]: reference audio",
        ),
        "outside": (
            dialogue(**{S.VOICES: [{S.VOICE_AUDIO_PATH: "/etc/hostname"}]}),
            "voices[0].audio_path '/etc/hostname' is outside",
        ),
    }
    batch = [spec for spec, _ in bad.values()] + [dialogue("fine")]
    for spec, (row_id, _) in zip(batch, bad.items()):
        spec[S.ID] = row_id
    out = {r[S.ID]: r for r in actor(rows(*batch)).to_pylist()}
    for row_id, (_, fragment) in bad.items():
        assert out[row_id][S.STATUS] == S.STATUS_ERROR and fragment in out[row_id][S.ERROR], (
            row_id,
            out[row_id][S.ERROR],
        )
    assert out["fine"][S.STATUS] == S.STATUS_OK  # one bad row never takes the others with it


def test_s1_refuses_several_voices_and_takes_one():
    checkpoint = vector_set("dualar-s1-tiny") / "checkpoint"
    tok = load_tokenizer(checkpoint)
    config = with_semantic_ids(load_config(checkpoint), tok.semantic_begin_id, tok.semantic_end_id, tok.source)
    settings = ActorSettings(
        model=ModelSettings(checkpoint=None, budget=FrameBudget(max_frames=16, frames_per_byte=None))
    )
    planner = ChainPlanner(settings, PromptBuilder(tok, config), 2048, frozenset(tok.special))
    codes = [np.random.default_rng(i).integers(0, config.codebook_size, (config.num_codebooks, 5)) for i in range(2)]
    two = tuple(VoiceSpec(RefSpec(f"codes:{i}", codes=c), "Words.") for i, c in enumerate(codes))

    def spec(text, voices):
        values = {S.ID: "s1", S.TEXT: text, S.VOICES: [{S.VOICE_TEXT: "Words."}] * len(voices)}
        parsed, error = parse_row(0, values, settings, SamplingParams(), lambda values: voices)
        assert error is None
        return parsed

    with pytest.raises(RowError, match="the row has 2 voices, but an S1 checkpoint's prompt addresses one speaker"):
        planner.plan(spec("<|speaker:0|>Hi.<|speaker:1|>Hello.", two), codes)
    chain = planner.plan(spec("<|speaker:0|>Hi.<|speaker:0|>Again.", two[:1]), codes[:1])
    # S1's prompt has its own <|speaker:0|> before a text: a turn's text there is its words
    assert chain.plan.texts == ("Hi.", "Again.") and chain.plan.turns == ((0, "Hi."), (0, "Again."))


# ---- the checks per turn: planted faults ---------------------------------------------------
def spans(task: hearing.HearTask) -> list[tuple[int, int]]:
    """A heard row's turns' sample spans."""
    return hearing.stretches([frames for _, frames in task.turns], FRAME)


def voiced(actor: SynthActor, clips, swapped: dict):
    """Each turn's stretch replaced by its voice's very clip (a turn speaking in its own voice);
    `swapped`: round -> {turn: the voice whose clip it gets instead}."""
    waves = [actor.references.load(str(clips / f"{name}.flac")) for name in NAMES]

    def fault(job, round_: int, wave: np.ndarray, task) -> np.ndarray:
        planted = wave.copy()
        for k, ((start, end), (voice, _)) in enumerate(zip(spans(task), job.chain.plan.turns)):
            planted[start:end] = waves[swapped.get(round_, {}).get(k, voice)]
        return planted

    return fault


def test_a_turn_in_another_voices_clip_has_the_lower_similarity(actor, clips, monkeypatch):
    plant(monkeypatch, actor, voiced(actor, clips, {}))
    (own,) = actor(rows(dialogue())).to_pylist()
    similarities = [t[S.TURN_SPEAKER_SIMILARITY] for t in own[S.TURNS]]
    assert similarities == pytest.approx([1.0] * 4, abs=1e-5)  # each turn is its own voice's clip
    monkeypatch.undo()
    plant(monkeypatch, actor, voiced(actor, clips, {0: {1: 0}}))  # turn 1 (ben's) gets ada's clip
    (swapped,) = actor(rows(dialogue())).to_pylist()
    after = [t[S.TURN_SPEAKER_SIMILARITY] for t in swapped[S.TURNS]]
    assert after[1] < 0.999 and [after[k] for k in (0, 2, 3)] == pytest.approx([1.0] * 3, abs=1e-5)
    assert swapped[S.SPEAKER_SIMILARITY] == after[1]  # the row's: its lowest turn's
    assert swapped[S.ATTEMPTS] == 1  # speaker is not in quality.reject: measured, not regenerated


def test_a_turn_failing_the_gate_regenerates_from_its_own_segment(actor, clips, monkeypatch):
    tune(monkeypatch, actor, "quality", reject=["no_audio", "speaker", "silence"], min_speaker_similarity=0.999)
    seen = plant(monkeypatch, actor, voiced(actor, clips, {0: {2: 0}}))  # round 0: turn 2 in ada's voice
    (row,) = actor(rows(dialogue())).to_pylist()
    first = actor.recorder.segments["talk"]
    assert seen == [("talk", 0), ("talk", 1)] and row[S.STATUS] == S.STATUS_OK and row[S.ATTEMPTS] == 2
    # turns 0 and 1 kept; turn 2 generated again (its derived stream), and turn 3, whose history changed
    assert [r.request_id.rsplit("#", 1)[1] for _, r in first] == ["0", "1", "2~1", "3~1"]
    assert row[S.DISCARDED_FRAMES] == 2 * TURN_FRAMES


def test_a_zeroed_turn_regenerates_from_its_own_segment(actor, clips, monkeypatch):
    tune(monkeypatch, actor, "quality", reject=["no_audio", "silence"])
    (before,) = actor(rows(dialogue())).to_pylist()
    first = actor.recorder.segments["talk"]

    def zero_turn_1(job, round_: int, wave: np.ndarray, task) -> np.ndarray:
        planted = wave.copy()
        if round_ == 0:
            start, end = spans(task)[1]
            planted[start:end] = 0.0
        return planted

    # a quarter of the row is silent, under max_silence_ratio (0.5): the row as a whole passes,
    # but turn 1 alone is all silence
    seen = plant(monkeypatch, actor, zero_turn_1)
    (row,) = actor(rows(dialogue())).to_pylist()
    again = actor.recorder.segments["talk"]
    assert before[S.ATTEMPTS] == 1 and before[S.SILENCE_RATIO] < 0.5
    assert seen == [("talk", 0), ("talk", 1)] and row[S.STATUS] == S.STATUS_OK and row[S.ATTEMPTS] == 2
    assert [r.request_id.rsplit("#", 1)[1] for _, r in again] == ["0", "1~1", "2~1", "3~1"]
    assert np.array_equal(again[0][1].codes, first[0][1].codes)  # turn 0 kept
    assert row[S.TURNS][0] == before[S.TURNS][0] and row[S.CODES][0][:TURN_FRAMES] == before[S.CODES][0][:TURN_FRAMES]


def test_encode_refs_fills_each_voices_codes(small_settings, clips, tmp_path, actor):
    """encode_refs gives every voice its codes; the row given those codes (and no clips) comes out
    with exactly the codes of the row given the clips."""
    from pipeline.encode_refs import encode_refs

    source = tmp_path / "talk.parquet"
    pq.write_table(rows(dialogue(), {S.ID: "plain", S.TEXT: "Just words."}), source)
    out = tmp_path / "coded.parquet"
    counts = encode_refs(
        str(out), compose_typed([*small_settings, "model=demo_s2", f"data.path={source}", f"data.audio_root={clips}"])
    )
    assert (counts["encoded"], counts["failed"]) == (3, 0)
    coded = pq.read_table(out).to_pylist()
    assert all(len(v[S.VOICE_CODES]) == actor.lm.config.num_codebooks for v in coded[0][S.VOICES])
    without_clips = {**coded[0], S.VOICES: [{**v, S.VOICE_AUDIO_PATH: None} for v in coded[0][S.VOICES]]}
    (from_codes,) = actor(rows(without_clips)).to_pylist()
    (from_clips,) = actor(rows(dialogue())).to_pylist()
    assert from_codes[S.STATUS] == S.STATUS_OK and from_codes[S.CODES] == from_clips[S.CODES]
