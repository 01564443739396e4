"""Output shards without Ray (pipeline/shards.py): block parts packed into shards, the live
files that hold each row once, and compaction killed at every step, then rerun."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from actors import schema as S
from helpers import REPO
from pipeline.location import is_local
from pipeline.names import CONFIG_FILE, IDENTITY_FILE, REJECTED_PART, REPORT_FILE, SUMMARY_FILE, is_shard, shard_name
from pipeline.output import hf_features, shards, supersede
from pipeline.output.layout import OutputLayout
from pipeline.output.listing import ABSORBED_KEY, purge_absorbed
from pipeline.output.parts import write_block
from pipeline.plan import rules as P
from pipeline.plan.decide import read_output_keys
from pipeline.plan.keys import FRAGMENT, KEY_SCHEMA, ROW

RUN = "20260101-000000-abcdef"
IDS = [f"spk{k % 3}/utt{k:03d}" for k in range(40)]


def ok(row_id: str, finished: float) -> dict:
    return {
        S.ID: row_id,
        S.STATUS: S.STATUS_OK,
        S.AUDIO: {S.AUDIO_BYTES: row_id.encode() * 50, S.AUDIO_PATH: None},
        S.SAMPLE_RATE: 44100,
        S.AUDIO_SECONDS: 0.5,
        S.N_FRAMES: 10,
        S.RUN: RUN,
        S.FINISHED_AT: finished,
        S.CONTENT_HASH: f"h-{row_id}",
        S.RETRYABLE: False,
    }


def resume_decisions(layout: OutputLayout) -> dict:
    """What a rerun's planning decides for IDS (their content unchanged) against `layout`."""
    n = len(IDS)
    keys = {name: pa.nulls(n, KEY_SCHEMA.field(name).type) for name in KEY_SCHEMA.names}
    keys[S.ID] = pa.array(IDS, pa.string())
    keys[S.CONTENT_HASH] = pa.array([f"h-{i}" for i in IDS], pa.string())
    keys[FRAGMENT] = pa.array([0] * n, pa.int32())
    keys[ROW] = pa.array(range(n), pa.int64())
    written = [P.output_side(read_output_keys(path, layout.fs)) for path in layout.live_files()]
    union = pa.concat_tables([P.input_side(pa.table(keys, schema=KEY_SCHEMA)), *written])
    decided = P.resolve_ids(union, ["in.parquet"], P.Retry())
    return dict(zip(decided.column(S.ID).to_pylist(), decided.column(P.DECISION).to_pylist()))


def job_output(tmp_path, block_rows: int = 4, location: str = "") -> OutputLayout:
    """An output as a run leaves it before compaction: 10 block parts and a rejected part."""
    layout = OutputLayout(location or str(tmp_path / "out"))
    layout.claim({"input": "x"}, overwrite=False, run_id=RUN)
    for start in range(0, len(IDS), block_rows):
        rows = [ok(i, 1000.0 + start + k) for k, i in enumerate(IDS[start : start + block_rows])]
        write_block(S.output_table(rows), layout.location, RUN)
    layout.write_part(S.output_table([S.error_row(None, "id is null", **{S.RUN: RUN})]), REJECTED_PART, owner=RUN)
    return layout


def rows_by_id(layout: OutputLayout) -> dict:
    rows = layout.read(latest_only=False).to_pylist()
    ids = [r[S.ID] for r in rows if r[S.ID] is not None]
    assert sorted(ids) == sorted(IDS), "every id exactly once in the live files"
    return {r[S.ID]: r for r in rows if r[S.ID] is not None}


def test_packer_caps_bytes_and_rows():
    packer = shards.Packer(shard_bytes=100, shard_rows=10)
    groups = [packer.add(f"p{k}", 40, 4) for k in range(5)]
    assert groups == [None, None, ["p0", "p1"], None, ["p2", "p3"]]  # 3 parts would be 120 bytes / 12 rows
    assert packer.take() == ["p4"]
    big = shards.Packer(shard_bytes=100, shard_rows=10)
    assert big.add("huge", 500, 3) == ["huge"]  # one part above the size is a shard of its own
    assert [big.add(f"q{k}", 1, 5) for k in range(3)] == [None, ["q0", "q1"], None]  # the row cap


