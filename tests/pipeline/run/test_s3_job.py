"""A job against a real S3 endpoint (tests/object_store.py) on the session's Ray, as a user with
`AWS_ENDPOINT_URL` set runs it: the input table and its clips in a bucket, the output in a
bucket. In-process and distributed planning; resume; changed-row redo; the report written to
the bucket and played in headless Chromium; preview, export, encode_refs and report on URIs;
the shards loaded by Hugging Face `datasets`; a driver killed mid-run and rerun; several
drivers started at once (one runs, the others are refused)."""

from __future__ import annotations

import json
import signal
import time
from collections import Counter

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from actors import schema as S
from actors.files import TEMP_PREFIX
from helpers import CHROMIUM, REPO, audio_check, run_module, start_driver
from pipeline.config import compose_typed
from pipeline.names import CONFIG_FILE, IDENTITY_FILE, LEASE_FILE, REPORT_FILE, SUMMARY_FILE, is_shard
from pipeline.output.layout import OutputLayout
from pipeline.run.steps import run

pytestmark = pytest.mark.slow

DEMO = REPO / "data" / "demo"
DEMO_IDS = pq.read_table(DEMO / "demo.parquet", columns=[S.ID]).column(S.ID).to_pylist()
PLANS = pytest.mark.parametrize(
    "plan",
    ["cluster.distributed_plan_rows=100000", "cluster.distributed_plan_rows=0"],
    ids=["in-process", "distributed"],
)


def output_rows(location: str) -> list[dict]:
    """Every row the output's files hold (no read-side deduplication)."""
    return OutputLayout(location).read(latest_only=False).to_pylist()


def assert_each_once_ok(rows: list[dict], ids) -> None:
    counts = Counter(r[S.ID] for r in rows)
    assert sorted(counts) == sorted(ids) and max(counts.values()) == 1
    assert all(r[S.STATUS] == S.STATUS_OK for r in rows), [(r[S.ID], r[S.ERROR]) for r in rows if r[S.ERROR]]


@pytest.fixture(scope="module")
def s3_input(s3_store) -> str:
    """The demo folder (table and clips, the table naming its clips relative to itself) in a
    bucket; the table's URI."""
    folder = f"{s3_store.bucket()}/in"
    s3_store.upload(DEMO / "demo.parquet", f"{folder}/demo.parquet")
    s3_store.upload(DEMO / "refs", f"{folder}/refs")
    return f"{folder}/demo.parquet"


def job_settings(small_settings, source: str, output: str, *more: str) -> list[str]:
    return [*small_settings, f"data.path={source}", f"output.dir={output}", "cluster.rows_per_block=6", *more]


@PLANS
def test_a_job_from_s3_to_s3_resumes_and_redoes_changed_rows(
    ray_cluster, s3_store, s3_input, small_settings, tmp_path, plan
):
    output = f"{s3_store.bucket()}/out"
    settings = job_settings(small_settings, s3_input, output, plan)
    first = run(compose_typed(settings))
    assert first.summary["run_rows"] == len(DEMO_IDS)
    assert_each_once_ok(output_rows(output), DEMO_IDS)
    keys = s3_store.keys(output)
    for name in (CONFIG_FILE, SUMMARY_FILE, REPORT_FILE, IDENTITY_FILE):
        assert name in keys, keys
    assert LEASE_FILE not in keys  # released at the end
    assert [k for k in keys if k.startswith("data/")] and all(
        is_shard(k.removeprefix("data/")) for k in keys if k.startswith("data/")
    )
    summary = json.loads(s3_store.get(f"{output}/{SUMMARY_FILE}"))
    assert summary["rows_ok"] == len(DEMO_IDS)

    # a rerun resumes: nothing to do
    again = run(compose_typed(settings))
    assert again.summary["run_rows"] == 0 and again.summary["rows_total"] == len(DEMO_IDS)

    # one text edited in the bucket's table: that row alone is redone
    table = pq.read_table(DEMO / "demo.parquet")
    texts = table.column(S.TEXT).to_pylist()
    texts[3] += " And one more sentence."
    edited = tmp_path / "demo.parquet"
    pq.write_table(table.set_column(table.schema.get_field_index(S.TEXT), S.TEXT, pa.array(texts)), edited)
    source = s3_input.replace("/demo.parquet", "/edited.parquet")
    s3_store.upload(edited, source)
    settings = job_settings(small_settings, source, output, plan, "output.on_change=redo")
    third = run(compose_typed(settings))
    assert third.summary["run_rows"] == 1
    rows = output_rows(output)
    assert_each_once_ok(rows, DEMO_IDS)
    by_id = {r[S.ID]: r for r in rows}
    assert by_id[DEMO_IDS[3]][S.TEXT] == texts[3] and by_id[DEMO_IDS[3]][S.RUN] == third.summary["run_id"]
    assert {r[S.RUN] for i, r in by_id.items() if i != DEMO_IDS[3]} == {first.summary["run_id"]}
    assert any(k.startswith("changed-ids-") for k in s3_store.keys(output))


