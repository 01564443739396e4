"""The actor as a continuously fed server: blocks in flight together share the engine's slots,
each block comes back when its own last row is done, and how blocks interleave never changes a
row's codes."""

from __future__ import annotations

import asyncio
import io
import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import soundfile as sf

from actors import schema as S
from actors.synth import SynthActor, Trace
from actors.synth.actor import SynthStage
from actors.synth.priority import HELPER_NICENESS
from pipeline.config import compose_typed
from pipeline.run.actor_settings import actor_arguments

WAIT_S = 120.0  # a safety net for a broken actor, never reached when it works


def table(rows: list[dict]) -> pa.Table:
    columns = {S.ID: pa.string(), S.TEXT: pa.string(), S.SEED: pa.int64(), S.MAX_FRAMES: pa.int64()}
    return pa.Table.from_pylist(rows, schema=pa.schema(list(columns.items())))


def rows(prefix: str, n: int, frames: int = 6) -> list[dict]:
    return [
        {S.ID: f"{prefix}-{i}", S.TEXT: f"Row {i} of {prefix}.", S.SEED: 7 + i, S.MAX_FRAMES: frames} for i in range(n)
    ]


def by_id(out: pa.Table) -> dict:
    return {r[S.ID]: r for r in out.to_pylist()}


@pytest.fixture(scope="module")
def actor(small_settings) -> SynthActor:
    cfg = compose_typed(small_settings + ["engine.max_rows=4", "engine.max_concurrent_blocks=2"])
    return SynthActor(**actor_arguments(cfg, None, run_id="feed"), recorder=Trace())


def hold_engine_until(actor: SynthActor, monkeypatch, rows_in: int) -> threading.Event:
    """The engine's next step waits until `rows_in` rows have reached the engine loop's inbox
    (so rows of every block submitted are there together); returns the event it waits on."""
    arrived = threading.Event()
    count = [0]
    real_put = actor.feeder.inbox.put

    def put(row):
        real_put(row)
        count[0] += 1
        if count[0] >= rows_in:
            arrived.set()

    monkeypatch.setattr(actor.feeder.inbox, "put", put)
    real_step = actor.engine.step

    def step():
        assert arrived.wait(WAIT_S), "the blocks' rows never all arrived"
        return real_step()

    monkeypatch.setattr(actor.engine, "step", step)
    return arrived


def test_rows_of_two_blocks_decode_in_the_same_engine_step(actor, monkeypatch):
    hold_engine_until(actor, monkeypatch, rows_in=4)
    first, second = table(rows("a", 2)), table(rows("b", 2))
    before = actor.feeder.steps
    with ThreadPoolExecutor(2) as pool:
        a, b = pool.submit(actor, first), pool.submit(actor, second)
        out_a, out_b = a.result(WAIT_S), b.result(WAIT_S)
    assert [r[S.STATUS] for r in out_a.to_pylist() + out_b.to_pylist()] == [S.STATUS_OK] * 4
    steps = [blocks for step, blocks in actor.recorder.steps if step > before]
    assert any(len(blocks) == 2 for blocks in steps), steps
    # one output row per input row, in the block's order, each in its own block's output
    assert out_a.column(S.ID).to_pylist() == ["a-0", "a-1"] and out_b.column(S.ID).to_pylist() == ["b-0", "b-1"]
    batch_a = out_a.to_pylist()[0][S.BATCH]
    assert batch_a[S.BATCH_SLOTS] == 4 and 0.0 < batch_a[S.BATCH_SLOT_OCCUPANCY] <= 1.0
    assert batch_a[S.BATCH_SLOT_ROWS] >= 2 * 6  # two rows live for at least their 6 frames each
    assert 0.0 < batch_a[S.BATCH_ENGINE_BUSY] <= 1.0