def test_compaction_packs_parts_into_shards_each_row_once(tmp_path):
    layout = job_output(tmp_path)
    before = rows_by_id(layout)
    results = shards.compact_all(layout, "r-end", shard_bytes=1 << 30, shard_rows=12)
    assert [r["rows"] for r in results] == [12, 12, 12, 4]  # 4-row parts, at most 12 rows a shard
    names = sorted(p.rsplit("/", 1)[-1] for p in layout.live_files())
    assert names == sorted([r["shard"] for r in results] + [REJECTED_PART])
    assert [p.rsplit("/", 1)[-1] for p in layout.parts()] == [REJECTED_PART]  # the absorbed parts are gone
    after = rows_by_id(layout)
    assert after == before  # every column of every row copied as it was
    assert layout.read().num_rows == len(IDS) + 1  # the rejected row too
    for r in results:  # the shards carry the features and the parts they absorbed
        meta = pq.read_schema(f"{layout.data_dir}/{r['shard']}").metadata
        assert len(json.loads(meta[ABSORBED_KEY])) == r["parts"]
        features = json.loads(meta[hf_features.METADATA_KEY])["info"]["features"]
        assert features[S.AUDIO] == {"sampling_rate": 44100, "decode": True, "_type": "Audio"}
    assert shards.compact_all(layout, "r-again", 1 << 30, 12) == []  # nothing left to pack


def test_a_shard_the_size_cap_closes(tmp_path):
    layout = job_output(tmp_path)
    part_bytes = max(f.size for f in layout.data_files() if f.base_name != REJECTED_PART)
    results = shards.compact_all(layout, "r-end", shard_bytes=3 * part_bytes, shard_rows=10**6)
    assert all(r["parts"] <= 3 for r in results) and sum(r["rows"] for r in results) == len(IDS)
    assert len(results) >= 4
    rows_by_id(layout)


def test_superseded_copies_are_dropped_from_shards_keeping_their_footer(tmp_path):
    layout = job_output(tmp_path)
    shards.compact_all(layout, "r-end", 1 << 30, 100)
    redo = dict(ok(IDS[0], 5000.0), **{S.RUN: "20260102-000000-later0"})
    write_block(S.output_table([redo]), layout.location, redo[S.RUN])
    assert supersede.drop_in_process(layout) == 1
    [shard] = [p for p in layout.live_files() if "/shard-" in p]
    assert json.loads(pq.read_schema(shard).metadata[ABSORBED_KEY])  # still names its parts
    current = rows_by_id(layout)
    assert current[IDS[0]][S.RUN] == redo[S.RUN]


# ---- killed at every step, then rerun -------------------------------------------------------

_KILLED = textwrap.dedent(
    """
    import os, sys
    from pipeline.output import shards
    from pipeline.output.layout import OutputLayout
    target, seen = int(sys.argv[2]), [0]
    def hook(step):
        seen[0] += 1
        if seen[0] == target:
            os._exit(9)  # the process dies here: no cleanup, no finally
    shards.compact_all(OutputLayout(sys.argv[1]), "20260101-000000-killed", 1 << 30, 20, hook)
    """
)


def _steps(tmp_path, location: str = "") -> list[str]:
    """The steps of one compaction of the job output, in order (recorded on a copy)."""
    layout, steps = job_output(tmp_path / "dry", location=location), []
    for group in shards.pending_groups(layout, 1 << 30, 20):
        shards.compact(layout.location, group, "dry", hook=steps.append)
    return steps


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.slow)])
def store(request, tmp_path):
    """Where a test's output lives: a local folder, or a prefix in a bucket of the session's S3
    server (tests/object_store.py), where a shard is committed by its upload completing."""
    if request.param == "local":
        return lambda name: str(tmp_path / name / "out")
    bucket = request.getfixturevalue("s3_store").bucket()
    return lambda name: f"{bucket}/{name}/out"


