"""Each export format, in process (an output below cluster.distributed_rows), read back by its own
library: webdataset, lhotse, datasets, and files.csv. Every exported row once, its audio decoding
to the stored samples and channels, its id and text carried; shard bounds and names; the
filters; a rerun that changes nothing and a killed export that resumes; what is refused."""

from __future__ import annotations

import csv
import io
import json
import os
import tarfile
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from actors import schema as S
from helpers import export_in_process, export_settings, export_source, ok_row, two_voice_flac
from pipeline.cli import main
from pipeline.export import destination as destination_module
from pipeline.export import formats, task
from pipeline.export.job import export
from pipeline.names import EXPORT_RECORD, EXPORT_STAGING

FORMATS = ["webdataset", "lhotse", "hf", "files"]
ODD_IDS = ["spk1/utt.001", "a.b", "x-0123456789ab", "Plain", "plain", "ünï cødé", "../../etc"]


def stereo_row(row_id: str) -> dict:
    """A per-speaker dialogue row: two channels and its turns."""
    _, flac = two_voice_flac(0.5)
    turns = [
        {S.TURN_SPEAKER: 0, S.TURN_TEXT: "Hello.", S.TURN_START_S: 0.0, S.TURN_END_S: 0.25},
        {S.TURN_SPEAKER: 1, S.TURN_TEXT: "Hi.", S.TURN_START_S: 0.25, S.TURN_END_S: 0.5},
    ]
    return {**ok_row(row_id, 0.5), S.AUDIO: {S.AUDIO_BYTES: flac, S.AUDIO_PATH: None}, S.TURNS: turns}


def source_rows() -> list[dict]:
    rows = [{**ok_row(f"utt-{k:03d}", 0.1 + 0.01 * k), S.TEXT: f"Sentence {k}."} for k in range(9)]
    rows += [{**ok_row(i, 0.2), S.TEXT: f"Odd {i}"} for i in ODD_IDS]
    rows += [{**stereo_row("talk"), S.TEXT: "<|speaker:0|>Hello.<|speaker:1|>Hi."}]
    rows += [{**ok_row("kept-back", 0.2), S.STATUS: S.STATUS_REJECTED, S.QUALITY_FLAGS: ["silence"]}]
    rows += [S.error_row("broken", "bad text")]
    return rows


EXPORTED = {r[S.ID]: r for r in source_rows() if r[S.STATUS] == S.STATUS_OK}


settings = export_settings
CLUSTER = export_in_process()


def decoded(data: bytes) -> tuple[int, int]:
    info = sf.info(io.BytesIO(data))
    return info.frames, info.channels


# ---- each format's own reader: id -> (frames, channels, text) -----------------------------------


def read_webdataset(dest: Path) -> dict:
    import webdataset as wds

    urls = sorted(str(p) for p in dest.glob("*.tar"))
    got = {}
    for sample in wds.WebDataset(urls, shardshuffle=False):
        meta = json.loads(sample["json"])
        assert sample["__key__"] == S.sample_key(meta[S.ID]) and "." not in sample["__key__"]
        assert meta[S.ID] not in got
        got[meta[S.ID]] = (*decoded(sample["flac"]), meta[S.TEXT])
    return got


def read_lhotse(dest: Path) -> dict:
    from lhotse import CutSet

    got = {}
    for cut in CutSet.from_shar(in_dir=str(dest)):
        audio = cut.load_audio()
        (supervision,) = cut.supervisions
        assert cut.custom[S.ID] not in got
        got[cut.custom[S.ID]] = (audio.shape[1], audio.shape[0], supervision.text)
    return got


def read_hf(dest: Path) -> dict:
    import datasets

    loaded = datasets.load_dataset(str(dest))  # the directory alone
    assert list(loaded) == ["train"]
    train = loaded["train"]
    assert isinstance(train.features[S.AUDIO], datasets.Audio)
    train = train.cast_column(S.AUDIO, datasets.Audio(decode=False))
    got = {}
    for row in train:
        assert row[S.ID] not in got
        got[row[S.ID]] = (*decoded(row[S.AUDIO]["bytes"]), row[S.TEXT])
    return got


def read_files(dest: Path) -> dict:
    with open(dest / "files.csv", newline="", encoding="utf-8") as f:
        index = list(csv.DictReader(f))
    assert len({r["file"] for r in index}) == len(index)
    return {r[S.ID]: (*decoded((dest / r["file"]).read_bytes()), EXPORTED[r[S.ID]][S.TEXT]) for r in index}


READERS = {"webdataset": read_webdataset, "lhotse": read_lhotse, "hf": read_hf, "files": read_files}


@pytest.fixture
def source(tmp_path):
    return export_source(tmp_path / "out", source_rows())


