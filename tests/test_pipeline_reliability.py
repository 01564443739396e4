"""Reliability of the driver without Ray (issue 14): the output directory's lease, overwrite
that deletes only chorus's files, temp files that belong to their writer, and a read path
and end-of-run compaction that leave each id once on disk."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from actors import schema as S
from actors.files import TEMP_PREFIX
from pipeline.config import compose
from pipeline.errors import OutputInUse, OutputMismatch
from pipeline.names import IDENTITY_FILE, LEASE_FILE, REJECTED_PART
from pipeline.output.layout import OutputLayout
from pipeline.output.lease import Lease
from pipeline.output.parts import write_block
from pipeline.run.sequence import run
from tests.helpers import decide_rows

PINNED_HASH = "a1f9b881d0134741b62ab6f37f6b236c"  # inputs.scan_rows of commit 87c655c, for the row below


def row(row_id: str, run_id: str, status: str = S.STATUS_OK, finished: float = 1.0) -> dict:
    return {S.ID: row_id, S.STATUS: status, S.RUN: run_id, S.FINISHED_AT: finished}


# ---- finding 5: one driver per output directory ----------------------------------------
def test_a_second_driver_is_refused_while_the_first_holds_the_lease(tmp_path):
    layout = OutputLayout(str(tmp_path / "out"))
    first = Lease(layout, "run-a", heartbeat_s=0.2, stale_s=30)
    first.acquire()
    try:
        held = json.loads((tmp_path / "out" / LEASE_FILE).read_text())
        assert held["pid"] == os.getpid() and held["host"] == socket.gethostname() and held["run"] == "run-a"
        assert held["owner"]
        time.sleep(0.6)
        assert json.loads((tmp_path / "out" / LEASE_FILE).read_text())["heartbeat"] > held["heartbeat"]
        with pytest.raises(OutputInUse, match=rf"in use by another chorus driver .*pid {os.getpid()}"):
            Lease(layout, "run-b").acquire()
        # the whole driver refuses before touching anything
        with pytest.raises(OutputInUse):
            run(compose([f"output.dir={tmp_path}/out"]))
    finally:
        first.release()
    assert not (tmp_path / "out" / LEASE_FILE).exists()
    second = Lease(layout, "run-b")
    second.acquire()  # free again
    second.release()


def test_a_lease_heartbeat_caught_mid_rename_is_not_a_foreign_file(tmp_path):
    # the first driver's heartbeat writes `.tmp-<pid>-<hex>-_chorus.lock` then renames it; a
    # second driver listing the directory in between must still say "in use", not "not ours"
    layout = OutputLayout(str(tmp_path / "out"))
    os.makedirs(layout.base)
    (tmp_path / "out" / LEASE_FILE).write_text("{}")
    (tmp_path / "out" / f"{TEMP_PREFIX}123-abcd1234-{LEASE_FILE}").write_text("{}")
    assert layout.foreign_entries() == []
    (tmp_path / "out" / f"{TEMP_PREFIX}123-abcd1234-notes.txt").write_text("x")
    (tmp_path / "out" / "thesis.txt").write_text("x")
    assert layout.foreign_entries() == [f"{TEMP_PREFIX}123-abcd1234-notes.txt", "thesis.txt"]
    with pytest.raises(OutputMismatch, match="thesis.txt"):
        layout.check_ours()


def test_a_dead_drivers_lease_is_taken_over(tmp_path):
    layout = OutputLayout(str(tmp_path / "out"))
    # a driver on this host that died without releasing: its pid no longer exists
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    os.makedirs(layout.base)
    record = {"owner": "x", "host": socket.gethostname(), "pid": child.pid, "run": "dead", "heartbeat": time.time()}
    (tmp_path / "out" / LEASE_FILE).write_text(json.dumps(record))
    lease = Lease(layout, "alive")
    lease.acquire()
    assert lease.took_over["run"] == "dead"
    lease.release()
    # another host's driver that stopped its heartbeat
    record = {"owner": "x", "host": "elsewhere", "pid": 1, "run": "silent", "heartbeat": time.time() - 120}
    (tmp_path / "out" / LEASE_FILE).write_text(json.dumps(record))
    lease = Lease(layout, "alive-2", stale_s=60)
    lease.acquire()
    assert lease.took_over["run"] == "silent"
    # ... and the driver whose lease was taken notices at its next heartbeat
    usurped = Lease(layout, "usurped", heartbeat_s=0.1)
    usurped._start_heartbeat()
    time.sleep(0.5)
    assert usurped.lost and "alive-2" in usurped.lost
    lease.release()
    # a live lease from another host is not taken
    record["heartbeat"] = time.time()
    (tmp_path / "out" / LEASE_FILE).write_text(json.dumps(record))
    with pytest.raises(OutputInUse, match="host elsewhere"):
        Lease(layout, "alive-3").acquire()


_RACER = """
import sys, time
from pipeline.output.lease import Lease
from pipeline.errors import OutputInUse
from pipeline.output.layout import OutputLayout
start, out, run = float(sys.argv[1]), sys.argv[2], sys.argv[3]
lease = Lease(OutputLayout(out), run, heartbeat_s=0.05)
time.sleep(max(0.0, start - time.time()))
try:
    lease.acquire()
