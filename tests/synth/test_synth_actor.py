"""SynthActor called directly on pyarrow tables, without Ray: one output row per input row,
audio that decodes to what the metadata says, clear per-row errors for every kind of bad
row, results that do not depend on batching, and the per-actor reference cache."""

from __future__ import annotations

import io

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
import soundfile as sf

from actors import schema as S
from actors.lru import LRU
from actors.synth import SynthActor, escape_special_tokens, row_seed
from helpers import DEMO_TABLE, tune
from pipeline.config import compose_typed
from pipeline.run.actor_settings import actor_arguments


@pytest.fixture(scope="module")
def actor(bad_table, small_settings) -> SynthActor:
    cfg = compose_typed(small_settings + ["engine.max_tokens=512"])
    return SynthActor(**actor_arguments(cfg, str(bad_table.path.parent), run_id="unit"))


@pytest.fixture
def demo_root(actor, monkeypatch):
    """The demo's clips are confined to their own folder, not the bad table's."""
    tune(monkeypatch, actor, "run", input_dir=str(DEMO_TABLE.parent))


def by_id(table: pa.Table) -> dict:
    return {row[S.ID]: row for row in table.to_pylist()}


def decode(row: dict) -> np.ndarray:
    return sf.read(io.BytesIO(row[S.AUDIO][S.AUDIO_BYTES]), dtype="float32")[0]


def test_demo_batch_audio_matches_metadata(actor, demo_table, demo_root, monkeypatch):
    tune(monkeypatch, actor, "engine", stop_on_eos=True)  # as the demo runs
    batch = demo_table.slice(0, 12)
    out = actor(batch)
    assert out.schema == S.OUTPUT_SCHEMA
    assert out.column(S.ID).to_pylist() == batch.column(S.ID).to_pylist()  # one row each, in order
    seeds = dict(zip(batch.column(S.ID).to_pylist(), batch.column(S.SEED).to_pylist()))
    for row in out.to_pylist():
        if row[S.STOP_REASON] == "eos" and not row[S.N_FRAMES]:  # no audio after every attempt
            assert row[S.STATUS] == S.STATUS_REJECTED and row[S.QUALITY_FLAGS] == ["no_audio"]
            continue
        assert row[S.STATUS] == S.STATUS_OK, row[S.ERROR]
        wave, rate = sf.read(io.BytesIO(row[S.AUDIO][S.AUDIO_BYTES]), dtype="float32")
        assert rate == row[S.SAMPLE_RATE] == actor.codec.sample_rate
        assert len(wave) == row[S.N_FRAMES] * actor.codec.frame_length
        assert len(wave) / rate == pytest.approx(row[S.AUDIO_SECONDS])
        codes = np.asarray(row[S.CODES])
        assert codes.shape == (actor.codec.num_codebooks, row[S.N_FRAMES])
        (decoded,) = actor.codec.decode_batch([codes])
        # FLAC keeps 16 bits: within one quantisation step of the codec's own output
        np.testing.assert_allclose(wave, np.clip(decoded, -1, 1), atol=1e-4)
        assert row[S.STOP_REASON] in ("eos", "budget")
        assert 0 < row[S.N_FRAMES] <= row[S.MAX_FRAMES]
        assert row[S.PREFILL_MS] > 0 and row[S.DECODE_MS] > 0 and row[S.CODEC_MS] > 0
        assert row[S.TOTAL_MS] >= row[S.DECODE_MS] and row[S.RTF] > 0
        assert row[S.PROMPT_TOKENS] > 0
        assert row[S.AUDIO][S.AUDIO_PATH] == row[S.ID] + ".flac"
        assert row[S.SEED] == (seeds[row[S.ID]] if seeds[row[S.ID]] is not None else row_seed(row[S.ID], 0))
        assert row[S.DEVICE] == "cpu" and row[S.MODEL] == "demo-s1-tiny" and row[S.RUN] == "unit"
        assert row[S.ACTOR] and row[S.NODE] and row[S.FINISHED_AT] > 0
        assert row[S.TEMPERATURE] == pytest.approx(0.8) and row[S.TOP_K] == 30
    assert out.column(S.SPEAKER).to_pylist() == batch.column(S.SPEAKER).to_pylist()


