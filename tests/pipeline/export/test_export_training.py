"""Exports a trainer loads as they are: export.columns, export.splits (by a hash of the id, stable
as the dataset grows), the card's license and language, the NeMo manifest, and Lhotse Shar
holding the output's own FLAC bytes -- each read back by its consumer's own library."""

from __future__ import annotations

import csv
import io
import json
import tarfile
from pathlib import Path

import pytest
import soundfile as sf

from actors import schema as S
from helpers import export_in_process, export_settings, export_source, ok_row
from pipeline.export.job import export
from pipeline.export.splits import SplitRule

SHARES = {"train": 0.6, "validation": 0.2, "test": 0.2}
CLUSTER = export_in_process()


def rows(count: int) -> list[dict]:
    return [
        {
            **ok_row(f"utt-{k:03d}", 0.1 + 0.005 * k),
            S.TEXT: f"Sentence number {k}.",
            S.SPEAKER: f"spk{k % 3}",
            S.ASR_LANGUAGE: "en",
            S.WER: 0.01 * k,
        }
        for k in range(count)
    ]


ROWS = {r[S.ID]: r for r in rows(40)}
EXPECTED = {row_id: SplitRule(SHARES).of(row_id) for row_id in ROWS}


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    return export_source(tmp_path_factory.mktemp("out"), list(ROWS.values()))


def exported(source, tmp_path, fmt, **more):
    dest = tmp_path / fmt
    report = export(source.location, export_settings(fmt, dest, splits=SHARES, shard_rows=7, **more), CLUSTER)
    assert report.summary["rows"] == len(ROWS)
    assert {s: c["rows"] for s, c in report.summary["splits"].items()} == {
        s: sum(1 for v in EXPECTED.values() if v == s) for s in SHARES
    }
    return dest, report.summary


def test_the_split_rule_is_a_function_of_the_id_and_keeps_the_shares():
    assert set(EXPECTED.values()) == set(SHARES)  # every split gets rows here
    rule = SplitRule(SHARES)
    many = [rule.of(f"row-{k}") for k in range(20_000)]
    for split, share in SHARES.items():
        assert abs(many.count(split) / len(many) - share) < 0.015
    assert SplitRule(None).of("anything") == "train"


def test_hf_splits_load_with_datasets(source, tmp_path):
    import datasets
    import yaml

    dest, _ = exported(source, tmp_path, "hf", license="cc-by-4.0", language=["en"])
    loaded = datasets.load_dataset(str(dest))
    assert sorted(loaded) == sorted(SHARES)
    for split, table in loaded.items():
        assert sorted(table[S.ID]) == sorted(i for i, s in EXPECTED.items() if s == split)
        assert set(table.column_names) == {S.ID, S.TEXT, S.AUDIO, S.AUDIO_SECONDS, S.SPEAKER, S.ASR_LANGUAGE}
        table = table.cast_column(S.AUDIO, datasets.Audio(decode=False))
        for row in table:
            assert row[S.AUDIO]["bytes"] == ROWS[row[S.ID]][S.AUDIO][S.AUDIO_BYTES]
            assert row[S.TEXT] == ROWS[row[S.ID]][S.TEXT] and row[S.SPEAKER] == ROWS[row[S.ID]][S.SPEAKER]
    header = yaml.safe_load((dest / "README.md").read_text().split("---")[1])
    assert header["license"] == "cc-by-4.0" and header["language"] == ["en"]
    assert [s["name"] for s in header["dataset_info"]["splits"]] == list(SHARES)


def test_lhotse_splits_read_with_from_shar_and_hold_the_outputs_flac_bytes(source, tmp_path):
    from lhotse import CutSet

    dest, _ = exported(source, tmp_path, "lhotse")
    for split in SHARES:
        cuts = list(CutSet.from_shar(in_dir=str(dest / split)))
        assert sorted(c.custom[S.ID] for c in cuts) == sorted(i for i, s in EXPECTED.items() if s == split)
        for cut in cuts:
            row = ROWS[cut.custom[S.ID]]
            (supervision,) = cut.supervisions
            assert (supervision.text, supervision.speaker, supervision.language) == (row[S.TEXT], row[S.SPEAKER], "en")
            # the bytes in the tar are the output's FLAC, not a re-encoding
            assert cut.recording.sources[0].source == row[S.AUDIO][S.AUDIO_BYTES]
            assert cut.load_audio().shape[1] == sf.info(io.BytesIO(row[S.AUDIO][S.AUDIO_BYTES])).frames
    written = sorted(str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file())
    assert not [p for p in written if "index" in p]  # no index files, published or not
    assert {p.split("/")[0] for p in written if "/" in p} == set(SHARES)


