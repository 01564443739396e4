"""Regeneration on the checks measured on decoded audio (actors/quality/gate.py), on the random demo
model: a row whose first decoded round is silenced (a planted fault: the gate's input zeroed
before the real checks run) goes back to the engine and comes out ok from its second attempt,
the same audio in any batch and on rerun; a row failing every round is `rejected` with its best
round; a long row is regenerated from its failing segment on, within
quality.max_regenerated_share; and the speaker and MOS checks on tiny models of their formats,
a reference embedded once per actor however many rows use it."""

from __future__ import annotations

import io
from dataclasses import replace

import numpy as np
import pytest
import soundfile as sf

from actors import schema as S
from actors.quality.tiny import build_tiny_dnsmos, build_tiny_wavlm
from actors.synth import SynthActor, Trace
from actors.synth.chain import segment_seed
from helpers import REPO, plant, text_rows, tune
from pipeline.config import compose_typed
from pipeline.run.actor_settings import actor_arguments

TEXT = "Hello there, how are you?"
# four segments at long_form.segment_bytes=24
FOUR = "Alpha beta gamma delta. Epsilon zeta eta theta. Iota kappa. Lambda mu nu xi omicron."
SEED = 500


@pytest.fixture(scope="module")
def actor(small_settings) -> SynthActor:
    settings = small_settings + ["engine.max_tokens=512", "quality.reject=[no_audio,silence,clipping]"]
    return SynthActor(**actor_arguments(compose_typed(settings), None, run_id="regen"), recorder=Trace())


def audio(row: dict) -> np.ndarray:
    return sf.read(io.BytesIO(row[S.AUDIO][S.AUDIO_BYTES]), dtype="float32")[0]


def silence_first_round(job, round_: int, wave: np.ndarray, task) -> np.ndarray:
    return np.zeros_like(wave) if job.spec.id == "row" and round_ == 0 else wave


def test_a_row_silent_on_its_first_round_comes_out_ok_from_its_second(actor, monkeypatch):
    plain = actor(text_rows([{S.ID: "row", S.TEXT: TEXT, S.SEED: SEED}])).to_pylist()[0]
    assert plain[S.STATUS] == S.STATUS_OK and plain[S.ATTEMPTS] == 1, plain[S.QUALITY_FLAGS]
    seen = plant(monkeypatch, actor, silence_first_round)
    first = actor(text_rows([{S.ID: "row", S.TEXT: TEXT, S.SEED: SEED}])).to_pylist()[0]
    assert seen == [("row", 0), ("row", 1)]  # decoded twice: sent back once
    assert first[S.STATUS] == S.STATUS_OK and first[S.ATTEMPTS] == 2 and first[S.QUALITY_FLAGS] == ["truncated"]
    assert first[S.DISCARDED_FRAMES] == plain[S.N_FRAMES]  # the silenced round's frames
    # the second round is the derived seed's own stream: a plain row with that seed
    derived = actor(text_rows([{S.ID: "d", S.TEXT: TEXT, S.SEED: segment_seed(SEED, 0, 1)}])).to_pylist()[0]
    assert first[S.CODES] == derived[S.CODES] and first[S.CODES] != plain[S.CODES]
    np.testing.assert_array_equal(audio(first), audio(derived))
    # the same audio on rerun and in any batch composition and position
    again = actor(text_rows([{S.ID: "row", S.TEXT: TEXT, S.SEED: SEED}])).to_pylist()[0]
    mates = [{S.ID: f"mate-{i}", S.TEXT: f"Another sentence, number {i}.", S.SEED: 100 + i} for i in range(5)]
    batched = actor(text_rows(mates[:3] + [{S.ID: "row", S.TEXT: TEXT, S.SEED: SEED}] + mates[3:])).to_pylist()
    assert batched[3][S.ID] == "row" and batched[3][S.ATTEMPTS] == 2
    for other in (again, batched[3]):
        assert other[S.CODES] == first[S.CODES]
        np.testing.assert_array_equal(audio(other), audio(first))
    assert all(r[S.ATTEMPTS] == 1 for r in batched if r[S.ID] != "row")  # the mates were not touched


