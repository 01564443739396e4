"""The input, without Ray: its columns and types checked before any work, the forms its path
takes, what discovery skips (what Spark and notebooks leave; issue 14, finding 7),
dictionary-encoded columns, and no output inside the input directory."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from actors import schema as S
from pipeline.config import compose_typed
from pipeline.errors import InputError, InputSchemaError
from pipeline.plan.inputs import scan_input
from pipeline.run.steps import run
from tests.helpers import decide_rows


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
    with pytest.raises(InputSchemaError, match="required column 'text' is missing"):
        run(compose_typed([f"data.path={path}", f"output.dir={tmp_path}/out"]))
    assert not (tmp_path / "out").exists()


def test_renamed_columns_and_wrong_types_are_named(tmp_path):
    path = write(tmp_path, pa.table({"utt": ["a"], "sentence": ["x"], "seed": [[1]]}))
    with pytest.raises(InputSchemaError) as info:
        scan_input(str(path), {"id": "utt", "text": "sentence"})
    assert "column 'seed' has type list<element: int64>, expected integer" in str(info.value)
    path = write(tmp_path, pa.table({"utt": ["a"], "sentence": ["x"]}))
    scan = scan_input(str(path), {"id": "utt", "text": "sentence"})
    assert scan.rename == {"utt": "id", "sentence": "text"}
    with pytest.raises(InputSchemaError, match=r"'utt' \(data.columns.id\) is missing"):
        scan_input(str(write(tmp_path, pa.table({"id": ["a"], "text": ["x"]}))), {"id": "utt"})


def test_a_voices_column_takes_any_of_its_fields_each_of_its_type(tmp_path):
    def voices_of(*fields) -> pa.Table:
        voice = pa.struct(list(fields))
        return pa.table({"id": ["a"], "text": ["x"], "voices": pa.array([None], pa.list_(voice))})

    talk = voices_of(("audio_path", pa.string()), ("text", pa.string()))  # the fields a table has
    assert scan_input(str(write(tmp_path, talk)), {"voices": "voices"}).rename["voices"] == "voices"
    coded = voices_of(("codes", pa.list_(pa.list_(pa.int16()))), ("audio", pa.binary()))
    scan_input(str(write(tmp_path, coded, "coded.parquet")), {})
    for bad in (voices_of(("audio_path", pa.int64())), voices_of(("wav", pa.string()))):
        with pytest.raises(InputSchemaError, match="column 'voices' has type .* expected list<struct<audio: binary"):
            scan_input(str(write(tmp_path, bad, "bad.parquet")), {})


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
            run(compose_typed([f"data.path={data_path}", f"output.dir={tmp_path}/set/out"]))
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