@pytest.mark.parametrize("fmt", FORMATS)
def test_each_format_reads_back_with_its_own_library(source, tmp_path, fmt):
    dest = tmp_path / fmt
    report = export(source.location, settings(fmt, dest, shard_rows=4), CLUSTER)
    assert report.summary["rows"] == len(EXPORTED)
    assert report.summary["removed"] == {"status": 2}  # the rejected and the error row
    got = READERS[fmt](dest)
    assert sorted(got) == sorted(EXPORTED)  # every ok row exactly once
    for row_id, (frames, channels, text) in got.items():
        assert (frames, channels) == decoded(EXPORTED[row_id][S.AUDIO][S.AUDIO_BYTES]), row_id
        assert text == EXPORTED[row_id][S.TEXT]
    assert got["talk"][1] == 2  # the per-speaker row keeps its channels
    assert not (dest / EXPORT_STAGING).exists()


def test_a_file_name_taken_by_other_bytes_takes_the_hashed_form(tmp_path):
    # what a case-insensitive disk shows when `Plain` follows `plain`: the name holds other bytes
    from pipeline.export.files import FilesPiece

    destination = destination_module.Destination(str(tmp_path / "audio"), EXPORT_RECORD)
    os.makedirs(destination.base)
    (tmp_path / "audio" / "Plain.flac").write_bytes(b"another row's audio")
    context = formats.PieceContext(destination, [S.ID, S.AUDIO], "train", named_split=False)
    piece = FilesPiece(str(tmp_path), context)
    name = piece.place("Plain", b"this row's audio")
    assert name == f"{S.audio_file_stem('Plain', with_hash=True)}.flac"
    assert piece.place("Plain", b"this row's audio") == name  # a rerun finds its own file
    assert (tmp_path / "audio" / "Plain.flac").read_bytes() == b"another row's audio"
    piece.close()


def test_the_webdataset_json_carries_the_chosen_columns(source, tmp_path):
    def talk_json(dest, **more):
        export(source.location, settings("webdataset", dest, **more), CLUSTER)
        (shard,) = dest.glob("*.tar")
        with tarfile.open(shard) as tar:
            names = tar.getnames()
            assert names[0].endswith(".flac") and names[1] == names[0].replace(".flac", ".json")  # side by side
            return json.loads(tar.extractfile("talk.json").read())

    # a training set's columns by default
    assert list(talk_json(tmp_path / "a")) == [S.ID, S.TEXT, S.AUDIO_SECONDS, S.SPEAKER, S.ASR_LANGUAGE]
    # every metadata column on request
    talk = talk_json(tmp_path / "b", columns=list(S.METADATA_COLUMNS))
    assert set(talk) == set(S.METADATA_COLUMNS)
    assert [t[S.TURN_TEXT] for t in talk[S.TURNS]] == ["Hello.", "Hi."]


@pytest.mark.parametrize("fmt", ["webdataset", "lhotse", "hf"])
def test_shards_stay_within_the_bounds_and_are_numbered_without_gaps(source, tmp_path, fmt):
    dest = tmp_path / fmt
    audio = sorted(len(r[S.AUDIO][S.AUDIO_BYTES]) for r in EXPORTED.values())
    cap = audio[-1] + audio[-2]  # room for two of the largest rows
    summary = export(source.location, settings(fmt, dest, shard_rows=3, shard_bytes=cap), CLUSTER).summary
    n = summary["shards"]
    assert n >= len(EXPORTED) // 3
    if fmt == "webdataset":
        shards = [dest / f"train-{k:06d}.tar" for k in range(n)]
        contents = [tarfile.open(p).getmembers() for p in shards]
        flac = [[m.size for m in members if m.name.endswith(".flac")] for members in contents]
    elif fmt == "lhotse":
        shards = [dest / f"recording.{k:06d}.tar" for k in range(n)]
        assert all((dest / f"cuts.{k:06d}.jsonl.gz").is_file() for k in range(n))
        flac = [[m.size for m in tarfile.open(p).getmembers() if m.name.endswith(".flac")] for p in shards]
    else:
        import pyarrow.parquet as pq

        shards = [dest / "data" / f"train-{k:05d}-of-{n:05d}.parquet" for k in range(n)]
        flac = [
            [len(a["bytes"]) for a in pq.read_table(p, columns=[S.AUDIO]).column(S.AUDIO).to_pylist()] for p in shards
        ]
    assert sorted(p.name for p in shards) == sorted(p.name for p in shards if p.is_file())
    assert sum(len(f) for f in flac) == len(EXPORTED)
    assert all(1 <= len(f) <= 3 for f in flac)
    assert all(sum(f) <= cap for f in flac)