def test_bad_rows_come_back_as_errors(actor, bad_table):
    # kinds of bad rows: refused by the actor, by the driver, a duplicate id, a ref_id conflict
    kinds = len(bad_table.expect_error) + len(bad_table.rejected_by_driver) + 1 + 1
    assert kinds >= 39  # the README's reliability table says how many
    rejected = set(bad_table.rejected_by_driver) | {bad_table.duplicate_id} | set(bad_table.ref_id_conflicts)
    keep = [i for i, row_id in enumerate(bad_table.table.column(S.ID).to_pylist()) if row_id not in rejected]
    batch = bad_table.table.take(keep)
    # a null id still gets its row back (the driver normally answers it before the actor)
    batch = pa.concat_tables([batch, bad_table.table.filter(pc.is_null(bad_table.table.column(S.ID)))])
    out = actor(batch)
    assert out.num_rows == batch.num_rows
    rows = by_id(out.filter(pc.is_valid(out.column(S.ID))))
    for row_id, fragment in bad_table.expect_error.items():
        assert rows[row_id][S.STATUS] == S.STATUS_ERROR, row_id
        assert fragment in rows[row_id][S.ERROR], (row_id, rows[row_id][S.ERROR])
        assert rows[row_id][S.AUDIO] is None
    for row_id in bad_table.expect_ok:
        assert rows[row_id][S.STATUS] == S.STATUS_OK, (row_id, rows[row_id][S.ERROR])
    (null_row,) = [r for r in out.to_pylist() if r[S.ID] is None]
    assert null_row[S.STATUS] == S.STATUS_ERROR and "id is null" in null_row[S.ERROR]
    assert rows["ok-seed-as-text"][S.SEED] == 12345


def test_rows_do_not_depend_on_batching(actor, demo_table, demo_root):
    table = demo_table.slice(0, 9)
    whole = by_id(actor(table))
    pieces = {}
    for part in (table.slice(6, 3), table.slice(0, 2), table.slice(2, 4)):
        pieces.update(by_id(actor(part)))
    assert whole.keys() == pieces.keys()
    for row_id, row in whole.items():
        assert row[S.CODES] == pieces[row_id][S.CODES], row_id
        # the codec's batched matmuls may round differently with other rows beside: audio is
        # equal within float noise (and one 16-bit step), not bit for bit
        np.testing.assert_allclose(decode(row), decode(pieces[row_id]), atol=1e-4, err_msg=row_id)


def test_references_are_encoded_once_per_actor(actor, demo_table, demo_root, monkeypatch):
    encoded = []
    real = actor.codec.encode_batch
    monkeypatch.setattr(
        actor.codec, "encode_batch", lambda waves, **kw: encoded.append(len(waves)) or real(waves, **kw)
    )
    actor.references.cache = LRU(8)
    table = demo_table.slice(0, 10)
    first = by_id(actor(table))
    distinct = {r for r in table.column(S.SPEAKER).to_pylist() if r}
    assert sum(encoded) == len(distinct)  # one encode per speaker, shared by its rows
    second = by_id(actor(table))
    assert sum(encoded) == len(distinct)  # all from the cache now
    assert all(first[i][S.CODES] == second[i][S.CODES] for i in first)


def test_reference_cache_is_bounded():
    cache = LRU(2)
    for key in "abc":
        cache.put(key, np.zeros(1))
    assert cache.get("a") is None and cache.get("b") is not None
    cache.put("d", np.zeros(1))  # "b" was used last, so "c" goes
    assert set(cache.items) == {"b", "d"}


# ---- reliability: no row can break its block ------------------------------------------
def test_values_the_engine_cannot_hold_fail_only_their_row(actor, demo_table):
    """Finding 2: temperature 1e39 passed a float64 isfinite check, became inf in float32 and
    turned the whole block into internal-error rows. Finding 1: top_k 2^31 overflowed the
    int32 output column and failed the job. Now each is its own row's error."""
    batch = demo_table.slice(0, 4).select([S.ID, S.TEXT])
    batch = batch.append_column(S.TEMPERATURE, pa.array([None, "1e39", None, None], pa.string()))
    batch = batch.append_column(S.TOP_K, pa.array([None, None, str(1 << 31), None], pa.string()))
    rows = actor(batch).to_pylist()
    assert [r[S.STATUS] for r in rows] == [S.STATUS_OK, S.STATUS_ERROR, S.STATUS_ERROR, S.STATUS_OK]
    assert "temperature 1e+39 is outside" in rows[1][S.ERROR] and rows[1][S.RETRYABLE] is False
    assert "top_k 2147483648 is outside" in rows[2][S.ERROR]