except OutputInUse:
    print("refused", flush=True)
    sys.exit(0)
print("holds", flush=True)
time.sleep(1.0)  # hold it while the others try
print("lost" if lease.lost else "kept", flush=True)
lease.release()
"""


def test_drivers_racing_for_a_dead_drivers_lease_take_it_once(tmp_path):
    # several drivers find the same dead driver's lease at the same moment: exactly one takes
    # it over and keeps it; the others refuse (before the lock, a slow taker could rename a
    # fresh taker's lease away and both ran)
    layout = OutputLayout(str(tmp_path / "out"))
    os.makedirs(layout.base)
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    for round_ in range(3):
        record = {"owner": "x", "host": socket.gethostname(), "pid": child.pid, "run": "dead", "heartbeat": time.time()}
        (tmp_path / "out" / LEASE_FILE).write_text(json.dumps(record))
        start = time.time() + 2.0  # every racer imported and waiting by then
        racers = [
            subprocess.Popen(
                [sys.executable, "-c", _RACER, str(start), layout.location, f"racer-{round_}-{i}"],
                stdout=subprocess.PIPE,
                text=True,
            )
            for i in range(4)
        ]
        outcomes = sorted(" ".join(r.communicate(timeout=60)[0].split()) for r in racers)
        assert outcomes == ["holds kept", "refused", "refused", "refused"], outcomes
        assert not (tmp_path / "out" / LEASE_FILE).exists()  # released by the one that held it


def test_a_lease_released_while_another_driver_waits_on_its_file_is_not_shared(tmp_path):
    # the holder unlinks the lock file on release: a driver that opened the old file must not
    # lock that orphan while a third locks the new file at the path
    layout = OutputLayout(str(tmp_path / "out"))
    first = Lease(layout, "first", heartbeat_s=30)
    first.acquire()
    stale_fd = os.open(first.path, os.O_RDWR)  # a second driver that opened the file in time
    first.release()
    third = Lease(layout, "third", heartbeat_s=30)
    third.acquire()
    try:
        import fcntl

        fcntl.flock(stale_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # the orphan locks (nobody holds it) ...
        assert os.fstat(stale_fd).st_ino != os.stat(first.path).st_ino  # ... but it is not the lease
        with pytest.raises(OutputInUse, match="run third"):
            Lease(layout, "second").acquire()
    finally:
        os.close(stale_fd)
        third.release()


def test_temp_files_belong_to_their_writer(tmp_path):
    layout = OutputLayout(str(tmp_path / "out"))
    layout.ensure()
    mine = tmp_path / "out" / "data" / f"{TEMP_PREFIX}run-a-123-abcd-part-x.parquet"
    theirs = tmp_path / "out" / "data" / f"{TEMP_PREFIX}run-b-456-abcd-part-y.parquet"
    mine.write_bytes(b"PAR1")
    theirs.write_bytes(b"PAR1")
    assert layout.clean_temp(keep_run="run-a") == 1
    assert mine.exists() and not theirs.exists()


def test_rows_redone_by_a_later_run_are_on_disk_once(tmp_path):
    layout = OutputLayout(str(tmp_path / "out"))
    layout.ensure()
    write_block(S.output_table([row("a", "r1"), row("b", "r1", S.STATUS_ERROR)]), layout.location, "r1")
    write_block(S.output_table([row("b", "r2"), row("c", "r2")]), layout.location, "r2")
    write_block(S.output_table([row("d", "r1"), row("dup", "r1")]), layout.location, "r1")
    raw = layout.read(latest_only=False).column(S.ID).to_pylist()
    assert sorted(raw) == ["a", "b", "b", "c", "d", "dup"]
    latest = {r[S.ID]: r for r in layout.read().to_pylist()}
    assert sorted(latest) == ["a", "b", "c", "d", "dup"] and latest["b"][S.RUN] == "r2"
    # "dup" is refused by the driver now: its old row goes too
    import pyarrow as pa

    from pipeline.output.supersede import drop_in_process

    assert drop_in_process(layout, pa.array(["dup"])) == 2
    rows = layout.read(latest_only=False).to_pylist()
    assert sorted((r[S.ID], r[S.RUN]) for r in rows) == [("a", "r1"), ("b", "r2"), ("c", "r2"), ("d", "r1")]
    for part in layout.parts():
        pq.read_table(part)  # every rewritten part is whole


# ---- finding 6: overwrite deletes only chorus's files -----------------------------------
def test_overwrite_never_deletes_what_chorus_did_not_write(tmp_path):
    thesis = tmp_path / "mine" / "data" / "chapters" / "thesis.txt"
    thesis.parent.mkdir(parents=True)
    thesis.write_text("years of work")
    for overwrite in ("false", "true"):
        with pytest.raises(OutputMismatch, match="not a chorus output"):
            run(compose([f"output.dir={tmp_path}/mine", f"output.overwrite={overwrite}"]))
    assert thesis.read_text() == "years of work"
    assert sorted(os.listdir(tmp_path / "mine")) == ["data"]  # no lease, no marker left behind

    layout = OutputLayout(str(tmp_path / "ours"))
    layout.claim({"input": "a"}, overwrite=False)
    write_block(S.output_table([row("a", "r1")]), layout.location)
    notes = tmp_path / "ours" / "data" / "notes.txt"
    notes.write_text("a user's file beside chorus's")
    layout.claim({"input": "b"}, overwrite=True)
    assert layout.parts() == [] and notes.read_text() == "a user's file beside chorus's"
    assert json.loads(layout.read_text(IDENTITY_FILE)) == {"input": "b"}


# ---- findings 3 and 4: honest resume ------------------------------------------------------
def hashes(path, settings: str) -> dict:
    decided = decide_rows(path, settings=settings)
    return dict(zip(decided.column(S.ID).to_pylist(), decided.column(S.CONTENT_HASH).to_pylist()))


def test_row_hashes_keep_their_values(tmp_path):
    # outputs written before planning moved to Ray Data resume: a row's hash is the digest it
    # always was (this value was computed by the driver-side scan of the starting commit)
    pq.write_table(pa.table({"id": ["a"], "text": ["hello"], "speaker": ["ada"]}), tmp_path / "in.parquet")
    assert hashes(tmp_path / "in.parquet", "settings-1") == {"a": PINNED_HASH}


def test_row_hashes_follow_text_reference_and_settings(tmp_path):
    clip = tmp_path / "clip.flac"
    clip.write_bytes(b"one clip")
    table = pa.table(
        {
            "id": ["a", "b", "c"],
            "text": ["first", "second", "third"],
            "ref_audio_path": [None, "clip.flac", None],
            "ref_audio": [None, None, b"bytes"],
        }
    )
    path = tmp_path / "in.parquet"
    pq.write_table(table, path)
    before = hashes(path, "settings-1")
    assert len(set(before.values())) == 3
    pq.write_table(table.set_column(1, "text", pa.array(["first", "second", "third, edited"])), path)
    clip.write_bytes(b"another clip, longer")  # same name, other content
    after = hashes(path, "settings-1")
    assert after["a"] == before["a"] and after["b"] != before["b"] and after["c"] != before["c"]
    other_settings = hashes(path, "settings-2")
    assert not set(other_settings.values()) & set(after.values())


@pytest.mark.parametrize(
    "override",
    [
        "sampling.temperature=0.5",
        "sampling.seed=3",
        "engine.max_frames=100",
        "engine.stop_on_eos=false",
        "data.max_text_chars=100",
        "data.allow_special_tokens=true",
        "long_form.segment_bytes=120",
        "long_form.max_turns=2",
        "long_form.history_fraction=0.25",
        "model.dtype=bfloat16",
        "model.codec_dtype=bfloat16",
        "output.keep_codes=false",
    ],
)
def test_every_setting_the_audio_depends_on_changes_the_row_hashes(override):
    # a rerun with any of these changed must redo its rows (their audio would differ)
    from pipeline.config import to_plain
    from pipeline.plan.identity import settings_digest

    base = settings_digest(to_plain(compose([])), "fingerprint")
    assert settings_digest(to_plain(compose([override])), "fingerprint") != base
    # ... and settings that leave a row's audio as it is do not
    for same in ("engine.max_rows=4", "cluster.num_actors=3", "engine.codec_batch_rows=2", "output.progress_bar=off"):
        assert settings_digest(to_plain(compose([same])), "fingerprint") == base, same


def test_model_fingerprint_sees_new_weights_under_the_same_name(tmp_path, monkeypatch):
    from pipeline.plan.identity import FILE_HASH_CACHE, model_fingerprint

    monkeypatch.setenv("CHORUS_CACHE", str(tmp_path / "cache"))
    cache_file = tmp_path / "cache" / FILE_HASH_CACHE
    ckpt = tmp_path / "my-model"
    ckpt.mkdir()
    (ckpt / "config.json").write_text('{"dim": 8}')
    weights = bytearray(os.urandom(3 << 20))
    (ckpt / "model.pth").write_bytes(bytes(weights))
    model = {"checkpoint": str(ckpt), "codec": None}
    first = model_fingerprint(model)
    assert model_fingerprint(model) == first
    seen = {first}
    # fine-tuned: same size, other numbers -- near the start, in the middle, at the end
    for at in (10, len(weights) // 2 + 12345, len(weights) - 1):
        weights[at] ^= 0xFF
        (ckpt / "model.pth").write_bytes(bytes(weights))
        os.utime(ckpt / "model.pth", ns=(at, at))  # its own modification time: not a cached hash
        now = model_fingerprint(model)
        assert now not in seen, at
        seen.add(now)
    # the hashes are cached by path, size and modification time: a second look reads the
    # cache, not the file (a doctored entry shows through)
    cached = json.loads(cache_file.read_text())
    assert len(cached) == 2 + 3  # config.json + the first weights, then each edit's weights
    assert model_fingerprint(model) == now
    (latest,) = [key for key in cached if "model.pth" in key and key.endswith(f"|{len(weights) - 1}")]
    cache_file.write_text(json.dumps({**cached, latest: "doctored"}))
    assert model_fingerprint(model) != now
    assert model_fingerprint({"checkpoint": None, "codec": None}) == model_fingerprint(
        {"checkpoint": None, "codec": None}
    )


@pytest.mark.parametrize("distributed", [False, True], ids=["in-process", "distributed"])
def test_resume_redoes_changed_rows_and_transient_errors(tmp_path, distributed, request):
    import pyarrow.fs as pafs

    from pipeline.plan.counts import count_decisions, refuse_changed
    from pipeline.plan.decide import decide, output_key_files
    from pipeline.plan.inputs import scan_input
    from pipeline.plan.keys import RowHasher
    from pipeline.plan.rules import Retry

    if distributed:
        request.getfixturevalue("ray_cluster")
    ids = ["same", "edited", "io-error", "bad-text", "pre-hash", "new"]
    pq.write_table(pa.table({"id": ids, "text": [f"text of {i}" for i in ids]}), tmp_path / "in.parquet")
    now = hashes(tmp_path / "in.parquet", "settings")
    layout = OutputLayout(str(tmp_path / "out"))
    layout.ensure()
    older = [  # copies an earlier run wrote, superseded by the newer ones below
        {S.ID: "same", S.STATUS: S.STATUS_ERROR, S.RETRYABLE: True, S.CONTENT_HASH: now["same"], S.RUN: "r0"},
        {S.ID: "edited", S.STATUS: S.STATUS_OK, S.CONTENT_HASH: now["edited"], S.RUN: "r0"},
    ]
    newer = [
        {S.ID: "same", S.STATUS: S.STATUS_OK, S.CONTENT_HASH: now["same"], S.RUN: "r1"},
        {S.ID: "edited", S.STATUS: S.STATUS_OK, S.CONTENT_HASH: "old", S.RUN: "r1"},
        {S.ID: "io-error", S.STATUS: S.STATUS_ERROR, S.RETRYABLE: True, S.CONTENT_HASH: now["io-error"], S.RUN: "r1"},
        {S.ID: "bad-text", S.STATUS: S.STATUS_ERROR, S.RETRYABLE: False, S.CONTENT_HASH: now["bad-text"], S.RUN: "r1"},
        {S.ID: "pre-hash", S.STATUS: S.STATUS_OK, S.RUN: "r1"},  # written before content hashes existed
    ]
    layout.write_part(S.output_table(older), "part-older.parquet")
    layout.write_part(S.output_table(newer), "part-newer.parquet")

    def verdicts(**kwargs):
        decided = decide_rows(tmp_path / "in.parquet", distributed=distributed, output=layout.location, **kwargs)
        return dict(zip(decided.column(S.ID).to_pylist(), decided.column("_decision").to_pylist()))

    assert verdicts() == {
        "same": "done",
        "bad-text": "done",
        "pre-hash": "done",
        "edited": "changed",
        "io-error": "retry",
        "new": "new",
    }
    assert verdicts(retry_errors=True)["bad-text"] == "retry"
    scan = scan_input(str(tmp_path / "in.parquet"), {})
    decided = decide(
        scan,
        RowHasher("settings", None, scan.root),
        output_key_files(layout.live_files()),
        pafs.LocalFileSystem(),
        Retry(),
        distributed,
    )
    summary = count_decisions(decided, scan.total_rows, {"min_frames": 8, "max_frames": 1024, "frames_per_char": None})
    assert summary.by_decision == {"done": 3, "changed": 1, "retry": 1, "new": 1} and summary.to_synthesize == 3
    with pytest.raises(OutputMismatch, match=r"1 rows changed since they were written \('edited'\)"):
        refuse_changed(summary)


@pytest.mark.parametrize("distributed", [False, True], ids=["in-process", "distributed"])
def test_rejected_rows_count_as_done_unless_retry_rejected(tmp_path, distributed, request):
    if distributed:
        request.getfixturevalue("ray_cluster")
    ids = ["ok", "rejected", "bad-text"]
    pq.write_table(pa.table({"id": ids, "text": [f"text of {i}" for i in ids]}), tmp_path / "in.parquet")
    now = hashes(tmp_path / "in.parquet", "settings")
    layout = OutputLayout(str(tmp_path / "out"))
    layout.ensure()
    written = [
        {S.ID: "ok", S.STATUS: S.STATUS_OK, S.CONTENT_HASH: now["ok"], S.RUN: "r1"},
        {
            S.ID: "rejected",
            S.STATUS: S.STATUS_REJECTED,
            S.QUALITY_FLAGS: ["no_audio"],
            S.CONTENT_HASH: now["rejected"],
            S.RUN: "r1",
        },
        {S.ID: "bad-text", S.STATUS: S.STATUS_ERROR, S.RETRYABLE: False, S.CONTENT_HASH: now["bad-text"], S.RUN: "r1"},
    ]
    layout.write_part(S.output_table(written), "part-r1.parquet")

    def verdicts(**kwargs):
        decided = decide_rows(tmp_path / "in.parquet", distributed=distributed, output=layout.location, **kwargs)
        return dict(zip(decided.column(S.ID).to_pylist(), decided.column("_decision").to_pylist()))

    assert verdicts() == {"ok": "done", "rejected": "done", "bad-text": "done"}
    assert verdicts(retry_errors=True) == {"ok": "done", "rejected": "done", "bad-text": "retry"}  # errors only
    assert verdicts(retry_rejected=True) == {"ok": "done", "rejected": "retry", "bad-text": "done"}


# ---- finding 7: input discovery ---------------------------------------------------------
def test_input_discovery_skips_what_spark_and_notebooks_leave(tmp_path):
    from pipeline.plan.inputs import scan_input

    data = tmp_path / "set"
    for rel in ("part-0.parquet", "sub/part-1.parquet"):
        (data / rel).parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.table({"id": [rel.replace("/", ":")], "text": ["x"]}), data / rel)
    # a Spark job's leftovers and a notebook's checkpoint: the same rows again
    for rel in ("_temporary/0/part-0.parquet", ".ipynb_checkpoints/part-0.parquet", "sub/_SUCCESS/x.parquet"):
        (data / rel).parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.table({"id": ["part-0.parquet"], "text": ["x"]}), data / rel)
    decided = decide_rows(data)
    assert sorted(decided.column(S.ID).to_pylist()) == ["part-0.parquet", "sub:part-1.parquet"]
    assert set(decided.column("_decision").to_pylist()) == {"new"}
    # '*' stays within one directory level; hidden names need a pattern that names them
    assert decide_rows(data / "*.parquet").column(S.ID).to_pylist() == ["part-0.parquet"]
    assert decide_rows(data / "*" / "*.parquet").column(S.ID).to_pylist() == ["sub:part-1.parquet"]
    assert scan_input(str(data / "_temporary" / "*" / "*.parquet"), {}).total_rows == 1


def test_output_inside_the_input_directory_is_refused(tmp_path):
    from pipeline.errors import ConfigError

    (tmp_path / "set").mkdir()
    pq.write_table(pa.table({"id": ["a"], "text": ["x"]}), tmp_path / "set" / "in.parquet")
    for data_path in (tmp_path / "set", tmp_path / "set" / "*.parquet"):
        with pytest.raises(ConfigError, match="inside the input directory"):
            run(compose([f"data.path={data_path}", f"output.dir={tmp_path}/set/out"]))
    assert not (tmp_path / "set" / "out").exists()


def test_dictionary_encoded_columns_are_read_as_their_values(tmp_path):
    from pipeline.plan.inputs import _decode_dictionaries, scan_input

    table = pa.table(
        {
            "id": pa.array(["a", "b"]).dictionary_encode(),
            "text": ["x", "y"],
            "speaker": pa.array(["ada", "ada"]).dictionary_encode(),
        }
    )
    pq.write_table(table, tmp_path / "in.parquet")
    scan = scan_input(str(tmp_path / "in.parquet"), {})
    assert decide_rows(tmp_path / "in.parquet").column(S.ID).to_pylist() == ["a", "b"]
    assert "speaker" in scan.rename.values()
    plain = _decode_dictionaries(pq.read_table(tmp_path / "in.parquet"))
    assert plain.schema.field("speaker").type == pa.string() and plain.column("speaker").to_pylist() == ["ada"] * 2


# ---- finding 9: one clip per ref_id ------------------------------------------------------
@pytest.mark.parametrize("distributed", [False, True], ids=["in-process", "distributed"])
def test_a_ref_id_naming_two_clips_refuses_its_rows_naming_both(bad_table, distributed, request):
    if distributed:
        request.getfixturevalue("ray_cluster")
    decided = decide_rows(bad_table.path, distributed=distributed)
    rejected = decided.filter(pc.equal(decided.column("_reason"), "ref_id_conflict"))
    conflicts = dict(zip(rejected.column(S.ID).to_pylist(), rejected.column("_error").to_pylist()))
    assert sorted(conflicts) == sorted(bad_table.ref_id_conflicts)
    message = conflicts["bad-refid-b"]
    assert "'refs/speech.flac' (row 'bad-refid-a')" in message and "'refs/stereo.flac' (row 'bad-refid-b')" in message
    assert "ok-ref-id-1" not in conflicts  # two rows, one clip: fine


def test_a_row_refused_by_an_earlier_run_is_planned_afresh(tmp_path):
    # the rejected part answers the refusals of the run that wrote it; once the input is
    # fixed (the duplicate gone), the row is new, not "done" as that part's error row
    pq.write_table(pa.table({"id": ["dup", "other"], "text": ["fixed now", "x"]}), tmp_path / "in.parquet")
    layout = OutputLayout(str(tmp_path / "out"))
    layout.ensure()
    refused = S.error_row("dup", "duplicate id 'dup': 2 input rows share it", **{S.RUN: "r0"})
    layout.write_part(S.output_table([refused]), REJECTED_PART)
    decided = decide_rows(tmp_path / "in.parquet", output=layout.location)
    assert dict(zip(decided.column(S.ID).to_pylist(), decided.column("_decision").to_pylist())) == {
        "dup": "new",
        "other": "new",
    }