def quality_rows() -> list[dict]:
    """Rows with planted quality values, nulls and flags among them."""
    rng = np.random.default_rng(48)
    rows = []
    for k in range(60):
        rows.append(
            {
                **ok_row(f"q-{k:02d}", 0.05),
                S.STATUS: [S.STATUS_OK, S.STATUS_OK, S.STATUS_REJECTED][k % 3],
                S.MOS: None if k % 7 == 0 else float(rng.uniform(2.0, 4.5)),
                S.SPEAKER_SIMILARITY: float(rng.uniform(0.7, 1.0)),
                S.WER: None if k % 11 == 0 else float(rng.uniform(0.0, 0.6)),
                S.QUALITY_FLAGS: [["clipping"], ["silence", "loudness"], []][k % 4 % 3],
            }
        )
    return rows + [S.error_row("broken", "bad")]


def expected_kept(rows, status, min_mos, min_sim, max_wer, excluded) -> set:
    def keeps(r) -> bool:
        return (
            r[S.STATUS] in status
            and r.get(S.MOS) is not None
            and r[S.MOS] >= min_mos
            and r[S.SPEAKER_SIMILARITY] >= min_sim
            and r.get(S.WER) is not None
            and r[S.WER] <= max_wer
            and not set(r.get(S.QUALITY_FLAGS) or []) & set(excluded)
        )

    return {r[S.ID] for r in rows if keeps(r)}


def test_the_filters_export_exactly_the_rows_the_thresholds_keep(tmp_path, capsys):
    rows = quality_rows()
    source = export_source(tmp_path / "out", rows, block_rows=7)
    dest = tmp_path / "wds"
    argv = [
        "export",
        f"output.dir={source.location}",
        "export.format=webdataset",
        f"export.dir={dest}",
        "export.status=[ok,rejected]",
        "export.min_mos=3.0",
        "export.min_speaker_similarity=0.8",
        "export.max_wer=0.4",
        "export.exclude_flags=[clipping]",
        "cluster.distributed_rows=100000",
    ]
    assert main(argv) == 0
    kept = expected_kept(rows, {"ok", "rejected"}, 3.0, 0.8, 0.4, ["clipping"])
    assert 5 < len(kept) < 40
    assert sorted(read_webdataset(dest)) == sorted(kept)
    record = json.loads((dest / EXPORT_RECORD).read_text())["summary"]
    assert sum(record["removed"].values()) == len(rows) - len(kept)
    assert record["removed"]["status"] == 1 and record["removed"]["min_mos: no value"] > 0
    out = capsys.readouterr().out
    assert f"chorus export: {len(kept)} rows" in out and "min_mos" in out and "exclude_flags" in out


def snapshot(dest: Path) -> dict:
    return {str(p.relative_to(dest)): (p.stat().st_mtime_ns, p.read_bytes()) for p in dest.rglob("*") if p.is_file()}


def test_a_rerun_over_a_finished_export_changes_nothing(source, tmp_path):
    dest = tmp_path / "wds"
    export(source.location, settings("webdataset", dest, shard_rows=4), CLUSTER)
    before = snapshot(dest)
    again = export(source.location, settings("webdataset", dest, shard_rows=4), CLUSTER)
    assert again.already_done and snapshot(dest) == before


def test_a_killed_export_resumes_and_writes_each_row_once(source, tmp_path, monkeypatch):
    dest = tmp_path / "wds"
    real = task.read_slices
    calls = []

    def dies_on_the_third_unit(*args):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt  # the process killed mid-unit
        yield from real(*args)

    monkeypatch.setattr(task, "read_slices", dies_on_the_third_unit)
    with pytest.raises(KeyboardInterrupt):
        export(source.location, settings("webdataset", dest, shard_rows=4), CLUSTER)
    assert not list(dest.glob("*.tar"))  # nothing under a final name before every unit is done
    monkeypatch.setattr(task, "read_slices", real)

    published = []
    real_publish = destination_module.Destination.publish

    def dies_after_one_publish(self, piece, names):
        if published:
            raise KeyboardInterrupt
        published.append(piece)
        real_publish(self, piece, names)

    monkeypatch.setattr(destination_module.Destination, "publish", dies_after_one_publish)
    with pytest.raises(KeyboardInterrupt):
        export(source.location, settings("webdataset", dest, shard_rows=4), CLUSTER)
    monkeypatch.setattr(destination_module.Destination, "publish", real_publish)
    report = export(source.location, settings("webdataset", dest, shard_rows=4), CLUSTER)
    assert report.summary["units_reused"] == report.summary["units"]  # no unit written a third time
    assert sorted(read_webdataset(dest)) == sorted(EXPORTED)
    assert not (dest / EXPORT_STAGING).exists()


