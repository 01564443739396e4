"""The quality gate in the actor (actors/quality/gate.py) on the random demo model: a row whose
first attempt draws <|im_end|> before any frame is generated again with the derived seed and
ends ok, the same every run and in any batch; a long row regenerates only its failed segment;
a row failing every attempt is `rejected` with its flags; decoded rows carry their metrics."""

from __future__ import annotations

import io

import numpy as np
import pytest
import soundfile as sf

from actors import schema as S
from actors.quality import checks
from actors.synth import SynthActor, Trace
from actors.synth.chain import segment_seed
from helpers import text_rows, tune
from pipeline.config import compose_typed
from pipeline.run.actor_settings import actor_arguments

TEXT = "Hello there, how are you?"
# cut into segments of at most 24 bytes (long_form.segment_bytes=24): five segments
LONG_TEXT = "One two three four. Five six seven eight. Nine ten eleven. Twelve thirteen. Fourteen fifteen."


@pytest.fixture(scope="module")
def actor(small_settings) -> SynthActor:
    # float32 on every CPU: the seeds whose first draw is <|im_end|> are float32 sampling's
    float32 = ["model.dtype=float32", "model.codec_dtype=float32"]
    settings = small_settings + ["engine.stop_on_eos=true", "engine.max_tokens=512", *float32]
    return SynthActor(**actor_arguments(compose_typed(settings), None, run_id="gate"), recorder=Trace())


def scan(actor, monkeypatch, text: str, seeds: range) -> dict:
    """One frame per segment and a single attempt: which seeds' rows stop on <|im_end|> before
    a frame, in which segment (the first draw of a segment does not depend on its budget)."""
    quality = actor.settings.quality
    tune(monkeypatch, actor, "quality", max_attempts=1)
    out = actor(text_rows([{S.ID: f"s{s}", S.TEXT: text, S.SEED: s, S.MAX_FRAMES: 1} for s in seeds]))
    monkeypatch.setattr(actor.settings, "quality", quality)
    found = {}
    for row in out.to_pylist():
        if 0 in row[S.SEGMENT_FRAMES]:
            assert row[S.STATUS] == S.STATUS_REJECTED and row[S.QUALITY_FLAGS] == ["no_audio"], row
            assert row[S.ATTEMPTS] == 1 and row[S.AUDIO] is None and row[S.ERROR] is None
            found[row[S.SEED]] = row[S.SEGMENT_FRAMES].index(0)
    return found


@pytest.fixture(scope="module")
def eos_first(actor) -> list[int]:
    with pytest.MonkeyPatch.context() as mp:
        found = scan(actor, mp, TEXT, range(160))
    assert len(found) >= 2, "the demo model draws <|im_end|> first for ~1% of seeds"
    return sorted(found)


def test_attempt_zero_keeps_the_row_seed_and_later_ones_are_derived():
    assert segment_seed(1234, 0, 0) == 1234  # a row that passes first time keeps its codes
    later = [segment_seed(1234, 0, k) for k in (1, 2, 3)]
    assert len(set(later)) == 3 and 1234 not in later
    assert later == [segment_seed(1234, 0, k) for k in (1, 2, 3)]  # a function of (seed, attempt) only
    assert segment_seed(1235, 0, 1) != later[0] and segment_seed(1234, 1, 1) not in later


def test_a_row_without_audio_is_generated_again_and_ends_ok(actor, eos_first):
    seed = eos_first[0]
    first = actor(text_rows([{S.ID: "row", S.TEXT: TEXT, S.SEED: seed}])).to_pylist()[0]
    assert first[S.STATUS] == S.STATUS_OK, first[S.ERROR]
    assert first[S.ATTEMPTS] == 2 and first[S.N_FRAMES] > 0 and first[S.SEED] == seed
    assert first[S.DISCARDED_FRAMES] == 0  # the failed attempt made no frames
    # the same codes every run, and in any batch composition and position
    again = actor(text_rows([{S.ID: "row", S.TEXT: TEXT, S.SEED: seed}])).to_pylist()[0]
    mates = [{S.ID: f"mate-{i}", S.TEXT: f"Another sentence, number {i}.", S.SEED: 100 + i} for i in range(5)]
    batched = actor(text_rows(mates[:3] + [{S.ID: "row", S.TEXT: TEXT, S.SEED: seed}] + mates[3:])).to_pylist()[3]
    assert first[S.CODES] == again[S.CODES] == batched[S.CODES]
    # the second attempt is the derived seed's own stream: a plain row with that seed, one attempt
    derived = actor(text_rows([{S.ID: "derived", S.TEXT: TEXT, S.SEED: segment_seed(seed, 0, 1)}])).to_pylist()[0]
    assert derived[S.ATTEMPTS] == 1 and derived[S.CODES] == first[S.CODES]


