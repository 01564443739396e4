"""Long rows end to end: a 3,000-character row becomes one audio generated as a chain of
segments, in an actor next to short rows (which do not wait for it) and through the whole
pipeline on the local Ray."""

from __future__ import annotations

import io
from dataclasses import replace

import numpy as np
import pyarrow as pa
import pytest
import soundfile as sf

from actors import schema as S
from actors.engine.segment import utf8_len
from actors.synth import SynthActor, Trace
from helpers import DEMO_TABLE
from pipeline.config import compose_typed
from pipeline.run.actor_settings import actor_arguments
from pipeline.run.steps import run

SENTENCES = [
    "The old library stood at the end of a narrow street, its windows dusty and tall.",
    "Every morning the keeper opened the doors, swept the steps, and waited for readers.",
    "Some days nobody came; on others, children crowded the reading room until dusk!",
    "Was it the quiet that drew them, or the smell of paper and glue?",
    "Nobody could say for certain, and the keeper never asked.",
]


# few frames per character, so 3,000 characters stay cheap on a CPU: (24 - 2) / 0.1 = 220-byte
# segments of at most 24 frames
FEWER_FRAMES = ["model.budget.frames_per_byte=0.1", "model.budget.min_frames=2"]


def long_text(chars: int = 3000) -> str:
    words, i = [], 0
    while len(" ".join(words)) < chars:
        words.append(SENTENCES[i % len(SENTENCES)])
        i += 1
    return " ".join(words)[:chars].rstrip() + "."


def table(rows: list[dict]) -> pa.Table:
    columns = {
        S.ID: pa.string(),
        S.TEXT: pa.string(),
        S.REF_AUDIO_PATH: pa.string(),
        S.REF_TEXT: pa.string(),
        S.SEED: pa.int64(),
    }
    return pa.Table.from_pylist(rows, schema=pa.schema(list(columns.items())))


@pytest.fixture(scope="module")
def actor(small_settings, demo_table) -> SynthActor:
    cfg = compose_typed(small_settings + FEWER_FRAMES + ["engine.max_tokens=512", "engine.max_rows=8"])
    # the demo clips are confined to their own folder (data.audio_root defaults to the input's)
    return SynthActor(**actor_arguments(cfg, str(DEMO_TABLE.parent), run_id="longform"), recorder=Trace())


def tune(monkeypatch, actor: SynthActor, group: str, **changes) -> None:
    """A variant of one of the actor's settings groups, for one test (every part reads it)."""
    monkeypatch.setattr(actor.settings, group, replace(getattr(actor.settings, group), **changes))


@pytest.mark.slow  # ~10 s
def test_long_row_and_40_short_rows_share_the_slots(actor, demo_table):
    clip = next(p for p in demo_table.column(S.REF_AUDIO_PATH).to_pylist() if p)
    # the clip encoded once before, as for a speaker seen earlier in a run: the long row then
    # enters the engine with the short rows, not after its clip is read
    warm = actor(table([{S.ID: "warm", S.TEXT: "Warm.", S.REF_AUDIO_PATH: clip, S.REF_TEXT: "A short reference."}]))
    assert warm.column(S.STATUS).to_pylist() == [S.STATUS_OK]
    rows = [{S.ID: "long", S.TEXT: long_text(), S.REF_AUDIO_PATH: clip, S.REF_TEXT: "A short reference.", S.SEED: 7}]
    rows += [{S.ID: f"short-{i}", S.TEXT: f"Short sentence number {i}.", S.SEED: i} for i in range(40)]
    out = {r[S.ID]: r for r in actor(table(rows)).to_pylist()}
    assert all(r[S.STATUS] == S.STATUS_OK for r in out.values()), [r[S.ERROR] for r in out.values()]

    long = out["long"]
    trace = actor.recorder.segments["long"]
    assert long[S.SEGMENTS] == len(trace) >= 3000 // 220
    assert long[S.SEGMENT_FRAMES] == [result.frames for _, result in trace]
    assert sum(long[S.SEGMENT_FRAMES]) == long[S.N_FRAMES]
    assert long[S.SEGMENT_STOP_REASONS] == ["budget"] * long[S.SEGMENTS]  # EOS stopping is off here
    assert long[S.TRUNCATED_SEGMENTS] == list(range(long[S.SEGMENTS]))
    # one audio: the segments' codes concatenated, decoded together
    wave, rate = sf.read(io.BytesIO(long[S.AUDIO][S.AUDIO_BYTES]), dtype="float32")
    assert len(wave) == long[S.N_FRAMES] * actor.codec.frame_length
    codes = np.asarray(long[S.CODES])
    assert np.array_equal(codes, np.concatenate([result.codes for _, result in trace], axis=1))

    # later segments carry earlier ones (the voice carries over: segments are sized to leave
    # room for at least the last one), within the slot's positions, and reuse the reference prefix
    history = actor.recorder.history["long"]
    assert history[0] == 0 and all(kept >= 1 for kept in history[1:]), history
    prompts = [result.prompt_tokens for _, result in trace]
    frames = long[S.SEGMENT_FRAMES]
    for k in range(1, len(trace)):  # a kept segment's codes are in the prompt: at least its frames
        assert prompts[k] >= prompts[0] // 2 + frames[k - 1], (k, prompts, frames)
    assert max(p + f for p, f in zip(prompts, frames)) <= 512
    assert all(result.prefix_reused_tokens > 0 for _, result in trace[1:])

    # the short rows do not wait for the long one: all of them are done before its chain
    # ends, and its first segments finish while short rows are still being generated
    short_done = [actor.recorder.segments[f"short-{i}"][0][0] for i in range(40)]
    long_steps = [step for step, _ in trace]
    assert max(short_done) < long_steps[-1]
    assert long_steps[0] < max(short_done)
    # segment k+1 starts the step after k finished: its frames fill the steps in between
    for (step_a, _), (step_b, result_b) in zip(trace, trace[1:]):
        assert step_b - step_a <= result_b.frames + 1