def test_another_export_into_the_same_directory_is_refused_unless_overwrite(source, tmp_path):
    from pipeline.errors import OutputMismatch

    dest = tmp_path / "wds"
    export(source.location, settings("webdataset", dest), CLUSTER)
    (dest / "notes.txt").write_text("mine")
    with pytest.raises(OutputMismatch, match="filters differ"):
        export(source.location, settings("webdataset", dest, min_mos=3.0), CLUSTER)
    report = export(source.location, settings("webdataset", dest, exclude_flags=["clipping"], overwrite=True), CLUSTER)
    assert report.summary["filters"]["exclude_flags"] == ["clipping"]
    assert (dest / "notes.txt").read_text() == "mine"  # never deletes what it did not write
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "x.tar").write_bytes(b"x")
    with pytest.raises(OutputMismatch, match="not a chorus export"):
        export(source.location, settings("webdataset", foreign, overwrite=True), CLUSTER)
    assert (foreign / "x.tar").read_bytes() == b"x"


def test_an_unfinished_or_running_source_is_refused(source, tmp_path):
    from pipeline.errors import OutputInUse, OutputMismatch
    from pipeline.names import LEASE_FILE, SUMMARY_FILE

    source.write_text(LEASE_FILE, json.dumps({"host": os.uname().nodename, "pid": os.getpid(), "heartbeat": 1e12}))
    with pytest.raises(OutputInUse, match="export it once that run has finished"):
        export(source.location, settings("hf", tmp_path / "a"), CLUSTER)
    source.fs.delete_file(source.path(LEASE_FILE))
    source.write_text(SUMMARY_FILE, json.dumps({"rows_total": 3}))
    with pytest.raises(OutputMismatch, match="rerun the job's own command"):
        export(source.location, settings("hf", tmp_path / "b"), CLUSTER)


def test_a_missing_writer_library_and_bad_keys_are_clear_errors(source, tmp_path, monkeypatch, capsys):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "lhotse" else real(name, *a))
    assert main(["export", f"output.dir={source.location}", "export.format=lhotse"]) == 2
    assert "pip install 'chorus-tts[export]'" in capsys.readouterr().err
    assert main(["export", f"output.dir={source.location}", "export.format=tfrecord"]) == 2
    assert "export.format must be one of files, webdataset, lhotse, hf" in capsys.readouterr().err
    assert main(["export", f"output.dir={source.location}", "export.status=[error]"]) == 2
    assert "error rows have no audio" in capsys.readouterr().err
    assert main(["export", f"output.dir={source.location}", "export.exclude_flags=[clipped]"]) == 2
    assert "unknown flag(s) ['clipped']" in capsys.readouterr().err


def test_the_dataset_cards_yaml_is_datasets_own(source, tmp_path):
    import datasets
    import yaml

    from pipeline.export.hf import yaml_features
    from pipeline.output import hf_features

    features = hf_features.features(S.OUTPUT_SCHEMA, 44100)
    theirs = datasets.DatasetInfo(features=datasets.Features.from_dict(features))._to_yaml_dict()["features"]
    assert yaml_features(features) == theirs
    dest = tmp_path / "hf"
    export(source.location, settings("hf", dest), CLUSTER)
    card = (dest / "README.md").read_text()
    header = yaml.safe_load(card.split("---")[1])
    assert header["configs"] == [{"config_name": "default", "data_files": [{"split": "train", "path": "data/train-*"}]}]
    assert header["dataset_info"]["splits"][0]["num_examples"] == len(EXPORTED)
    assert "model: `demo` (checkpoint `tiny`)" in card


def test_sample_keys_are_tar_safe_and_unique():
    ids = [*ODD_IDS, "LJ001-0001", "a_b", "a/b", "a b", "x-0123456789ab-" + "0" * 12, " ", ""[:0] or "id"]
    keys = [S.sample_key(i) for i in ids]
    assert len(set(keys)) == len(ids)
    assert all("." not in k and "/" not in k and len(k) <= 100 for k in keys)
    assert S.sample_key("LJ001-0001") == "LJ001-0001"


def test_a_shard_holds_a_whole_row_even_past_the_byte_bound():
    bounds = formats.Bounds(rows=10, audio_bytes=1)
    opened = []

    class Piece:
        def __init__(self):
            self.rows = 0

        def add(self, table):
            self.rows += table.num_rows

        def close(self):
            pass

    def open_piece(k):
        opened.append(Piece())
        return opened[-1]

    cutter = formats.Cutter(bounds, open_piece)
    cutter.add(S.output_table([ok_row(f"r{k}") for k in range(3)]))
    assert [p["rows"] for p in cutter.close()] == [1, 1, 1] and [p.rows for p in opened] == [1, 1, 1]
