"""The dialogue benchmark (bench=dialogue): its two workloads are the same texts, as dialogue rows
and as single-voice rows; end to end, each configuration runs both and compares them."""

import json
import math

import pyarrow.parquet as pq
import pytest

from actors import schema as S
from helpers import run_module
from pipeline.bench.workload import make_workload


def test_the_single_voice_workload_is_the_dialogues_texts_with_their_first_voice(tmp_path):
    args = (40, 6.0, 0.5, 3, 0.0, 3000, 0.5)
    make_workload(tmp_path / "d.parquet", *args)
    make_workload(tmp_path / "s.parquet", *args, single_voice=True)
    dialogue, single = (pq.read_table(tmp_path / f"{n}.parquet").to_pylist() for n in "ds")
    talks = [r for r in dialogue if r[S.VOICES]]
    assert 10 <= len(talks) <= 30 and [r[S.TEXT] for r in dialogue] == [r[S.TEXT] for r in single]
    for d, s in zip(dialogue, single):
        if not d[S.VOICES]:
            assert d == s  # the plain rows are the very same
            continue
        assert 2 <= len(d[S.VOICES]) <= 3 and d[S.REF_AUDIO] is None and s[S.VOICES] is None
        assert s[S.REF_AUDIO] == d[S.VOICES][0][S.VOICE_AUDIO] and s[S.REF_TEXT] == d[S.VOICES][0][S.VOICE_TEXT]
        assert d[S.TEXT].startswith("<|speaker:") and 2 <= d[S.TEXT].count("<|speaker:") <= 4
    # without dialogues the table is what it always was: the same rows for the same seed
    make_workload(tmp_path / "plain.parquet", *args[:-1])
    plain = pq.read_table(tmp_path / "plain.parquet").to_pylist()
    assert all(r[S.VOICES] is None for r in plain) and len(plain) == 40


@pytest.mark.slow
def test_bench_dialogue_end_to_end(tmp_path):
    out = tmp_path / "bench"
    proc = run_module(
        "pipeline.bench", "bench=dialogue", "model=demo_s2", "bench.rows=10", "bench.slots=[4]", f"output.dir={out}"
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    configs = json.loads((out / "bench.json").read_text())["configs"]
    assert [(c["rows_as"], c["slots"]) for c in configs] == [("dialogue", 4), ("single_voice", 4)]
    dialogue, single = configs
    for rows_as, c in (("dialogue", dialogue), ("single_voice", single)):
        rows = pq.read_table(f"{c['output']}/data", columns=[S.ID, S.STATUS, S.TEXT, S.TURNS]).to_pylist()
        assert len(rows) == c["rows"] == 10 and all(r[S.STATUS] == S.STATUS_OK for r in rows)
        turns = [len(r[S.TURNS]) for r in rows]
        assert all(n >= 2 for n in turns) if rows_as == "dialogue" else all(n == 1 for n in turns)
    for key in ("frames_per_s", "rows_per_s"):
        assert math.isclose(dialogue["vs_single_voice"][key], dialogue[key] / single[key])
    assert "| 1 (dialogue) | 4 |" in (out / "bench.md").read_text()