@pytest.fixture(scope="module")
def s3_output(ray_cluster, s3_store, s3_input, small_settings) -> str:
    """One finished demo job's output in a bucket."""
    output = f"{s3_store.bucket()}/out"
    run(compose_typed(job_settings(small_settings, s3_input, output)))
    return output


@pytest.mark.skipif(not CHROMIUM.exists(), reason="headless Chromium not installed at /usr/bin/chromium")
def test_the_report_of_an_s3_output_plays_in_a_browser(s3_store, s3_output, tmp_path):
    def players(page) -> list[dict]:
        results, console = audio_check(page, tmp_path)
        assert console == []  # nothing logged: no error, no blocked request
        assert results and all(r.get("played") is True and r["duration"] > 0 for r in results), results
        return results

    written = tmp_path / "written" / REPORT_FILE  # as the run's end wrote it
    written.parent.mkdir()
    written.write_bytes(s3_store.get(f"{s3_output}/{REPORT_FILE}"))
    assert len(players(written)) >= 12  # the samples and the quality section's worst rows
    rewritten = run_module("pipeline.report", s3_output)  # the CLI on the URI rewrites it in place
    assert rewritten.returncode == 0, rewritten.stderr[-3000:]
    again = tmp_path / "again" / REPORT_FILE
    again.parent.mkdir()
    again.write_bytes(s3_store.get(f"{s3_output}/{REPORT_FILE}"))
    players(again)


def test_preview_export_and_the_hf_load_on_uris(s3_store, s3_input, s3_output, small_settings, tmp_path):
    datasets = pytest.importorskip("datasets")
    preview = run_module("pipeline.preview", *job_settings(small_settings, s3_input, s3_output))
    assert preview.returncode == 0, preview.stderr[-3000:]
    counts = json.loads(preview.stdout.strip().splitlines()[-1])
    assert (counts["rows_total"], counts["done"], counts["to_synthesize"]) == (len(DEMO_IDS), len(DEMO_IDS), 0)

    exported = run_module("pipeline.export", f"output.dir={s3_output}")
    assert exported.returncode == 0, exported.stderr[-3000:]
    files = s3_store.keys(f"{s3_output}/audio")
    assert "files.csv" in files and len([f for f in files if f.endswith(".flac")]) == len(DEMO_IDS)

    shards = s3_store.download(f"{s3_output}/data", tmp_path / "data")
    loaded = datasets.load_dataset("parquet", data_files=[str(p) for p in shards], split="train")
    assert isinstance(loaded.features[S.AUDIO], datasets.Audio)
    assert sorted(loaded[S.ID]) == sorted(DEMO_IDS)


