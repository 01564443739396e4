"""The pipeline end to end on the session's local Ray: the demo, determinism across actor
counts and block sizes, bad input, an actor killed mid-batch, a driver killed mid-run and
resumed, and `python -m pipeline` with no arguments on a fresh copy of the repository."""

from __future__ import annotations

import io
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import soundfile as sf

from actors import schema as S
from actors.files import TEMP_PREFIX
from pipeline.config import compose_typed
from pipeline.errors import OutputInUse, OutputMismatch
from pipeline.names import CONFIG_FILE, LEASE_FILE, SUMMARY_FILE
from pipeline.output.layout import OutputLayout
from pipeline.report.summary import summary_of
from pipeline.report.summary_figures import SUMMARY_COLUMNS
from pipeline.run.steps import run
from tests.helpers import DEMO_TABLE, REPO, assert_same_summary

pytestmark = pytest.mark.slow

DEMO_IDS = pq.read_table(DEMO_TABLE, columns=[S.ID]).column(S.ID).to_pylist()
DEMO_ROWS = len(DEMO_IDS)


def synthesize(settings: list[str], *overrides: str):
    return run(compose_typed([*settings, *overrides]))


def decode(row: dict) -> tuple[np.ndarray, int]:
    return sf.read(io.BytesIO(row[S.AUDIO][S.AUDIO_BYTES]), dtype="float32")


def assert_each_once(rows: list[dict], expected_ids) -> None:
    counts = Counter(r[S.ID] for r in rows)
    assert sorted(counts) == sorted(expected_ids)
    assert max(counts.values()) == 1, [i for i, n in counts.items() if n > 1]


def stopped_before_audio(row: dict) -> bool:
    """The random demo model may sample <|im_end|> first on every attempt: a rejected row."""
    return row[S.STATUS] == S.STATUS_REJECTED and row[S.QUALITY_FLAGS] == ["no_audio"]


@pytest.fixture(scope="module")
def demo_output(ray_cluster, tmp_path_factory, small_settings) -> Path:
    out = tmp_path_factory.mktemp("demo") / "out"
    synthesize(
        small_settings,
        f"output.dir={out}",
        "engine.stop_on_eos=true",
        "cluster.num_actors=2",
        "cluster.rows_per_block=6",
    )
    return out


def test_demo_end_to_end(demo_output, read_rows, small_settings):
    import torch

    from actors.codec import load_codec
    from actors.synth.demo_models import demo_assets

    torch.set_num_threads(1)  # beside Ray's workers on two cores, more threads only thrash

    rows = read_rows(demo_output)
    assert_each_once(rows, DEMO_IDS)
    ok = [r for r in rows if r[S.STATUS] == S.STATUS_OK]
    assert all(stopped_before_audio(r) for r in rows if r[S.STATUS] != S.STATUS_OK)
    assert len(ok) >= DEMO_ROWS - 3
    codec = load_codec(demo_assets()[1], dtype=compose_typed(small_settings).model.codec_dtype)  # the demo's
    decoded = [codec.decode_batch([np.asarray(r[S.CODES])])[0] for r in ok]  # each alone, as the actors decode
    for row, from_codes in zip(ok, decoded):
        wave, rate = decode(row)
        assert rate == row[S.SAMPLE_RATE] == 44100
        assert len(wave) / rate == pytest.approx(row[S.AUDIO_SECONDS])
        np.testing.assert_allclose(wave, np.clip(from_codes, -1, 1), atol=1e-4)
        assert row[S.STOP_REASON] in ("eos", "budget")
        assert row[S.PREFILL_MS] > 0 and row[S.RTF] > 0 and row[S.CODEC_MS] > 0
    assert len({r[S.ACTOR] for r in rows}) == 2  # repartitioning gave both actors work
    summary = json.loads((demo_output / SUMMARY_FILE).read_text())
    assert summary["rows_total"] == DEMO_ROWS and summary["rows_ok"] == len(ok)
    assert summary["audio_hours"] == pytest.approx(sum(r[S.AUDIO_SECONDS] for r in ok) / 3600)
    assert summary["rows_per_s"] > 0 and summary["frames_per_s"] > 0 and summary["rtf"] > 0
    assert len(summary["per_actor"]) == 2
    # the engines' figures, summed from the batches' shares of their actor's steps
    assert 0.0 < summary["slot_occupancy"] <= 1.0 and 0.0 < summary["engine_busy"] <= 1.0
    for actor in summary["per_actor"].values():
        assert 0.0 < actor["slot_occupancy"] <= 1.0 and 0.0 < actor["engine_busy"] <= 1.0
    batches = {r[S.BATCH][S.BATCH_ID]: r[S.BATCH] for r in rows}
    slot_rows = sum(b[S.BATCH_SLOT_ROWS] for b in batches.values())
    slot_steps = sum(b[S.BATCH_ENGINE_STEPS] * b[S.BATCH_SLOTS] for b in batches.values())
    assert summary["slot_occupancy"] == pytest.approx(slot_rows / slot_steps)
    assert "num_actors: 2" in (demo_output / CONFIG_FILE).read_text()


