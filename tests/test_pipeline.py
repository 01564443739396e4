"""The driver without Ray: config schema, input checks, id screening, output layout and
resume state, progress, export, and the layering rule (the driver never loads torch)."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
from dataclasses import asdict

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import soundfile as sf
import yaml
from hydra.errors import ConfigCompositionException, MissingConfigException
from omegaconf.errors import MissingMandatoryValue

from actors import schema as S
from actors.engine.settings import EngineConfig
from actors.files import TEMP_PREFIX
from pipeline.config import EngineSettings, compose, to_plain
from pipeline.errors import ConfigError, InputError, OutputMismatch
from pipeline.names import IDENTITY_FILE, REJECTED_PART, part_name
from pipeline.output.audio_files import export
from pipeline.output.layout import OutputLayout
from pipeline.output.parts import write_block
from pipeline.plan.inputs import scan_input
from pipeline.run.progress import Progress
from pipeline.run.sequence import run
from tests.helpers import REPO, decide_rows


# ---- config ---------------------------------------------------------------------------
def test_defaults_run_the_demo():
    plain = to_plain(compose())
    assert plain["model"]["checkpoint"] is None and plain["model"]["name"] == "demo-s1-tiny"
    assert plain["data"]["path"] == str(REPO / "data" / "demo" / "demo.parquet")
    assert plain["output"]["dir"] == "outputs/demo"
    assert 0 < plain["cluster"]["cpus_per_actor"] < 1  # never a whole CPU on the default local run


@pytest.mark.parametrize(
    "override",
    [
        "model.chekpoint=/x",
        "cluster.num_actors=two",
        "engine.max_rows=1.5",
        "output.keep_codes=maybe",
        "colour=blue",
        "engine=warp",
    ],
)
def test_typos_and_wrong_types_are_rejected(override):
    with pytest.raises((ConfigCompositionException, MissingConfigException)) as info:
        compose([override])
    assert override.split("=")[0] in str(info.value)


def test_real_models_need_a_checkpoint_path():
    with pytest.raises(MissingMandatoryValue):
        to_plain(compose(["model=s1_mini"]))
    plain = to_plain(compose(["model=s2_pro", "model.checkpoint=/ckpt/s2-pro"]))
    assert plain["model"]["checkpoint"] == "/ckpt/s2-pro" and plain["model"]["name"] == "s2-pro"


def test_engine_groups_only_override_the_defaults():
    # each engine default lives once, in the dataclasses; a group file states what differs
    defaults = asdict(EngineSettings())
    for group in sorted((REPO / "conf" / "engine").glob("*.yaml")):
        values = yaml.safe_load(group.read_text())
        assert values, group
        for key, value in values.items():
            assert key in defaults, f"{group.name}: {key} is not an engine setting"
            assert value != defaults[key], f"{group.name}: {key}: {value} restates the default"
    # every engine setting is a key of the run config (one object from Hydra to the engine)
    assert set(asdict(EngineConfig())) <= set(to_plain(compose())["engine"])


@pytest.mark.parametrize(
    "override",
    ["engine.max_rows=0", "engine.prefill_chunk=0", "engine.codec_batch_rows=0", "engine.frames_per_char=-1"],
)
def test_out_of_range_engine_settings_are_named_before_any_work(tmp_path, override):
    with pytest.raises(ConfigError, match=override.split("=")[0]):
        run(compose([override, f"output.dir={tmp_path}/out"]))
    assert not (tmp_path / "out").exists()


def test_hydra_run_dir_follows_the_output(tmp_path):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base=None):
        local = hydra_compose("config", [f"output.dir={tmp_path}/out"], return_hydra_config=True)
        remote = hydra_compose("config", ["output.dir=s3://bucket/out"], return_hydra_config=True)
    assert local.hydra.run.dir.startswith(f"{tmp_path}/out/_runs/")
    assert remote.hydra.run.dir.startswith("outputs/_runs/")


# ---- input ----------------------------------------------------------------------------
def write(tmp_path, table: pa.Table, name: str = "in.parquet"):
    path = tmp_path / name
    pq.write_table(table, path)
    return path


def test_missing_column_fails_before_any_work(tmp_path, monkeypatch):
    """The schema is checked before Ray is reached and before anything is written. (Other tests
    may already hold this process's session Ray, so what is checked is that the run never
    asked for a cluster.)"""
    import pipeline.cluster

    def connect(cluster):
        raise AssertionError("the run reached Ray before validating its input")

    monkeypatch.setattr(pipeline.cluster.Cluster, "connect", connect)
    path = write(tmp_path, pa.table({"id": ["a", "b"], "sentence": ["x", "y"]}))
    with pytest.raises(S.InputSchemaError, match="required column 'text' is missing"):
        run(compose([f"data.path={path}", f"output.dir={tmp_path}/out"]))
    assert not (tmp_path / "out").exists()


def test_renamed_columns_and_wrong_types_are_named(tmp_path):
    path = write(tmp_path, pa.table({"utt": ["a"], "sentence": ["x"], "seed": [[1]]}))
    with pytest.raises(S.InputSchemaError) as info:
        scan_input(str(path), {"id": "utt", "text": "sentence"})
    assert "column 'seed' has type list<element: int64>, expected integer" in str(info.value)
    path = write(tmp_path, pa.table({"utt": ["a"], "sentence": ["x"]}))
    scan = scan_input(str(path), {"id": "utt", "text": "sentence"})
    assert scan.rename == {"utt": "id", "sentence": "text"}
    with pytest.raises(S.InputSchemaError, match=r"'utt' \(data.columns.id\) is missing"):
        scan_input(str(write(tmp_path, pa.table({"id": ["a"], "text": ["x"]}))), {"id": "utt"})


def test_input_forms(tmp_path):
    (tmp_path / "set").mkdir()
    for k in range(3):
        write(tmp_path / "set", pa.table({"id": [f"r{k}"], "text": ["x"]}), f"part-{k}.parquet")
    assert scan_input(str(tmp_path / "set"), {}).total_rows == 3
    assert scan_input(str(tmp_path / "set" / "part-[01].parquet"), {}).total_rows == 2
    with pytest.raises(InputError, match="does not exist"):
        scan_input(str(tmp_path / "nothing.parquet"), {})
    (tmp_path / "junk.parquet").write_bytes(b"not parquet")
    with pytest.raises(InputError, match="not readable Parquet"):
        scan_input(str(tmp_path / "junk.parquet"), {})


@pytest.mark.parametrize("distributed", [False, True], ids=["in-process", "distributed"])
def test_driver_rejects_unusable_ids(bad_table, distributed, request):
    if distributed:
        request.getfixturevalue("ray_cluster")
    decided = decide_rows(bad_table.path, distributed=distributed)
    messages = {}
    for row in decided.filter(pc.equal(decided.column("_decision"), "rejected")).to_pylist():
        messages.setdefault(row[S.ID], []).append(row["_error"])
    for row_id, fragment in bad_table.rejected_by_driver.items():
        assert any(fragment in m for m in messages[row_id]), (row_id, messages.get(row_id))
    assert len(messages[bad_table.duplicate_id]) == 2  # every copy of a duplicate
    assert "duplicate id 'dup': 2 input rows share it" in messages["dup"][0]
    assert "bad.parquet row" in messages[None][0]  # says where the row is
    assert decided.num_rows == bad_table.table.num_rows  # one decision per input row


@pytest.mark.parametrize("row_id", ["../../x", "a/b", "..", ".", " ", "a\\b", "x\x00y", "\u202eevil", "spk/utt"])
def test_ids_are_data_and_never_paths(row_id):
    """Finding 9: ids with '/' were refused, though corpora name utterances speaker/utt. Any
    non-empty string is an id; its file name is a safe stem of its own."""
    assert S.id_problem(row_id) is None
    stem = S.audio_file_stem(row_id)
    assert "/" not in stem and "\\" not in stem and stem not in (".", "..") and stem.isascii()


@pytest.mark.parametrize("row_id", [None, "", "x" * 257, "bad\ud800", 7])
def test_ids_that_cannot_name_a_row_are_refused(row_id):
    assert S.id_problem(row_id)


def test_audio_file_stems_are_safe_and_distinct():
    ids = [
        "plain-id_1.v2",
        "with space",
        "Ünïcödé",
        "with space ",
        "semi;colon",
        "x" * 250,
        ".hidden",
        "trailing.",
        "CON",
        "a:b",
        "a_b",
        "a?b",
        "-dash",
    ]
    stems = [S.audio_file_stem(i) for i in ids]
    assert stems[0] == "plain-id_1.v2" and stems[8] == "CON"
    assert len(set(stems)) == len(stems)
    for stem in stems:
        assert "/" not in stem and "\\" not in stem and not stem.startswith(".") and len(stem) <= 100
        assert stem not in (".", "..") and stem.isascii()


# ---- output ---------------------------------------------------------------------------
def ok_row(row_id: str, seconds: float = 0.25, rate: int = 44100) -> dict:
    wave = (0.2 * np.sin(np.arange(int(seconds * rate)) / 7.0)).astype(np.float32)
    buffer = io.BytesIO()
    sf.write(buffer, wave, rate, format="FLAC")
    return {
        S.ID: row_id,
        S.STATUS: S.STATUS_OK,
        S.AUDIO: {S.AUDIO_BYTES: buffer.getvalue(), S.AUDIO_PATH: None},
        S.SAMPLE_RATE: rate,
        S.AUDIO_SECONDS: seconds,
        S.N_FRAMES: int(seconds * 21.5),
        S.RUN: "r1",
        S.ACTOR: "actor-1",
        S.RTF: 0.5,
    }


def test_parts_are_atomic_and_idempotent(tmp_path):
    layout = OutputLayout(str(tmp_path / "out"))
    layout.ensure()
    table = S.output_table([ok_row("a"), ok_row("b"), S.error_row("c", "text is empty")])
    stats = write_block(table, layout.location).to_pylist()
    write_ms = stats[0].pop("write_ms")
    assert write_ms > 0
    assert stats == [
        {
            "rows": 3,
            "ok": 2,
            "errors": 1,
            "audio_seconds": 0.5,
            "frames": 10,
            "part": part_name(table.column(S.ID).to_pylist()),
            "bytes": os.path.getsize(os.path.join(layout.data_dir, part_name(table.column(S.ID).to_pylist()))),
            "slot_rows": 0.0,  # these rows carry no batch figures
            "slot_steps": 0.0,
        }
    ]
    write_block(table, layout.location)  # a retried write replaces its own file
    assert [os.path.basename(p) for p in layout.parts()] == [stats[0]["part"]]
    assert not [p for p in os.listdir(layout.data_dir) if p.startswith(TEMP_PREFIX)]
    # a torn file left by a killed writer is never read as data, and goes at the next start
    (tmp_path / "out" / "data" / f"{TEMP_PREFIX}123-part-x.parquet").write_bytes(b"PAR1 torn")
    assert sorted(layout.done_ids().to_pylist()) == ["a", "b", "c"]
    assert layout.clean_temp() == 1


def test_output_is_bound_to_its_input(tmp_path):
    layout = OutputLayout(str(tmp_path / "out"))
    layout.claim({"input": "a.parquet", "model": "m"}, overwrite=False)
    write_block(S.output_table([ok_row("a")]), layout.location)
    layout.claim({"input": "a.parquet", "model": "m"}, overwrite=False)  # a rerun: fine
    with pytest.raises(OutputMismatch, match="output.overwrite=true"):
        layout.claim({"input": "b.parquet", "model": "m"}, overwrite=False)
    layout.claim({"input": "b.parquet", "model": "m"}, overwrite=True)
    assert layout.parts() == [] and json.loads(layout.read_text(IDENTITY_FILE))["input"] == "b.parquet"


def test_settings_that_cannot_work_fail_early(tmp_path):
    for overrides, message in [
        (["cluster.num_actors=0"], "num_actors"),
        (["output.progress_bar=sometimes"], "progress_bar"),
        (["cluster.crash_on_batch=2"], "crash_marker"),
        (["sampling.temperature=1e39"], "temperature 1e\\+39 is outside"),
        (["sampling.top_k=2147483648"], "top_k 2147483648 is outside"),
        (["cluster.max_task_retries=2", "cluster.crash_quarantine_after=2"], "must exceed"),
        (["output.on_change=ignore"], "on_change"),
        (["model=s1_mini", f"model.checkpoint={tmp_path}"], "no config.json"),
    ]:
        with pytest.raises(ConfigError, match=message):
            run(compose(overrides + [f"output.dir={tmp_path}/out"]))


def test_progress_line():
    progress = Progress(total=10, already_done=2, interval_s=0, bar="off")
    progress.update(rows=3, errors=1, audio_seconds=1800.0)
    line = progress.line()
    assert line.startswith("5/10 rows (50%)") and "0.500 h audio" in line and "1 errors" in line
    assert "ETA" in line and "slots" not in line  # no engine steps reported yet
    progress.update(rows=1, errors=0, audio_seconds=0.0, slot_rows=30.0, slot_steps=40.0)
    progress.update(rows=1, errors=0, audio_seconds=0.0, slot_rows=10.0, slot_steps=40.0)
    assert "slots 50% full" in progress.line()
    progress.close()


def test_export_writes_one_safe_file_per_ok_row(tmp_path):
    layout = OutputLayout(str(tmp_path / "out"))
    layout.ensure()
    ids = ["plain", "Plain", "has space", "ünï"]
    write_block(S.output_table([ok_row(i) for i in ids[:2]]), layout.location)
    write_block(S.output_table([ok_row(i) for i in ids[2:]] + [S.error_row("broken", "bad text")]), layout.location)
    layout.write_part(
        S.output_table(
            [S.error_row(None, "id is null"), S.error_row("dup", "duplicate"), S.error_row("dup", "duplicate")]
        ),
        REJECTED_PART,
    )
    report = export(layout.location)
    assert (report.written, report.errors) == (4, 4)
    audio_dir = tmp_path / "out" / "audio"
    with open(audio_dir / "files.csv", newline="") as f:
        index = {row["id"]: row for row in csv.DictReader(f)}
    names = [index[i]["file"] for i in ids]
    assert names[0] == "plain.flac" and len({n.lower() for n in names}) == 4  # case-insensitive safe
    for row_id in ids:
        wave, rate = sf.read(audio_dir / index[row_id]["file"])
        assert len(wave) / rate == pytest.approx(0.25)
    assert index["broken"]["file"] == "" and "bad text" in index["broken"]["error"]
    assert export(layout.location).skipped == 4  # a second export leaves existing files alone


# ---- layering -------------------------------------------------------------------------
def test_driver_never_imports_torch():
    code = (
        "import sys, importlib, pkgutil, pipeline;"
        "[importlib.import_module(m.name) for m in pkgutil.walk_packages(pipeline.__path__, 'pipeline.')];"
        # what the driver uses from the actors' side: the column contract, the actor's and the
        # engine's settings, the engine's types, the actor class (it loads torch in its constructor)
        "import actors, actors.schema, actors.settings, actors.synth, actors.engine.settings, actors.engine.types;"
        "print('torch' in sys.modules)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"