def test_a_row_failing_every_round_is_rejected_with_its_best_round(actor, monkeypatch):
    def fault(job, round_: int, wave: np.ndarray, task) -> np.ndarray:
        if job.spec.id != "bad":
            return wave
        planted = np.zeros_like(wave)
        if round_ == 0:  # silent and clipped: worse than silent alone
            planted[: len(wave) // 50] = 1.0
        return planted

    seen = plant(monkeypatch, actor, fault)
    row = actor(text_rows([{S.ID: "bad", S.TEXT: TEXT, S.SEED: SEED}])).to_pylist()[0]
    assert seen == [("bad", 0), ("bad", 1), ("bad", 2)]  # max_attempts rounds
    assert row[S.STATUS] == S.STATUS_REJECTED and row[S.ATTEMPTS] == 3
    assert row[S.QUALITY_FLAGS] == ["truncated", "silence", "loudness"]  # round 1's: no clipping
    assert row[S.CLIPPED_RATIO] == 0.0 and row[S.SILENCE_RATIO] == 1.0
    derived = actor(text_rows([{S.ID: "d1", S.TEXT: TEXT, S.SEED: segment_seed(SEED, 0, 1)}])).to_pylist()[0]
    assert row[S.CODES] == derived[S.CODES]  # the best round, the earliest of the equally flawed
    assert row[S.N_FRAMES] == derived[S.N_FRAMES] and row[S.DISCARDED_FRAMES] == 2 * row[S.N_FRAMES]
    assert not audio(row).any()  # what was measured is what is written


def segment_stretch_silencer(segment: int):
    """Silence one segment's stretch of the row's first round."""

    def fault(job, round_: int, wave: np.ndarray, task) -> np.ndarray:
        if job.spec.id != "four" or round_ != 0:
            return wave
        frames = [r.frames for r in job.chain.results]
        per_frame = len(wave) // sum(frames)
        begin, end = sum(frames[:segment]) * per_frame, sum(frames[: segment + 1]) * per_frame
        planted = wave.copy()
        planted[begin:end] = 0.0
        return planted

    return fault


@pytest.mark.slow  # ~5 s
def test_a_long_row_is_regenerated_from_its_silent_segment_on(actor, monkeypatch):
    tune(monkeypatch, actor, "long_form", segment_bytes=24)
    tune(monkeypatch, actor, "quality", max_silence_ratio=0.9)  # one segment's stretch of four: not the row
    spec = {S.ID: "four", S.TEXT: FOUR, S.SEED: SEED, S.MAX_FRAMES: 20}
    plain = actor(text_rows([spec])).to_pylist()[0]
    before = actor.recorder.segments["four"]
    assert plain[S.SEGMENTS] == 4 and plain[S.ATTEMPTS] == 1
    tune(monkeypatch, actor, "quality", max_silence_ratio=0.2)  # now a silent segment fails the row
    seen = plant(monkeypatch, actor, segment_stretch_silencer(2))
    out = actor(text_rows([spec])).to_pylist()[0]
    after = actor.recorder.segments["four"]
    assert seen == [("four", 0), ("four", 1)]
    assert out[S.STATUS] == S.STATUS_OK and out[S.ATTEMPTS] == 2
    # segments 0 and 1 kept from the first round; 2 and 3 generated again (3's history changed)
    assert [np.array_equal(b.codes, a.codes) for (_, b), (_, a) in zip(before, after)] == [True, True, False, False]
    assert out[S.DISCARDED_FRAMES] == before[2][1].frames + before[3][1].frames
    # segment 2's second attempt is its derived stream; segment 3 starts its count again at 1
    assert after[2][1].request_id.endswith("#2~1") and after[3][1].request_id.endswith("#3~1")


@pytest.mark.slow  # ~6 s
def test_regeneration_stops_at_the_share_of_frames_it_may_take(actor, monkeypatch):
    tune(monkeypatch, actor, "long_form", segment_bytes=24)
    tune(monkeypatch, actor, "quality", max_silence_ratio=0.2, max_regenerated_share=0.5)
    spec = {S.ID: "four", S.TEXT: FOUR, S.SEED: SEED, S.MAX_FRAMES: 20}
    seen = plant(monkeypatch, actor, segment_stretch_silencer(0))  # the whole row would go again
    out = actor(text_rows([spec])).to_pylist()[0]
    assert seen == [("four", 0)]  # not sent back: 4 segments of frames > 0.5 x the row's
    assert out[S.STATUS] == S.STATUS_REJECTED and "silence" in out[S.QUALITY_FLAGS] and out[S.ATTEMPTS] == 1
    tune(monkeypatch, actor, "quality", max_regenerated_share=1.0)
    seen.clear()
    out = actor(text_rows([spec])).to_pylist()[0]
    assert seen == [("four", 0), ("four", 1)] and out[S.STATUS] == S.STATUS_OK


# ---- the model-based checks on tiny models of their formats --------------------------------
@pytest.fixture(scope="module")
def checked_actor(small_settings, tmp_path_factory) -> SynthActor:
    pytest.importorskip("transformers")
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    models = tmp_path_factory.mktemp("checks")
    wavlm = build_tiny_wavlm(models / "wavlm")
    dnsmos = build_tiny_dnsmos(models / "sig_bak_ovr.onnx")
    settings = small_settings + [
        "engine.max_tokens=512",
        "quality.speaker=wavlm",
        f"quality.speaker_model={wavlm}",
        "quality.mos=dnsmos",
        f"quality.mos_model={dnsmos}",
    ]
    return SynthActor(**actor_arguments(compose_typed(settings), None, run_id="checks"))


def test_speaker_and_mos_columns_and_one_embedding_per_reference(checked_actor, demo_table):
    from actors.quality.mos import DNSMOS
    from actors.quality.speaker import cosine

    checked_actor.settings.run = replace(checked_actor.settings.run, input_dir=str(REPO / "data" / "demo"))
    batch = demo_table.slice(0, 12)
    out = checked_actor(batch).to_pylist()
    speaker = checked_actor.gate.speaker
    with_clip = [r for r, i in zip(out, batch.to_pylist()) if i[S.REF_AUDIO_PATH] or i[S.REF_AUDIO]]
    assert with_clip and len(with_clip) < len(out)
    for row, given in zip(out, batch.to_pylist()):
        has_ref = bool(given[S.REF_AUDIO_PATH] or given[S.REF_AUDIO])
        if row[S.STATUS] != S.STATUS_OK:
            continue
        assert (row[S.SPEAKER_SIMILARITY] is not None) == has_ref
        assert 1.0 <= row[S.MOS] <= 5.0 and row[S.MOS_SIG] is not None and row[S.MOS_BAK] is not None
        wave = audio(row)
        (expected,) = DNSMOS(checked_actor.settings.quality.mos_model, threads=1).score([wave], row[S.SAMPLE_RATE])
        assert row[S.MOS] == pytest.approx(expected.ovrl, abs=1e-3)  # FLAC's 16 bits move it a little
        if has_ref:
            reference = speaker.references.get(_ref_key(checked_actor, given), lambda: None)
            mine = speaker.embedder.embed([wave], row[S.SAMPLE_RATE])[0]
            assert row[S.SPEAKER_SIMILARITY] == pytest.approx(cosine(mine, reference), abs=1e-3)
    # summary.json's quality object and the report describe both (their distributions)
    from pipeline.report import quality_figures

    described = quality_figures.figures(S.output_table(out))["metrics"]
    assert {S.SPEAKER_SIMILARITY, S.MOS, S.MOS_SIG, S.MOS_BAK} <= described.keys()
    # each distinct clip embedded once, however many rows used it
    clips = {_ref_key(checked_actor, g) for g in batch.to_pylist() if g[S.REF_AUDIO_PATH] or g[S.REF_AUDIO]}
    assert speaker.references.misses == len(clips) < len(with_clip)
    misses = speaker.references.misses
    checked_actor(batch)
    assert speaker.references.misses == misses  # a second block: every clip cached


def _ref_key(actor: SynthActor, values: dict) -> str:
    return actor.references.spec(values).key