def test_same_seed_same_output_across_actors_and_block_sizes(demo_output, tmp_path, small_settings, read_rows):
    synthesize(
        small_settings,
        f"output.dir={tmp_path}/again",
        "engine.stop_on_eos=true",
        "cluster.num_actors=1",
        "cluster.rows_per_block=4",
    )
    assert_same_rows(read_rows(demo_output), read_rows(tmp_path / "again"))


def assert_same_rows(first_rows: list[dict], second_rows: list[dict]) -> None:
    """The same rows with the same codes and, bit for bit, the same audio (each row's clip is
    encoded and its codes decoded alone: engine.codec_batch_rows=1)."""
    first, second = {r[S.ID]: r for r in first_rows}, {r[S.ID]: r for r in second_rows}
    assert first.keys() == second.keys()
    for row_id, row in first.items():
        other = second[row_id]
        assert (row[S.STATUS], row[S.SEED], row[S.N_FRAMES]) == (other[S.STATUS], other[S.SEED], other[S.N_FRAMES])
        if row[S.STATUS] == S.STATUS_OK:
            assert row[S.CODES] == other[S.CODES], row_id
            np.testing.assert_array_equal(decode(row)[0], decode(other)[0], err_msg=row_id)


def test_bfloat16_same_output_across_actors_and_block_sizes(
    ray_cluster, demo_table, tmp_path, small_settings, read_rows
):
    """The same in bfloat16 whatever the CPU (auto picks float32 where it has no bf16 units):
    12 demo rows, with and without clips, as 2 actors x 6-row blocks and 1 actor x 4-row blocks.
    With 8-row codec batches a row's clip encoded beside others gave it other codes."""
    source = tmp_path / "in.parquet"
    pq.write_table(demo_table.slice(0, 12), source)
    bf16 = [
        f"data.path={source}",
        f"data.audio_root={DEMO_TABLE.parent}",
        "model.dtype=bfloat16",
        "model.codec_dtype=bfloat16",
    ]
    for actors, block in ((2, 6), (1, 4)):
        synthesize(
            small_settings,
            *bf16,
            f"output.dir={tmp_path}/a{actors}",
            f"cluster.num_actors={actors}",
            f"cluster.rows_per_block={block}",
        )
    assert_same_rows(read_rows(tmp_path / "a2"), read_rows(tmp_path / "a1"))


def test_rerun_resumes_instead_of_repeating(demo_output, small_settings, read_rows):
    before = read_rows(demo_output)
    report = synthesize(
        small_settings,
        f"output.dir={demo_output}",
        "engine.stop_on_eos=true",
        "cluster.num_actors=2",
        "cluster.rows_per_block=6",
    )
    assert report.summary["run_rows"] == 0 and report.summary["rows_total"] == DEMO_ROWS
    assert sorted(r[S.ID] for r in read_rows(demo_output)) == sorted(r[S.ID] for r in before)


PLANS = pytest.mark.parametrize(
    "plan",
    ["cluster.distributed_plan_rows=100000", "cluster.distributed_plan_rows=0"],
    ids=["in-process", "distributed"],
)


@PLANS
def test_bad_input_end_to_end(ray_cluster, bad_table, tmp_path, small_settings, read_rows, plan):
    synthesize(
        small_settings,
        plan,
        f"data.path={bad_table.path}",
        f"output.dir={tmp_path}/out",
        "engine.max_tokens=512",
        "cluster.rows_per_block=5",
    )
    rows = read_rows(tmp_path / "out")
    assert len(rows) == bad_table.table.num_rows  # every input row answered, duplicates included
    by_id = {}
    for row in rows:
        by_id.setdefault(row[S.ID], []).append(row)
    everything = {**bad_table.expect_error, **bad_table.rejected_by_driver, **bad_table.ref_id_conflicts}
    for row_id, fragment in everything.items():
        (row,) = by_id[row_id]
        assert row[S.STATUS] == S.STATUS_ERROR and fragment in row[S.ERROR], (row_id, row[S.ERROR])
    assert [r[S.STATUS] for r in by_id[bad_table.duplicate_id]] == [S.STATUS_ERROR] * 2
    for row_id in bad_table.expect_ok:
        (row,) = by_id[row_id]
        assert row[S.STATUS] == S.STATUS_OK, (row_id, row[S.ERROR])
        assert decode(row)[1] == 44100
    # summary.json: exact in-process, from per-file partials when distributed; the same figures
    summary = json.loads((tmp_path / "out" / SUMMARY_FILE).read_text())
    layout = OutputLayout(str(tmp_path / "out"))
    extra = dict(itertools.takewhile(lambda item: item[0] != "run_id", summary.items()))
    exact = summary_of(layout, summary["run_id"], summary["wall_s"], extra, distributed=False)
    if plan.endswith("=0"):
        assert_same_summary(exact, summary, layout.read(SUMMARY_COLUMNS), summary["run_id"])
    else:
        assert summary == exact