def test_a_block_done_first_is_returned_while_a_later_one_still_runs(actor, monkeypatch):
    """The long block goes in first; the short block, submitted after it, finishes first and
    its call returns while the long block's row is still in the engine: the engine is held
    after the short row's last step until the short call has returned (which it could not if
    calls waited for each other), so the long block cannot be done by then."""
    hold_engine_until(actor, monkeypatch, rows_in=2)
    short_returned = threading.Event()
    long_id = "long-0"
    real_step = actor.engine.step  # already the holding wrapper
    waited = []

    short_done = threading.Event()

    def step():
        if short_done.is_set() and not waited:  # the short row left the engine at the last step
            waited.append(short_returned.wait(WAIT_S))
        finished = real_step()
        if any(r.frames == 4 for r in finished):
            short_done.set()
        return finished

    monkeypatch.setattr(actor.engine, "step", step)
    with ThreadPoolExecutor(2) as pool:
        long_call = pool.submit(actor, table([{S.ID: long_id, S.TEXT: "A long one.", S.SEED: 1, S.MAX_FRAMES: 40}]))
        short_call = pool.submit(actor, table(rows("short", 1, frames=4)))
        out_short = short_call.result(WAIT_S)
        short_returned.set()
        long_running_when_short_returned = not long_call.done()
        out_long = long_call.result(WAIT_S)
    assert waited == [True]  # the short block came back with the engine held: it did not wait for the long one
    assert long_running_when_short_returned
    assert out_short.to_pylist()[0][S.STATUS] == S.STATUS_OK and out_short.to_pylist()[0][S.N_FRAMES] == 4
    assert out_long.to_pylist()[0][S.STATUS] == S.STATUS_OK and out_long.to_pylist()[0][S.N_FRAMES] == 40


def test_a_blocks_rows_without_a_clip_run_while_its_clips_are_read(actor, monkeypatch):
    """The rows that need no reference clip enter the engine first; the others follow once their
    clips are read and encoded (before, the whole block waited for its clips)."""
    generating = threading.Event()
    real_step = actor.engine.step
    monkeypatch.setattr(actor.engine, "step", lambda: generating.set() or real_step())
    real_load = actor.references.load
    engine_ran_first = []

    def load(source):
        engine_ran_first.append(generating.wait(20.0))  # never set if the block waited for this clip
        return real_load(source)

    monkeypatch.setattr(actor.references, "load", load)
    clip = io.BytesIO()
    noise = np.random.default_rng(2026).uniform(-0.3, 0.3, 22050).astype(np.float32)  # a clip no cache holds
    sf.write(clip, noise, 44100, format="WAV")
    block = rows("clip", 4)
    for row in block[:2]:
        row[S.REF_AUDIO] = clip.getvalue()
    out = actor(pa.Table.from_pylist(block))
    assert [r[S.STATUS] for r in out.to_pylist()] == [S.STATUS_OK] * 4, out.column(S.ERROR).to_pylist()
    assert engine_ran_first == [True]  # one read: the two rows share the clip


def test_a_blocks_rows_enter_the_engine_longest_budget_first(actor, monkeypatch):
    """So the rows left when the input runs out are short and the slots drain in few steps."""
    added = []
    real_add = actor.engine.add
    monkeypatch.setattr(actor.engine, "add", lambda request: added.append(request.request_id) or real_add(request))
    block = rows("order", 4)
    for row, frames in zip(block, (3, 9, 5, 7)):
        row[S.MAX_FRAMES] = frames
    out = actor(table(block))
    assert out.column(S.STATUS).to_pylist() == [S.STATUS_OK] * 4
    assert [request_id.split(".")[1] for request_id in added] == ["1#0", "3#0", "2#0", "0#0"]


def test_codes_do_not_depend_on_how_blocks_interleave(actor):
    """The same rows as one block, and as two different splits run as concurrent blocks: the
    same codes for every row, whichever rows shared the engine's steps."""
    all_rows = rows("mix", 6, frames=8) + [
        {S.ID: "longer", S.TEXT: "A somewhat longer sentence to speak.", S.SEED: 99, S.MAX_FRAMES: 20}
    ]
    alone = by_id(actor(table(all_rows)))
    for split in (2, 5):
        with ThreadPoolExecutor(2) as pool:
            parts = [pool.submit(actor, table(all_rows[:split])), pool.submit(actor, table(all_rows[split:]))]
            together = {**by_id(parts[0].result(WAIT_S)), **by_id(parts[1].result(WAIT_S))}
        assert together.keys() == alone.keys()
        for row_id, row in alone.items():
            assert row[S.STATUS] == S.STATUS_OK, row[S.ERROR]
            assert together[row_id][S.CODES] == row[S.CODES], (split, row_id)