def test_a_row_that_does_not_fit_the_output_schema_is_its_own_error():
    from actors.synth import output_table_per_row

    good = {S.ID: "a", S.STATUS: S.STATUS_OK, S.TOP_K: 30, S.RUN: "r"}
    overflowing = {S.ID: "b", S.STATUS: S.STATUS_OK, S.TOP_K: 1 << 31, S.RUN: "r"}
    table = output_table_per_row([good, overflowing])
    assert table.schema == S.OUTPUT_SCHEMA
    a, b = table.to_pylist()
    assert a[S.STATUS] == S.STATUS_OK and a[S.TOP_K] == 30
    assert b[S.STATUS] == S.STATUS_ERROR and "does not fit the output schema" in b[S.ERROR] and b[S.RUN] == "r"


def test_an_engine_failure_on_a_block_retries_its_rows_singly(actor, demo_table, monkeypatch):
    """A row that makes the engine raise (fault injected for one request id) fails alone; the
    block's other rows are run one by one and come out ok, with the codes they get anyway."""
    batch = demo_table.slice(0, 4).select([S.ID, S.TEXT, S.SEED])
    expected = by_id(actor(batch))
    poison = batch.column(S.ID)[2].as_py()
    engine = actor.engine
    real_add, real_abort, real_step = engine.add, engine.abort, engine.step
    in_engine = set()  # request ids added and not yet finished or aborted

    def add(request):
        in_engine.add(request.request_id)
        real_add(request)

    def abort(request_id):
        in_engine.discard(request_id)
        return real_abort(request_id)

    def step():
        if any(r.endswith(".2#0") for r in in_engine):  # the actor's request for row 2's first segment
            raise RuntimeError("index 4097 is out of bounds for dimension 0 with size 4097")
        finished = real_step()
        in_engine.difference_update(r.request_id for r in finished)
        return finished

    monkeypatch.setattr(engine, "add", add)
    monkeypatch.setattr(engine, "abort", abort)
    monkeypatch.setattr(engine, "step", step)
    rows = by_id(actor(batch))
    assert rows[poison][S.STATUS] == S.STATUS_ERROR and rows[poison][S.RETRYABLE] is True
    assert "internal error in the engine" in rows[poison][S.ERROR]
    for row_id, row in rows.items():
        if row_id != poison:
            assert row[S.STATUS] == S.STATUS_OK, row[S.ERROR]
            assert row[S.CODES] == expected[row_id][S.CODES]


def test_a_codec_failure_on_a_batch_decodes_its_rows_singly(actor, demo_table, monkeypatch):
    """One row whose codes make the codec raise (fault injected for that row's codes) fails
    alone, retryable; the other rows of its codec batch are decoded one by one and come out ok."""
    batch = demo_table.slice(0, 4).select([S.ID, S.TEXT, S.SEED])
    expected = by_id(actor(batch))
    poison = batch.column(S.ID)[1].as_py()
    poison_codes = np.asarray(expected[poison][S.CODES])
    real = actor.finisher.codec_runner.decode_batch
    calls = []

    def decode_batch(codes, **kw):
        calls.append(len(codes))
        frames = poison_codes.shape[1]  # a row's codes come padded to engine.codec_frame_bucket frames
        if any(c.shape[1] >= frames and np.array_equal(c[:, :frames], poison_codes) for c in codes):
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return real(codes, **kw)

    monkeypatch.setattr(actor.finisher.codec_runner, "decode_batch", decode_batch)
    tune(monkeypatch, actor, "engine", codec_batch_rows=4, codec_wait_ms=5000.0)  # the four rows decode as one batch
    rows = by_id(actor(batch))
    assert max(calls) > 1  # the failing call held other rows too
    assert rows[poison][S.STATUS] == S.STATUS_ERROR and rows[poison][S.RETRYABLE] is True
    assert "codec decode" in rows[poison][S.ERROR] and "illegal memory access" in rows[poison][S.ERROR]
    for row_id, row in rows.items():
        if row_id != poison:
            assert row[S.STATUS] == S.STATUS_OK, row[S.ERROR]
            assert row[S.CODES] == expected[row_id][S.CODES] and row[S.AUDIO] is not None