def test_compaction_killed_at_any_step_loses_and_redoes_nothing(tmp_path, store):
    steps = _steps(tmp_path, store("dry"))  # two shards: row group, written, committed, 5 parts deleted; each
    # an object store has no "written" step: the upload completing is the commit
    shard_steps = ["row_group", "written", "committed"] if is_local(store("dry")) else ["row_group", "committed"]
    assert steps == 2 * (shard_steps + ["deleted"] * 5)
    # each step's first occurrence in each shard, and the very last one (steps count from 1)
    kills = [k for k in range(1, len(steps) + 1) if k == 1 or steps[k - 1] != steps[k - 2] or k == len(steps)]
    for k in kills:
        layout = job_output(tmp_path, location=store(f"kill{k}"))
        before = rows_by_id(layout)
        killed = subprocess.run(
            [sys.executable, "-c", _KILLED, layout.location, str(k)], cwd=REPO, capture_output=True, text=True
        )
        assert killed.returncode == 9, (steps[k - 1], killed.stderr[-2000:])
        assert rows_by_id(layout) == before, f"killed after step {k} ({steps[k - 1]})"
        # the rerun: the next driver's start cleans up, its resume redoes nothing, its end packs the rest
        rerun = OutputLayout(layout.location)
        rerun.claim({"input": "x"}, overwrite=False, run_id="20260101-000001-rerun0")
        assert set(resume_decisions(rerun).values()) == {P.DONE}
        shards.compact_all(rerun, "20260101-000001-rerun0", 1 << 30, 20)
        assert rows_by_id(rerun) == before
        names = [f.base_name for f in rerun.data_files()]
        assert [n for n in names if not is_shard(n)] == [REJECTED_PART], names  # no temp, no part left


def test_features_name_every_column_by_its_arrow_type():
    features = hf_features.features(S.OUTPUT_SCHEMA, 44100)
    assert list(features) == S.OUTPUT_SCHEMA.names
    assert features[S.ID] == {"dtype": "string", "_type": "Value"}
    assert features[S.N_FRAMES] == {"dtype": "int32", "_type": "Value"}
    assert features[S.RETRYABLE] == {"dtype": "bool", "_type": "Value"}
    assert features[S.CODES] == {
        "feature": {"feature": {"dtype": "int16", "_type": "Value"}, "_type": "List"},
        "_type": "List",
    }
    assert features[S.BATCH][S.BATCH_SLOTS] == {"dtype": "int32", "_type": "Value"}
    table = hf_features.with_features(S.output_table([S.error_row("a", "x")]))
    assert json.loads(table.schema.metadata[b"huggingface"])["info"]["features"][S.AUDIO]["sampling_rate"] == 44100


def test_a_shard_loads_in_hf_datasets(tmp_path):
    datasets = pytest.importorskip("datasets")
    layout = job_output(tmp_path)
    shards.compact_all(layout, "r-end", 1 << 30, 100)
    loaded = datasets.load_dataset("parquet", data_dir=layout.data_dir, split="train")
    assert isinstance(loaded.features[S.AUDIO], datasets.Audio)
    assert loaded.features[S.AUDIO].sampling_rate == 44100
    assert loaded.features[S.N_FRAMES] == datasets.Value("int32")
    assert sorted(i for i in loaded[S.ID] if i is not None) == sorted(IDS)
    raw = loaded.cast_column(S.AUDIO, datasets.Audio(decode=False))
    first = next(r for r in raw if r[S.ID] == IDS[0])
    assert first[S.AUDIO]["bytes"] == IDS[0].encode() * 50


class _Crash(Exception):
    pass


def _crash_at(step: str):
    def hook(name: str) -> None:
        if name == step:
            raise _Crash(name)

    return hook


def test_readers_skip_the_parts_a_committed_shard_absorbed(tmp_path):
    from helpers import export_in_process, export_settings
    from pipeline.export.job import export
    from pipeline.names import IDENTITY_FILE, SUMMARY_FILE
    from pipeline.report.page_data import read_run

    layout = job_output(tmp_path)
    group = shards.pending_groups(layout, 1 << 30, 20)[0]
    with pytest.raises(_Crash):
        shards.compact(layout.location, group, RUN, hook=_crash_at("committed"))
    assert len(layout.parts()) == 11  # every part still on disk, half of them absorbed
    assert len(layout.live_files()) == 1 + 5 + 1  # the shard, the 5 parts it did not absorb, the rejected part
    rows_by_id(layout)
    run = read_run(tmp_path / "out")
    assert run.n == len(IDS) + 1 and sorted(i for i in run.strings(S.ID) if i) == sorted(IDS)
    layout.write_text(IDENTITY_FILE, "{}")
    layout.write_text(SUMMARY_FILE, json.dumps({"rows_total": len(IDS) + 1}))  # as the run's end would
    exported = export(layout.location, export_settings(), export_in_process())
    assert exported.summary["rows"] == len(IDS) and exported.summary["removed"] == {}  # the rejected part: not read
    index = (tmp_path / "out" / "audio" / "files.csv").read_text().splitlines()
    assert len(index) == 1 + len(IDS)