def test_ref_codes_give_the_codes_of_the_audio_they_encode(small_settings, tmp_path):
    """encode_refs turns the demo table's references into a ref_codes column; rows given those
    codes (and no audio) come out with exactly the codes of the same rows given the audio."""
    from helpers import DEMO_TABLE, DIALOGUE_TABLE
    from pipeline.encode_refs import encode_refs

    out = tmp_path / "with_codes.parquet"
    settings = [*small_settings, f"data.path={DEMO_TABLE}"]
    counts = encode_refs(str(out), compose_typed(settings))
    with_codes = pq.read_table(out)
    assert counts["rows"] == with_codes.num_rows == pq.read_metadata(DEMO_TABLE).num_rows
    has_audio = [
        r[S.REF_AUDIO] is not None or r[S.REF_AUDIO_PATH] is not None for r in pq.read_table(DEMO_TABLE).to_pylist()
    ]
    assert [c is not None for c in with_codes.column(S.REF_CODES).to_pylist()] == has_audio
    assert counts["encoded"] == sum(has_audio) and counts["failed"] == 0
    # the dialogue rows' voices get their codes too (each voice's `codes`)
    dialogues = tmp_path / "dialogues_with_codes.parquet"
    voice_counts = encode_refs(
        str(dialogues), compose_typed([*small_settings, "model=demo_s2", f"data.path={DIALOGUE_TABLE}"])
    )
    voices = [v for vs in pq.read_table(dialogues).column(S.VOICES).to_pylist() for v in vs]
    assert voices and all(v[S.VOICE_CODES] is not None for v in voices)
    assert voice_counts["encoded"] == len(voices) and voice_counts["failed"] == 0

    actor = SynthActor(**actor_arguments(compose_typed(settings), str(DEMO_TABLE.parent), run_id="codes"))
    picked = [i for i, audio in enumerate(has_audio) if audio][:4] + [has_audio.index(False)]
    rows_in = with_codes.take(picked)
    from_audio = by_id(actor(rows_in.drop_columns([S.REF_CODES])))
    from_codes = by_id(actor(rows_in.drop_columns([S.REF_AUDIO, S.REF_AUDIO_PATH])))
    assert from_codes.keys() == from_audio.keys() and len(from_codes) == 5
    for row_id, row in from_audio.items():
        assert row[S.STATUS] == S.STATUS_OK, row[S.ERROR]
        assert from_codes[row_id][S.STATUS] == S.STATUS_OK and from_codes[row_id][S.CODES] == row[S.CODES], row_id

    codebooks = len(rows_in.column(S.REF_CODES)[0].as_py())
    bad = pa.table(
        {
            S.ID: ["ragged", "shape", "range"],
            S.TEXT: ["Hello."] * 3,
            S.REF_CODES: pa.array(
                [[[1, 2], [3]] * (codebooks // 2) + [[1]] * (codebooks % 2), [[1, 2]], [[10**6]] * codebooks],
                type=pa.list_(pa.list_(pa.int64())),
            ),
        }
    )
    errors = {r[S.ID]: r[S.ERROR] for r in actor(bad).to_pylist()}
    assert "codebooks differ in length" in errors["ragged"]
    assert f"ref_codes must be [{codebooks}][frames]" in errors["shape"]
    assert "ref_codes values must lie in" in errors["range"]


def test_engine_codes_do_not_depend_on_the_request_beside_them(small_settings):
    """What the determinism of interleaved blocks rests on: the engine gives a request the
    codes it gets alone, whatever request shares its steps. This pair of the demo's rows (both
    with references) diverged at frame 12 while the batch's attention key count followed its
    longest row (the CPU kernel's reduction blocking changes with it below 512 keys)."""
    import numpy as np

    from actors.engine.types import Request
    from actors.synth.jobs import Block
    from helpers import DEMO_TABLE

    settings = [*small_settings, "engine.stop_on_eos=true", f"data.path={DEMO_TABLE}"]
    actor = SynthActor(**actor_arguments(compose_typed(settings), str(DEMO_TABLE.parent), run_id="pair"))
    demo = pq.read_table(DEMO_TABLE)
    jobs = actor.preparer.jobs(demo, Block(0, demo.num_rows, 0.0))
    requests = {}
    for index in (16, 23):
        job = jobs[index]
        actor.preparer.prepare([job])
        assert job.ok, job.failure
        prompt = job.chain.prompt().tokens
        requests[index] = Request(f"r{index}", prompt, job.chain.plan.frames[0], sampling=job.spec.sampling)
    alone = actor.engine.generate([requests[23]])[0].codes
    beside = actor.engine.generate([requests[16], requests[23]])[1].codes
    np.testing.assert_array_equal(beside, alone)


@pytest.mark.slow  # > 7 s: the everyday subset stays under 5 minutes
def test_a_codec_process_decodes_what_the_actor_would_and_survives_its_death(small_settings, demo_table):
    """engine.codec_process=true: finished rows are heard (decoded, measured, FLAC-encoded), and
    reference clips encode, in a child process holding its own copy of the codec; the codes,
    audio bytes and measurements are the in-process codec's,
    and a child that dies is started again (the rows of the call that found it dead are
    decoded one by one by the new one)."""
    from actors.synth.codec_process import CodecProcess
    from helpers import DEMO_TABLE

    settings = small_settings + ["engine.max_rows=4"]
    here = SynthActor(**actor_arguments(compose_typed(settings), str(DEMO_TABLE.parent), run_id="codec-here"))
    cfg = compose_typed(settings + ["engine.codec_process=true"])
    separate = SynthActor(**actor_arguments(cfg, str(DEMO_TABLE.parent), run_id="codec-process"))
    try:
        assert isinstance(separate.finisher.codec_runner, CodecProcess)
        clips, ref_texts = (demo_table.column(c).to_pylist() for c in (S.REF_AUDIO_PATH, S.REF_TEXT))
        picked = [i for i, p in enumerate(clips) if p][:3]
        picked += [i for i, (p, t) in enumerate(zip(clips, ref_texts)) if not p and not t][:2]
        batch = demo_table.take(picked).select([S.ID, S.TEXT, S.SEED, S.REF_AUDIO_PATH, S.REF_TEXT])
        expected, got = by_id(here(batch)), by_id(separate(batch))
        assert len(separate.references) == len(here.references) >= 1  # clips were encoded, in the child
        assert got.keys() == expected.keys() and len(got) == 5
        for row_id, row in got.items():
            assert row[S.STATUS] == expected[row_id][S.STATUS] == S.STATUS_OK, (row[S.ERROR], expected[row_id][S.ERROR])
            assert row[S.CODES] == expected[row_id][S.CODES]
            # heard in the child (decode, checks, FLAC) as in the actor: each row decoded alone,
            # so the same FLAC bytes and the same measurements
            assert row[S.AUDIO][S.AUDIO_BYTES] == expected[row_id][S.AUDIO][S.AUDIO_BYTES]
            for column in (
                S.SILENCE_RATIO,
                S.CLIPPED_RATIO,
                S.LOUDNESS_LUFS,
                S.SPEECH_RATE_S_PER_CHAR,
                S.QUALITY_FLAGS,
            ):
                assert row[column] == expected[row_id][column], column
        first = separate.finisher.codec_runner._process
        first.kill()
        first.wait()
        again = by_id(separate(table(rows("cp2", 3))))
        assert all(r[S.STATUS] == S.STATUS_OK for r in again.values()), [r[S.ERROR] for r in again.values()]
        runner = separate.finisher.codec_runner
        assert runner._process.pid != first.pid and runner._process.poll() is None
    finally:
        separate.finisher.codec_runner.close()
    assert separate.finisher.codec_runner._process is None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a thread's own priority is Linux's")
def test_on_cpu_the_actors_helper_threads_queue_below_the_engine_thread(small_settings):
    """A CPU actor's block-call threads and finisher run at HELPER_NICENESS, its engine thread
    at the process's own priority, and rows still come back; the caller's thread is untouched."""
    cfg = compose_typed(small_settings + ["engine.max_rows=4", "engine.max_concurrent_blocks=2"])
    stage = SynthStage(**actor_arguments(cfg, None, run_id="priority"))
    own = os.getpriority(os.PRIO_PROCESS, 0)
    out = asyncio.run(stage(table(rows("nice", 3))))
    assert out.column(S.STATUS).to_pylist() == [S.STATUS_OK] * 3
    niceness = {}
    for thread in threading.enumerate():
        name = thread.name.split("_")[0]
        if name in ("chorus-block", "chorus-finisher", "chorus-engine"):
            niceness.setdefault(name, set()).add(os.getpriority(os.PRIO_PROCESS, thread.native_id))
    assert niceness["chorus-block"] == niceness["chorus-finisher"] == {HELPER_NICENESS}
    assert own in niceness["chorus-engine"] and own < HELPER_NICENESS
    assert os.getpriority(os.PRIO_PROCESS, 0) == own