def test_actor_killed_mid_batch(ray_cluster, tmp_path, small_settings, read_rows):
    marker = tmp_path / "crashed"
    synthesize(
        small_settings,
        f"output.dir={tmp_path}/out",
        "cluster.rows_per_block=4",
        "engine.max_concurrent_blocks=2",
        # the third: an actor holds two blocks at once (engine.max_concurrent_blocks), so the
        # first is done, written by the first actor, before the third starts
        "cluster.crash_on_batch=3",
        f"cluster.crash_marker={marker}",
    )
    assert marker.exists()  # the actor did die on its third batch
    rows = read_rows(tmp_path / "out")
    assert_each_once(rows, DEMO_IDS)
    assert all(r[S.STATUS] == S.STATUS_OK for r in rows), [(r[S.ID], r[S.ERROR]) for r in rows if r[S.ERROR]]
    assert len({r[S.ACTOR] for r in rows}) >= 2  # a restarted actor (a new process) finished the job
    # the driver counted it: the restarted actor told it, and so did the block it ran again
    infrastructure = json.loads((tmp_path / "out" / SUMMARY_FILE).read_text())["infrastructure"]
    assert infrastructure["actors_restarted"] == 1 and infrastructure["blocks_retried"] >= 1, infrastructure


def test_the_stream_in_several_datasets_writes_every_row_once(
    ray_cluster, demo_table, tmp_path, small_settings, read_rows
):
    """cluster.blocks_per_dataset=1: each of the input's three row groups (one read chunk each)
    streams as a dataset of its own, with actors of its own, one after another."""
    source = tmp_path / "groups.parquet"
    pq.write_table(demo_table, source, row_group_size=10)
    summary = synthesize(
        small_settings,
        f"data.path={source}",
        f"data.audio_root={DEMO_TABLE.parent}",
        f"output.dir={tmp_path}/out",
        "cluster.rows_per_block=4",
        "cluster.blocks_per_dataset=1",
    )
    rows = read_rows(tmp_path / "out")
    assert_each_once(rows, DEMO_IDS)
    assert {r[S.STATUS] for r in rows} == {S.STATUS_OK}
    assert len({r[S.ACTOR] for r in rows}) == 3, summary  # three datasets, three actors (one each)