def test_overwrite_deletes_shards_too(tmp_path):
    layout = job_output(tmp_path)
    shards.compact_all(layout, "r-end", 1 << 30, 20)
    layout.claim({"input": "y"}, overwrite=True)
    assert layout.live_files() == [] and list((tmp_path / "out" / "data").iterdir()) == []


def test_an_object_store_output_commits_by_upload_and_never_keeps_a_torn_shard(tmp_path, monkeypatch):
    # a filesystem that is not the local one takes the object-store path (no rename: an
    # object appears when its upload completes); here it is a real directory behind pyarrow's
    # SubTreeFileSystem, under a URI scheme of the test's own
    import pyarrow.fs as pafs

    from pipeline.output import layout as output_layout

    real = output_layout.open_location
    store = pafs.SubTreeFileSystem(str(tmp_path / "store"), pafs.LocalFileSystem())
    (tmp_path / "store").mkdir()

    def open_location(location: str):
        return (store, location.removeprefix("teststore://")) if location.startswith("teststore://") else real(location)

    monkeypatch.setattr(output_layout, "open_location", open_location)
    layout = job_output(tmp_path, location="teststore://bucket/out")
    assert not layout.local
    before = rows_by_id(layout)
    first = shards.pending_groups(layout, 1 << 30, 20)[0]
    with pytest.raises(_Crash):  # the writer fails mid-shard: the closed upload is taken back
        shards.compact(layout.location, first, RUN, hook=_crash_at("row_group"))
    assert not [f for f in layout.data_files() if is_shard(f.base_name)]
    assert rows_by_id(layout) == before
    torn = tmp_path / "store" / "bucket" / "out" / "data" / shard_name(["x"])
    torn.write_bytes(b"PAR1 an upload cut short")  # what a failing writer elsewhere may publish
    assert rows_by_id(layout) == before  # not a shard: no footer, so it absorbed nothing
    shards.compact_all(layout, "r-end", 1 << 30, 20)  # its start deletes the torn one
    assert not torn.exists() and rows_by_id(layout) == before
    assert sorted(f.base_name for f in layout.data_files() if not is_shard(f.base_name)) == [REJECTED_PART]


def test_a_shard_rewritten_but_not_yet_deleted_is_read_once(tmp_path):
    import shutil

    layout = job_output(tmp_path)
    shards.compact_all(layout, "r-end", 1 << 30, 100)
    [old] = [p for p in layout.live_files() if "/shard-" in p]
    shutil.copy(old, tmp_path / "old.parquet")
    keep = pa.array([r != IDS[0] for r in layout.read([S.ID], latest_only=False).column(S.ID).to_pylist()[:-1]])
    new = shards.rewrite(layout, old, keep, owner="compact")
    shutil.copy(tmp_path / "old.parquet", old)  # as if killed between the new shard's commit and the delete
    assert layout.live_files()[:1] == [new] and old not in layout.live_files()
    ids = layout.read([S.ID], latest_only=False).column(S.ID).to_pylist()
    assert sorted(i for i in ids if i) == sorted(IDS[1:])
    assert purge_absorbed(layout.footers, layout.data_dir) == 1 and not os.path.exists(old)


def test_overwrite_on_s3_deletes_only_chorus_objects(s3_store):
    """output.overwrite=true in a bucket: chorus's shards, parts, marker, config, summary and
    report go; a user's objects beside them, in the output and in its data/, stay."""
    location = f"{s3_store.bucket()}/out"
    layout = job_output(None, location=location)
    shards.compact_all(layout, "r-end", 1 << 30, 20)
    for name in (CONFIG_FILE, SUMMARY_FILE, REPORT_FILE):
        s3_store.put(f"{location}/{name}", b"chorus wrote this")
    foreign = ["notes.txt", "data/mine.parquet", "data/part-mine/x.bin", "listen/take1.flac"]
    for key in foreign:
        s3_store.put(f"{location}/{key}", b"the user's")
    assert [k for k in s3_store.keys(location) if is_shard(k.removeprefix("data/"))]
    layout.claim({"input": "y"}, overwrite=True)
    left = s3_store.keys(location)
    assert sorted(k for k in left if k != IDENTITY_FILE) == sorted(foreign), left
    assert json.loads(s3_store.get(f"{location}/{IDENTITY_FILE}")) == {"input": "y"}  # claimed anew
    assert all(s3_store.get(f"{location}/{key}") == b"the user's" for key in foreign)