def test_encode_refs_from_and_to_s3(s3_store, s3_input, small_settings):
    coded = s3_input.replace("/demo.parquet", "/coded.parquet")
    encoded = run_module("pipeline.encode_refs", coded, f"data.path={s3_input}", *small_settings)
    assert encoded.returncode == 0, encoded.stderr[-3000:]
    table = pq.read_table(coded)  # pyarrow finds the endpoint through AWS_ENDPOINT_URL, as chorus does
    source = pq.read_table(DEMO / "demo.parquet")
    paths, inline = source.column(S.REF_AUDIO_PATH).to_pylist(), source.column(S.REF_AUDIO).to_pylist()
    has_reference = [p is not None or a is not None for p, a in zip(paths, inline)]
    assert [c is not None for c in table.column(S.REF_CODES).to_pylist()] == has_reference and any(has_reference)


def test_a_driver_killed_mid_run_on_s3_is_taken_over(s3_store, s3_input, driver_env, small_settings):
    # the demo three times over (beside the clips its paths name), so that the kill lands mid-run
    ids = [f"{i}-copy{k}" for k in range(3) for i in DEMO_IDS]
    table = pq.read_table(DEMO / "demo.parquet")
    copies = [table.set_column(0, S.ID, pa.array(ids[k * len(DEMO_IDS) : (k + 1) * len(DEMO_IDS)])) for k in range(3)]
    source = s3_input.replace("/demo.parquet", "/big.parquet")
    pq.write_table(pa.concat_tables(copies), source)
    output = f"{s3_store.bucket()}/out"
    settings = job_settings(small_settings, source, output, "cluster.rows_per_block=3")
    driver = start_driver(settings, driver_env)
    layout = OutputLayout(output)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and len(layout.parts()) < 3:
        assert driver.poll() is None, driver.stdout.read()[-3000:]
        time.sleep(0.3)
    driver.send_signal(signal.SIGKILL)
    driver.wait()
    # a write task the dead driver started may still land its part (Ray stops the job's workers
    # a moment later): what it completed is what is there once the listing stops changing
    written, settle_by = layout.parts(), time.monotonic() + 30
    while time.monotonic() < settle_by:
        time.sleep(2.0)
        now = layout.parts()
        if now == written:
            break
        written = now
    assert 3 <= len(written) < 30, "the kill should land mid-run"
    finished = {}  # what the killed driver completed: every part it left is whole
    for part in written:
        for row in pq.read_table(part, filesystem=layout.fs).select([S.ID, S.RUN]).to_pylist():
            finished[row[S.ID]] = row[S.RUN]
    stale = json.loads(s3_store.get(f"{output}/{LEASE_FILE}"))
    assert stale["pid"] == driver.pid  # the dead driver's lease is still there ...
    rerun = run(compose_typed(settings))  # ... and the rerun takes it over (its pid is gone on this host)
    assert LEASE_FILE not in s3_store.keys(output)
    rows = output_rows(output)
    assert_each_once_ok(rows, ids)
    assert rerun.summary["run_rows"] == len(ids) - len(finished)  # no finished row redone
    by_id = {r[S.ID]: r for r in rows}
    assert all(by_id[i][S.RUN] == run_id for i, run_id in finished.items())
    assert not [k for k in s3_store.keys(f"{output}/data") if k.startswith(TEMP_PREFIX)]


def test_drivers_started_together_on_s3_one_runs(s3_store, s3_input, driver_env, small_settings):
    output = f"{s3_store.bucket()}/out"
    settings = job_settings(small_settings, s3_input, output)
    drivers = [start_driver(settings, driver_env) for _ in range(3)]
    logs = [d.communicate(timeout=600)[0] for d in drivers]
    codes = sorted(d.returncode for d in drivers)
    assert codes == [0, 2, 2], [log[-2000:] for log in logs]
    refused = [log for d, log in zip(drivers, logs) if d.returncode == 2]
    assert all("in use by another chorus driver" in log for log in refused)
    assert_each_once_ok(output_rows(output), DEMO_IDS)