def test_webdataset_splits_read_with_webdataset(source, tmp_path):
    import webdataset as wds

    dest, summary = exported(source, tmp_path, "webdataset", columns=[S.TEXT, S.WER])
    assert set(summary["urls"]) == set(SHARES)
    for split, url in summary["urls"].items():
        got = {}
        for sample in wds.WebDataset(url, shardshuffle=False):
            meta = json.loads(sample["json"])
            assert list(meta) == [S.ID, S.TEXT, S.WER]
            got[meta[S.ID]] = sample["flac"]
        assert sorted(got) == sorted(i for i, s in EXPECTED.items() if s == split)
        assert all(data == ROWS[i][S.AUDIO][S.AUDIO_BYTES] for i, data in got.items())


def test_nemo_manifests_name_their_files_durations_and_texts(source, tmp_path):
    dest, summary = exported(source, tmp_path, "nemo")
    assert sorted(summary["manifests"]) == sorted(SHARES)
    for split in SHARES:
        manifest = dest / f"{split}_manifest.json"
        entries = [json.loads(line) for line in manifest.read_text(encoding="utf-8").splitlines()]
        assert sorted(e[S.ID] for e in entries) == sorted(i for i, s in EXPECTED.items() if s == split)
        for entry in entries:
            audio = manifest.parent / entry["audio_filepath"]  # relative to the manifest, as NeMo resolves it
            info = sf.info(audio)
            assert entry["duration"] == pytest.approx(info.frames / info.samplerate, abs=1e-9)
            assert audio.read_bytes() == ROWS[entry[S.ID]][S.AUDIO][S.AUDIO_BYTES]
            assert entry[S.TEXT] == ROWS[entry[S.ID]][S.TEXT] and entry[S.SPEAKER] == ROWS[entry[S.ID]][S.SPEAKER]


def test_files_csv_has_the_text_speaker_and_split(source, tmp_path):
    dest, _ = exported(source, tmp_path, "files")
    with open(dest / "files.csv", newline="", encoding="utf-8") as f:
        index = list(csv.DictReader(f))
    assert list(index[0]) == [S.ID, "file", "split", S.TEXT, S.AUDIO_SECONDS, S.SPEAKER, S.ASR_LANGUAGE]
    assert {r[S.ID]: r["split"] for r in index} == EXPECTED
    for r in index:
        assert (r[S.TEXT], r[S.SPEAKER]) == (ROWS[r[S.ID]][S.TEXT], ROWS[r[S.ID]][S.SPEAKER])
        assert (dest / r["file"]).read_bytes() == ROWS[r[S.ID]][S.AUDIO][S.AUDIO_BYTES]


def test_a_row_keeps_its_split_as_the_dataset_grows(tmp_path):
    small = export_source(tmp_path / "small", rows(15))
    grown = export_source(tmp_path / "grown", rows(40))
    placed = []
    for name, source in (("small", small), ("grown", grown)):
        export(source.location, export_settings("files", tmp_path / f"{name}-files", splits=SHARES), CLUSTER)
        with open(tmp_path / f"{name}-files" / "files.csv", newline="", encoding="utf-8") as f:
            placed.append({r[S.ID]: r["split"] for r in csv.DictReader(f)})
    assert all(placed[1][row_id] == split for row_id, split in placed[0].items())


@pytest.mark.parametrize(
    "keys, message",
    [
        ({"splits": {"train": 0.9, "test": 0.2}}, "export.splits must name splits"),
        ({"splits": {"train-a": 1.0}}, "export.splits must name splits"),
        ({"columns": ["id", "nope"]}, r"export.columns: \['nope'\] are not output columns"),
    ],
)
def test_bad_columns_and_splits_are_named(keys, message):
    from actors.errors import ConfigError

    with pytest.raises(ConfigError, match=message):
        export_settings("hf", None, **keys)


def test_the_lhotse_tar_is_the_flac_bytes_and_their_placeholder(source, tmp_path):
    dest, _ = exported(source, tmp_path, "lhotse")
    shard = next(Path(dest / "train").glob("recording.*.tar"))
    with tarfile.open(shard) as tar:
        members = tar.getmembers()
        first = tar.extractfile(members[0]).read()
        manifest = json.loads(tar.extractfile(members[1]).read())
    assert members[0].name.endswith(".flac") and members[1].name == members[0].name.replace(".flac", ".json")
    assert first == ROWS[members[0].name[: -len(".flac")]][S.AUDIO][S.AUDIO_BYTES]
    assert manifest["sources"] == [{"type": "shar", "channels": [0], "source": ""}]


@pytest.mark.parametrize("channels", [1, 2])
def test_the_recording_placeholder_is_lhotses_own(channels):
    """Read from the FLAC header alone, it equals what lhotse's to_shar_placeholder makes of
    Recording.from_bytes (which SharWriter stores)."""
    import numpy as np
    from lhotse import Recording
    from lhotse.shar.utils import to_shar_placeholder

    from pipeline.export.lhotse_shar import _placeholder

    buffer = io.BytesIO()
    sf.write(buffer, (np.random.default_rng(0).standard_normal((12345, channels)) * 0.1), 44100, format="FLAC")
    data = buffer.getvalue()
    theirs = to_shar_placeholder(Recording.from_bytes(data, recording_id="k"))
    assert _placeholder("k", data).to_dict() == theirs.to_dict()