def test_a_reference_that_hangs_fails_its_rows_not_the_actor(actor, demo_table, demo_root, monkeypatch):
    """Finding 8: a gs:// clip with no network held its actor and all its rows for 7+
    minutes. A clip load that never returns (injected: it waits forever) now fails its own
    rows after data.reference_timeout_s, as retryable errors; the block's other rows finish."""
    import threading

    never = threading.Event()
    real = actor.references.load

    def load(source):
        if isinstance(source, str) and source.endswith("hangs.flac"):
            never.wait()
        return real(source)

    monkeypatch.setattr(actor.references, "load", load)
    tune(monkeypatch, actor, "data", reference_timeout_s=0.5)
    batch = demo_table.slice(0, 3).select([S.ID, S.TEXT, S.REF_AUDIO_PATH])
    paths = batch.column(S.REF_AUDIO_PATH).to_pylist()
    paths[1] = "hangs.flac"
    batch = batch.set_column(2, S.REF_AUDIO_PATH, pa.array(paths, pa.string()))
    try:
        rows = actor(batch).to_pylist()
    finally:
        never.set()
    assert [r[S.STATUS] for r in rows] == [S.STATUS_OK, S.STATUS_ERROR, S.STATUS_OK]
    assert "longer than 0.5 s (data.reference_timeout_s)" in rows[1][S.ERROR] and rows[1][S.RETRYABLE]


def test_text_cap_is_checked_before_tokenizing(actor, monkeypatch):
    """Finding 8: a 20 MB text was tokenized whole before being refused."""
    tokenized = []
    real = actor.planner.builder.build
    monkeypatch.setattr(actor.planner.builder, "build", lambda text, **kw: tokenized.append(text) or real(text, **kw))
    (row,) = actor(pa.table({S.ID: ["big"], S.TEXT: ["word " * 4_000_000]})).to_pylist()
    assert row[S.STATUS] == S.STATUS_ERROR and "text is 20000000 bytes; the limit is 200000" in row[S.ERROR]
    assert tokenized == []


def test_special_token_spellings_in_text_are_plain_text(actor, monkeypatch):
    """Finding 9: `<|im_end|>` in a row's text was encoded as the control token (prompt
    injection). Escaped, the prompt holds exactly the control tokens the builder itself puts
    there; data.allow_special_tokens=true keeps the old behaviour."""
    tokenizer = actor.lm.tokenizer
    im_end = tokenizer.token_id("<|im_end|>")

    def control_tokens(text: str) -> int:
        special = actor.planner.special_tokens
        escaped = text if actor.settings.data.allow_special_tokens else escape_special_tokens(text, special)
        return int((actor.planner.builder.build(escaped).tokens[0] == im_end).sum())

    plain = control_tokens("Say it aloud.")
    assert control_tokens("Say <|im_end|> it <|im_end|> aloud.") == plain
    special = actor.planner.special_tokens
    assert escape_special_tokens("a <|speaker:1|> b <|im_end|>", special) == "a <|speaker:1|> b <\u2060|im_end|>"
    assert escape_special_tokens("no tags <| here", special) == "no tags <| here"
    tune(monkeypatch, actor, "data", allow_special_tokens=True)
    assert control_tokens("Say <|im_end|> it <|im_end|> aloud.") == plain + 2


WATCHDOG_SCRIPT = """
import sys, threading
import pyarrow as pa
from actors.synth import SynthActor
from pipeline.config import compose_typed
from pipeline.run.actor_settings import actor_arguments

attempts = sys.argv[1]
cfg = compose_typed(["cluster.block_timeout_s=2", "model.budget.max_frames=8"])
actor = SynthActor(**actor_arguments(cfg, None, run_id="watchdog", attempts=attempts))
actor.engine.step = lambda: threading.Event().wait()  # a device call that never returns
actor(pa.table({"id": ["stuck"], "text": ["This block never finishes."]}))
print("returned")
"""


@pytest.mark.slow  # ~20 s: waits out the watchdog
def test_a_stuck_block_trips_the_watchdog_and_counts_as_a_crash(tmp_path):
    """Finding 8's per-block watchdog: a block stuck past cluster.block_timeout_s makes its
    actor exit (Ray then restarts it and retries the block), and the block's crash count is
    left in the attempts ledger, so a block that keeps hanging is run row by row and its row
    quarantined like a row that crashes."""
    import subprocess
    import sys

    from helpers import REPO

    attempts = tmp_path / "attempts"
    result = subprocess.run(
        [sys.executable, "-c", WATCHDOG_SCRIPT, str(attempts)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 72, result.stdout[-2000:] + result.stderr[-3000:]
    assert "returned" not in result.stdout
    assert "ran past cluster.block_timeout_s=2 s" in result.stderr
    (counter,) = [p for p in attempts.iterdir() if p.name.startswith("block-")]
    assert counter.read_text() == "1"