def test_a_text_that_fits_one_segment_is_not_cut_for_history(actor, demo_table):
    # room for the previous segment is kept only in a chain: a text that fits one request whole
    # (here, with a reference, more than half the room and less than all of it) stays one segment
    clip = next(p for p in demo_table.column(S.REF_AUDIO_PATH).to_pylist() if p)
    text = long_text(180)
    fields = {S.REF_AUDIO_PATH: clip, S.REF_TEXT: "A short reference."}
    out = actor(table([{S.ID: "one", S.TEXT: text, S.SEED: 1, **fields}])).to_pylist()[0]
    assert out[S.STATUS] == S.STATUS_OK and out[S.SEGMENTS] == 1, out[S.ERROR]
    # ... while the same words twice over make a chain whose segments are each under half
    twice = actor(table([{S.ID: "two", S.TEXT: text + " " + text, S.SEED: 1, **fields}])).to_pylist()[0]
    assert twice[S.STATUS] == S.STATUS_OK and twice[S.SEGMENTS] >= 3, twice[S.SEGMENTS]
    assert all(kept >= 1 for kept in actor.recorder.history["two"][1:])


def test_segments_that_end_on_im_end_are_not_truncated(actor, monkeypatch):
    # with EOS stopping on, a segment ends on <|im_end|> ("eos") or on its frame budget
    # ("budget"); only the latter are listed in truncated_segments
    tune(monkeypatch, actor, "engine", stop_on_eos=True)
    seen = set()
    rows = [{S.ID: f"long-{seed}", S.TEXT: long_text(700), S.SEED: seed} for seed in range(8)]
    for out in actor(table(rows)).to_pylist():
        if out[S.STATUS] != S.STATUS_OK:  # a segment ended before any frame on every attempt
            assert out[S.STATUS] == S.STATUS_REJECTED and "no_audio" in out[S.QUALITY_FLAGS], out[S.ERROR]
            continue
        reasons = out[S.SEGMENT_STOP_REASONS]
        assert set(reasons) <= {"eos", "budget"} and len(reasons) == out[S.SEGMENTS] > 1
        assert out[S.TRUNCATED_SEGMENTS] == [k for k, reason in enumerate(reasons) if reason == "budget"]
        seen.update(reasons)
    assert seen == {"eos", "budget"}  # both kinds happened, so the rule above was tested on both


def test_row_over_max_text_chars_is_an_error_row(actor, monkeypatch, small_settings):
    cfg = compose_typed(small_settings + ["data.max_text_chars=100", "long_form.segment_bytes=64"])
    args = actor_arguments(cfg, None, run_id="x")  # the settings reach the actor
    assert args["settings"].data.max_text_chars == 100 and args["settings"].long_form.segment_bytes == 64
    tune(monkeypatch, actor, "data", max_text_chars=100)
    out = actor(table([{S.ID: "over", S.TEXT: "x" * 101}, {S.ID: "at", S.TEXT: "y" * 100}])).to_pylist()
    assert out[0][S.STATUS] == S.STATUS_ERROR
    assert out[0][S.ERROR] == (
        "text is 101 characters long, more than data.max_text_chars=100; split the row or raise data.max_text_chars"
    )
    assert out[1][S.STATUS] == S.STATUS_OK and out[1][S.SEGMENTS] == 1