def test_driver_killed_then_resumed(ray_cluster, driver_env, demo_table, tmp_path, small_settings, read_rows):
    # a larger input so that the kill lands mid-run: the demo three times over
    ids = [f"{i}-copy{k}" for k in range(3) for i in DEMO_IDS]
    copies = [demo_table.set_column(0, S.ID, pa.array(ids[k * DEMO_ROWS : (k + 1) * DEMO_ROWS])) for k in range(3)]
    source = tmp_path / "big.parquet"
    pq.write_table(pa.concat_tables(copies), source)
    out = tmp_path / "out"
    args = [
        *small_settings,
        f"data.path={source}",
        f"data.audio_root={DEMO_TABLE.parent}",  # the clips stay in the demo's folder
        f"output.dir={out}",
        "cluster.rows_per_block=3",
    ]
    driver = subprocess.Popen(
        [sys.executable, "-m", "pipeline", *args],
        cwd=REPO,
        env=driver_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    layout = OutputLayout(str(out))
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and len(layout.parts() if (out / "data").exists() else []) < 3:
        assert driver.poll() is None, driver.stdout.read().decode()[-3000:]
        time.sleep(0.2)
    driver.send_signal(signal.SIGKILL)
    driver.wait()
    written = layout.parts()
    assert 3 <= len(written) < 30, "the kill should land mid-run"
    for part in written:  # whatever the kill left under a data name is complete
        pq.read_table(part)
    stale = json.loads((out / LEASE_FILE).read_text())
    assert stale["pid"] == driver.pid  # the dead driver's lease is still there ...
    synthesize(args)  # ... and the rerun takes it over (its pid is gone on this host)
    assert not (out / LEASE_FILE).exists()
    rows = read_rows(out)
    assert_each_once(rows, ids)
    assert all(r[S.STATUS] == S.STATUS_OK for r in rows)
    assert not [n for n in os.listdir(out / "data") if n.startswith(TEMP_PREFIX)]


def test_two_drivers_on_one_output(ray_cluster, driver_env, tmp_path, small_settings, read_rows):
    """Finding 5: two drivers on one output directory duplicated rows and both exited 0. Now
    the second refuses while the first holds the lease; the first completes alone."""
    out = tmp_path / "out"
    args = [*small_settings, f"output.dir={out}", "cluster.rows_per_block=3"]
    first = subprocess.Popen(
        [sys.executable, "-m", "pipeline", *args],
        cwd=REPO,
        env=driver_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 120
    while not (out / LEASE_FILE).exists():
        assert first.poll() is None and time.monotonic() < deadline, first.stdout.read().decode()[-3000:]
        time.sleep(0.1)
    with pytest.raises(OutputInUse, match="in use by another chorus driver"):
        synthesize(args)
    second = subprocess.run(
        [sys.executable, "-m", "pipeline", *args], cwd=REPO, env=driver_env, capture_output=True, text=True
    )
    assert second.returncode == 2 and "in use by another chorus driver" in second.stderr + second.stdout
    log = first.communicate(timeout=300)[0].decode()
    assert first.returncode == 0, log[-3000:]
    rows = read_rows(out)
    assert_each_once(rows, DEMO_IDS)
    assert all(r[S.STATUS] == S.STATUS_OK for r in rows)
    assert not (out / LEASE_FILE).exists()


@PLANS
def test_rerun_redoes_changed_rows_and_transient_errors(
    ray_cluster, demo_table, tmp_path, small_settings, caplog, plan
):
    """Findings 3 and 4: a rerun with edited text said "0 to synthesize" and kept the old
    audio, and a reference that was missing stayed an error row forever. Now both are redone
    (and the log says so), the rest is kept, and each id is on disk once."""
    ids = DEMO_IDS[:4]
    table = demo_table.slice(0, 4).select([S.ID, S.TEXT, S.SEED])
    table = table.append_column(S.REF_AUDIO_PATH, pa.array([None, None, "late.flac", None], pa.string()))
    source = tmp_path / "in.parquet"
    pq.write_table(table, source)
    args = [*small_settings, f"data.path={source}", f"output.dir={tmp_path}/out", "cluster.rows_per_block=2", plan]
    first = synthesize(args)
    rows = {r[S.ID]: r for r in OutputLayout(str(tmp_path / "out")).read(latest_only=False).to_pylist()}
    assert rows[ids[2]][S.STATUS] == S.STATUS_ERROR and "not found" in rows[ids[2]][S.ERROR]
    assert rows[ids[2]][S.RETRYABLE] is True
    shutil.copy(REPO / "data" / "demo" / "refs" / "ada.flac", tmp_path / "late.flac")  # the clip arrives
    texts = table.column(S.TEXT).to_pylist()
    texts[1] = texts[1] + " And one more sentence."
    pq.write_table(table.set_column(1, S.TEXT, pa.array(texts, pa.string())), source)
    with caplog.at_level("INFO", logger="chorus"):
        second = synthesize(args)
    # the clip's path was stamped "missing" in the row's hash, so its arrival is a change too
    assert (
        f"2 rows changed since they were written (text, reference, settings or model) and are redone: {ids[1]!r}, {ids[2]!r}"
        in caplog.text
    )
    (listed,) = (tmp_path / "out").glob("changed-ids-*.txt")  # the full list, under the output
    assert sorted(listed.read_text().split()) == [ids[1], ids[2]]
    rows = OutputLayout(str(tmp_path / "out")).read(latest_only=False).to_pylist()
    assert_each_once(rows, ids)
    by_id = {r[S.ID]: r for r in rows}
    assert all(r[S.STATUS] == S.STATUS_OK for r in rows)
    assert by_id[ids[1]][S.TEXT] == texts[1]
    redone = {i for i, r in by_id.items() if r[S.RUN] == second.summary["run_id"]}
    assert redone == {ids[1], ids[2]}
    assert {by_id[i][S.RUN] for i in (ids[0], ids[3])} == {first.summary["run_id"]}
    # with output.on_change=refuse an edit stops the run before any work
    texts[0] = "Something else entirely."
    pq.write_table(table.set_column(1, S.TEXT, pa.array(texts, pa.string())), source)
    with pytest.raises(OutputMismatch, match=rf"1 rows changed since they were written \('{ids[0]}'\)"):
        synthesize(args, "output.on_change=refuse")


def test_a_row_that_kills_its_actor_is_quarantined(ray_cluster, demo_table, tmp_path, small_settings, read_rows):
    """Finding 8: a row that crashes its actor (segfault, OOM) was retried forever (Ray Data
    restarts actors and retries tasks without limit). Now its block is retried
    crash_quarantine_after times, then row by row; the row that kills the actor alone ends as
    an error row and the others complete."""
    ids = DEMO_IDS[:6]
    source = tmp_path / "in.parquet"
    pq.write_table(demo_table.slice(0, 6).select([S.ID, S.TEXT, S.SEED]), source)
    poison = ids[4]
    synthesize(
        small_settings,
        f"data.path={source}",
        f"output.dir={tmp_path}/out",
        "cluster.rows_per_block=3",
        "engine.max_concurrent_blocks=2",
        f"cluster.crash_on_id={poison}",
        "cluster.crash_quarantine_after=2",
        "cluster.max_task_retries=3",
    )
    rows = read_rows(tmp_path / "out")
    assert_each_once(rows, ids)
    by_id = {r[S.ID]: r for r in rows}
    assert by_id[poison][S.STATUS] == S.STATUS_ERROR and "quarantined" in by_id[poison][S.ERROR]
    assert (
        "killed its actor (the process exited: a crash or out of memory) 2 times, then the row did so alone"
        in (by_id[poison][S.ERROR])
    )
    assert by_id[poison][S.RETRYABLE] is False  # a rerun does not kill actors with it again
    assert all(by_id[i][S.STATUS] == S.STATUS_OK for i in ids if i != poison)
    # 2 deaths of the block, 1 of the row alone (the "quarantined" message above counts them).
    # Both blocks are in one actor at once (engine.max_concurrent_blocks=2), so the innocent
    # block dies with the poisoned one and runs row by row too; the poisoned block's row-by-row
    # run holds the actor alone, so only the poisoned row is blamed (one restarted actor may
    # then write every row: no assertion on how many actors wrote)
    assert not (tmp_path / "out" / "_attempts").exists() or not any((tmp_path / "out" / "_attempts").iterdir())


def test_dictionary_encoded_columns_through_the_pipeline(ray_cluster, demo_table, tmp_path, small_settings, read_rows):
    """Finding 7, end to end: a table whose string columns are dictionary-encoded (what many
    Parquet writers produce) goes through Ray's read, the actors and the writer like any other."""
    ids = DEMO_IDS[:4]
    plain = demo_table.slice(0, 4).select([S.ID, S.TEXT, S.SEED])
    encoded = pa.table(
        {
            S.ID: plain.column(S.ID).combine_chunks().dictionary_encode(),
            S.TEXT: plain.column(S.TEXT).combine_chunks().dictionary_encode(),
            S.SEED: plain.column(S.SEED),
            "speaker": pa.array(["ada", "ada", "bo", "ada"]).dictionary_encode(),
        }
    )
    source = tmp_path / "dictionary.parquet"
    pq.write_table(encoded, source)
    assert pa.types.is_dictionary(pq.read_table(source).schema.field(S.TEXT).type)  # still encoded on disk
    synthesize(small_settings, f"data.path={source}", f"output.dir={tmp_path}/out")
    rows = read_rows(tmp_path / "out")
    assert_each_once(rows, ids)
    assert all(r[S.STATUS] == S.STATUS_OK or stopped_before_audio(r) for r in rows), [r[S.ERROR] for r in rows]
    assert {r[S.ID]: r[S.TEXT] for r in rows} == dict(zip(ids, plain.column(S.TEXT).to_pylist()))


def test_no_arguments_runs_the_demo(driver_env, tmp_path):
    clone = tmp_path / "clone"
    for part in ("pipeline", "actors", "conf", "data"):
        shutil.copytree(REPO / part, clone / part, ignore=shutil.ignore_patterns("__pycache__"))
    env = dict(driver_env, CHORUS_CACHE=str(tmp_path / "cache"))  # a fresh machine: no demo built yet
    env.pop("PYTHONPATH")
    result = subprocess.run(
        [sys.executable, "-m", "pipeline"], cwd=clone, env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    # the default output: outputs/<input name>-<hash of where the input is>
    (out,) = [p for p in (clone / "outputs").iterdir() if p.name.startswith("demo-")]
    assert f"output written to {out}" in result.stdout
    assert len(OutputLayout(str(out)).read([S.ID]).column(S.ID)) == DEMO_ROWS
    assert (tmp_path / "cache").is_dir()