def test_a_row_failing_every_attempt_is_rejected_with_its_flags(actor, eos_first, monkeypatch):
    tune(monkeypatch, actor, "quality", max_attempts=1)
    out = actor(
        text_rows([{S.ID: "bad", S.TEXT: TEXT, S.SEED: eos_first[0]}, {S.ID: "good", S.TEXT: TEXT, S.SEED: 500}])
    )
    bad, good = out.to_pylist()
    assert (bad[S.STATUS], bad[S.QUALITY_FLAGS], bad[S.ATTEMPTS], bad[S.N_FRAMES]) == ("rejected", ["no_audio"], 1, 0)
    assert bad[S.ERROR] is None and bad[S.RETRYABLE] is None
    assert good[S.STATUS] == S.STATUS_OK and good[S.ATTEMPTS] == 1
    # a gate rejecting truncation keeps the best audio of every attempt, as rejected, with flags
    tune(monkeypatch, actor, "quality", reject=["no_audio", "truncated"], max_attempts=2)
    tune(monkeypatch, actor, "engine", stop_on_eos=False)  # every attempt runs to its budget
    cut = actor(text_rows([{S.ID: "cut", S.TEXT: TEXT, S.SEED: 500}])).to_pylist()[0]
    assert cut[S.STATUS] == S.STATUS_REJECTED and "truncated" in cut[S.QUALITY_FLAGS]
    assert cut[S.ATTEMPTS] == 2 and cut[S.N_FRAMES] > 0 and cut[S.AUDIO][S.AUDIO_BYTES]
    assert cut[S.DISCARDED_FRAMES] == cut[S.N_FRAMES]  # the second attempt, same budget, not kept


def test_decoded_rows_carry_their_metrics(actor):
    row = actor(text_rows([{S.ID: "m", S.TEXT: TEXT, S.SEED: 500}])).to_pylist()[0]
    audio, sr = sf.read(io.BytesIO(row[S.AUDIO][S.AUDIO_BYTES]), dtype="float32")
    metrics = checks.audio_metrics(audio, sr, TEXT, actor.settings.quality)
    assert row[S.SILENCE_RATIO] == pytest.approx(metrics.silence_ratio, abs=0.02)
    assert row[S.CLIPPED_RATIO] == pytest.approx(metrics.clipped_ratio, abs=1e-3)
    if metrics.loudness_lufs is not None:  # FLAC's 16 bits move it a little
        assert row[S.LOUDNESS_LUFS] == pytest.approx(metrics.loudness_lufs, abs=0.05)
    assert row[S.SPEECH_RATE_S_PER_CHAR] == pytest.approx(row[S.AUDIO_SECONDS] / len(TEXT.replace(" ", "")))
    codes = np.array(row[S.CODES])
    assert row[S.REPEAT_RATIO] == pytest.approx(checks.repeat_ratio(codes[0], 4))


@pytest.mark.slow  # a scan of 120 five-segment rows
def test_a_long_row_whose_first_segment_stops_at_eos_first_completes(actor, monkeypatch):
    tune(monkeypatch, actor, "long_form", segment_bytes=24)
    found = scan(actor, monkeypatch, LONG_TEXT, range(120))
    assert found and set(found.values()) == {0}, found  # later segments of this text never did
    row = {S.ID: "long", S.TEXT: LONG_TEXT, S.SEED: min(found), S.MAX_FRAMES: 1}
    out = actor(text_rows([row])).to_pylist()[0]
    assert out[S.STATUS] == S.STATUS_OK and out[S.ATTEMPTS] == 2 and out[S.SEGMENTS] >= 3
    assert out[S.SEGMENT_FRAMES] == [1] * out[S.SEGMENTS]