def test_failed_segment_fails_the_row_naming_it(actor, monkeypatch):
    real_add = actor.engine.add

    def add(request):  # the third segment of the long row gets a prompt the engine refuses
        if request.request_id.endswith("#2"):
            request.prompt = request.prompt[:, :0]
        real_add(request)

    monkeypatch.setattr(actor.engine, "add", add)
    out = actor(table([{S.ID: "long", S.TEXT: long_text(600), S.SEED: 1}, {S.ID: "ok", S.TEXT: "Fine."}]))
    rows = {r[S.ID]: r for r in out.to_pylist()}
    assert rows["ok"][S.STATUS] == S.STATUS_OK
    bad = rows["long"]
    assert bad[S.STATUS] == S.STATUS_ERROR
    assert bad[S.ERROR].startswith(f"segment 3 of {bad[S.SEGMENTS]}: generation: prompt is empty")
    assert len(bad[S.SEGMENT_FRAMES]) == 3 and bad[S.SEGMENT_STOP_REASONS][2] == "error"


def test_dialogue_row_segments_keep_speakers(actor):
    turns = [f"<|speaker:{i % 2}|>{SENTENCES[i % len(SENTENCES)]}" for i in range(12)]
    text = " ".join(turns)
    assert utf8_len(text) > 2 * 220
    out = actor(table([{S.ID: "dialogue", S.TEXT: text, S.SEED: 3}])).to_pylist()[0]
    assert out[S.STATUS] == S.STATUS_OK, out[S.ERROR]
    assert out[S.SEGMENTS] > 1 and sum(out[S.SEGMENT_FRAMES]) == out[S.N_FRAMES]


@pytest.mark.slow
def test_3000_character_row_through_the_pipeline(ray_cluster, tmp_path, small_settings, read_rows):
    source = tmp_path / "long.parquet"
    import pyarrow.parquet as pq

    pq.write_table(
        table([{S.ID: "chapter", S.TEXT: long_text(), S.SEED: 5}, {S.ID: "line", S.TEXT: "One line.", S.SEED: 6}]),
        source,
    )
    run(compose_typed(small_settings + FEWER_FRAMES + [f"data.path={source}", f"output.dir={tmp_path / 'out'}"]))
    rows = {r[S.ID]: r for r in read_rows(tmp_path / "out")}
    chapter = rows["chapter"]
    assert chapter[S.STATUS] == S.STATUS_OK, chapter[S.ERROR]
    assert chapter[S.SEGMENTS] > 1 and len(chapter[S.SEGMENT_FRAMES]) == chapter[S.SEGMENTS]
    assert sum(chapter[S.SEGMENT_FRAMES]) == chapter[S.N_FRAMES]
    wave, rate = sf.read(io.BytesIO(chapter[S.AUDIO][S.AUDIO_BYTES]), dtype="float32")
    assert rate == chapter[S.SAMPLE_RATE]
    assert len(wave) / rate == pytest.approx(chapter[S.AUDIO_SECONDS])
    # samples per frame, from the one-line row: the chapter's audio is its frames' worth
    line_wave, _ = sf.read(io.BytesIO(rows["line"][S.AUDIO][S.AUDIO_BYTES]), dtype="float32")
    frame_length = len(line_wave) / rows["line"][S.N_FRAMES]
    assert frame_length > 1 and len(wave) == chapter[S.N_FRAMES] * frame_length
    assert np.isfinite(wave).all() and np.abs(wave).max() > 0
    assert rows["line"][S.STATUS] == S.STATUS_OK and rows["line"][S.SEGMENTS] == 1


def test_bench_workload_mixes_in_long_rows(tmp_path):
    import pyarrow.parquet as pq

    from pipeline.bench.workload import make_workload

    make_workload(tmp_path / "w.parquet", 40, 8.0, 0.0, 0, long_fraction=0.25, long_chars=3000)
    texts = pq.read_table(tmp_path / "w.parquet").column(S.TEXT).to_pylist()
    long_rows = [t for t in texts if len(t) > 2900]
    assert 3 <= len(long_rows) <= 20 and all(len(t) <= 3001 for t in long_rows)
    assert len(texts) - len(long_rows) >= 20 and all(len(t) < 500 for t in texts if t not in long_rows)


def test_rows_whose_prompts_fail_do_not_stop_the_others(actor, monkeypatch):
    from actors.engine.prompt import PromptError

    real = actor.planner.builder.build_segment

    def build_segment(text, *args, **kwargs):
        if text.startswith("Refused"):
            raise PromptError("refused for the test")
        return real(text, *args, **kwargs)

    monkeypatch.setattr(actor.planner.builder, "build_segment", build_segment)
    rows = [{S.ID: f"bad-{i}", S.TEXT: f"Refused {i}."} for i in range(9)]  # more than the 8 slots
    rows.append({S.ID: "good", S.TEXT: "Accepted."})
    out = {r[S.ID]: r for r in actor(table(rows)).to_pylist()}
    assert all(out[f"bad-{i}"][S.ERROR] == "refused for the test" for i in range(9))
    assert out["good"][S.STATUS] == S.STATUS_OK