# four segments of 20, 20, 10 and 21 characters: at one frame (46 ms) each, only the third is
# slower than 0.003 s per character (0.0046, the others ~0.0023)
FOUR = "Alpha beta gamma delta. Epsilon zeta eta theta. Iota kappa. Lambda mu nu xi omicron."


def test_a_long_row_regenerates_only_its_failed_segment(actor, monkeypatch):
    tune(monkeypatch, actor, "long_form", segment_bytes=24)
    tune(monkeypatch, actor, "quality", reject=["no_audio", "speech_rate"], min_s_per_char=0.0, max_s_per_char=0.003)
    tune(monkeypatch, actor, "quality", max_attempts=1)
    for seed in range(20):  # one whose segments all speak at the first attempt
        row = {S.ID: "four", S.TEXT: FOUR, S.SEED: seed, S.MAX_FRAMES: 1}
        once = actor(text_rows([row])).to_pylist()[0]
        if once[S.SEGMENT_FRAMES] == [1, 1, 1, 1]:
            break
    before, history = actor.recorder.segments["four"], actor.recorder.history["four"]
    tune(monkeypatch, actor, "quality", max_attempts=3)
    gated = actor(text_rows([row])).to_pylist()[0]
    after = actor.recorder.segments["four"]
    assert gated[S.SEGMENTS] == 4 and gated[S.SEGMENT_FRAMES] == [1, 1, 1, 1]
    # (one frame each: every segment hits its budget, truncated, which this gate does not reject)
    # the third segment alone ran three times (two extra frames); the best of its attempts, all
    # equally flawed, is the first: every segment's codes and prompt history are as without retries
    assert (once[S.ATTEMPTS], gated[S.ATTEMPTS]) == (1, 3)
    assert (once[S.DISCARDED_FRAMES], gated[S.DISCARDED_FRAMES]) == (0, 2)
    assert gated[S.STATUS] == once[S.STATUS] == S.STATUS_REJECTED and gated[S.QUALITY_FLAGS] == [
        "truncated",
        "speech_rate",
    ]
    assert gated[S.CODES] == once[S.CODES]
    assert all(np.array_equal(b.codes, a.codes) for (_, b), (_, a) in zip(before, after))
    assert actor.recorder.history["four"] == history


@pytest.mark.slow
def test_rejected_rows_are_done_on_rerun_unless_retry_rejected(ray_cluster, eos_first, tmp_path, small_settings):
    import pyarrow.parquet as pq

    from pipeline.output.layout import OutputLayout
    from pipeline.run.steps import run

    source, out = tmp_path / "in.parquet", tmp_path / "out"
    specs = [{S.ID: "bad", S.TEXT: TEXT, S.SEED: eos_first[0]}, {S.ID: "good", S.TEXT: TEXT, S.SEED: 500}]
    pq.write_table(text_rows(specs), source)
    float32 = ["model.dtype=float32", "model.codec_dtype=float32"]  # as the seed scan's actor
    args = [*small_settings, "engine.stop_on_eos=true", f"data.path={source}", f"output.dir={out}", *float32]

    def written() -> dict:
        return {r[S.ID]: r for r in OutputLayout(str(out)).read().to_pylist()}

    first = run(compose_typed([*args, "quality.max_attempts=1"]))
    assert (first.summary["rows_rejected"], first.summary["rows_error"]) == (1, 0)
    assert first.summary["quality"]["rows_by_flag"]["no_audio"] == 1
    assert written()["bad"][S.STATUS] == S.STATUS_REJECTED
    # more attempts alone do not redo it: the quality settings are not part of the row's content
    again = run(compose_typed(args))
    assert again.summary["run_rows"] == 0 and written()["bad"][S.RUN] == first.summary["run_id"]
    redo = run(compose_typed([*args, "output.retry_rejected=true"]))
    bad = written()["bad"]
    assert redo.summary["run_rows"] == 1 and bad[S.RUN] == redo.summary["run_id"]
    assert bad[S.STATUS] == S.STATUS_OK and bad[S.ATTEMPTS] == 2
    assert written()["good"][S.RUN] == first.summary["run_id"]
