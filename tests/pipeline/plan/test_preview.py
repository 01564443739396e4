"""`python -m pipeline.preview` and scripts/make_scale_input.py: a corpus-shaped input's planted
bad rows counted exactly by both plans (in-process and distributed), an output's done /
changed / retry rows, the bench-based hour estimate, and nothing written into the output."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pyarrow.compute as pc
import pytest

from actors import schema as S
from pipeline.config import compose_typed
from pipeline.output.layout import OutputLayout
from pipeline.preview import preview
from tests.helpers import REPO, decide_rows

PLANS = pytest.mark.parametrize("distributed", [False, True], ids=["in-process", "distributed"])


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    out = tmp_path_factory.mktemp("corpus")
    done = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "make_scale_input.py"), "3000", str(out), "--files", "3"],
        capture_output=True,
        text=True,
        check=True,
    )
    expected = json.loads(done.stdout.strip().splitlines()[-1])
    assert expected == json.loads((out / "expected.json").read_text())
    return out, expected


def last_json(capsys) -> dict:
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


@PLANS
def test_preview_counts_the_planted_rows_exactly(corpus, tmp_path, capsys, distributed, request):
    if distributed:
        request.getfixturevalue("ray_cluster")
    data, expected = corpus
    assert len(list(data.glob("part-*.parquet"))) == 3
    figures = preview(
        compose_typed(
            [
                f"data.path={data}",
                f"output.dir={tmp_path}/out",
                f"cluster.distributed_plan_rows={0 if distributed else 10**6}",
            ]
        )
    )
    assert last_json(capsys) == figures
    assert figures["rows_total"] == expected["rows_total"] == 3000
    assert figures["rejected"] == expected["rejected"]
    assert figures["to_synthesize"] == expected["to_synthesize"]
    assert figures["done"] == figures["changed"] == figures["retry"] == 0
    assert figures["text_chars"] > 0 and figures["estimated_frames"] > figures["to_synthesize"]
    assert figures["estimated_hours"] is None
    assert not (tmp_path / "out").exists()  # a preview writes nothing


@PLANS
def test_preview_of_a_partly_done_output(corpus, tmp_path, capsys, distributed, request):
    if distributed:
        request.getfixturevalue("ray_cluster")
    data, expected = corpus
    from pipeline.plan.identity import model_fingerprint, settings_digest

    config = compose_typed([f"data.path={data}"])
    digest = settings_digest(config, model_fingerprint(config.model))
    decided = decide_rows(data, settings=digest)
    accepted = decided.filter(pc.not_equal(decided.column("_decision"), "rejected"))
    ids, hashes = accepted.column(S.ID).to_pylist()[:100], accepted.column(S.CONTENT_HASH).to_pylist()[:100]
    rows = [{S.ID: i, S.STATUS: S.STATUS_OK, S.CONTENT_HASH: h, S.RUN: "r1"} for i, h in zip(ids[:90], hashes)]
    rows += [{S.ID: i, S.STATUS: S.STATUS_OK, S.CONTENT_HASH: "old", S.RUN: "r1"} for i in ids[90:95]]
    rows += [
        {S.ID: i, S.STATUS: S.STATUS_ERROR, S.RETRYABLE: True, S.CONTENT_HASH: h, S.RUN: "r1"}
        for i, h in zip(ids[95:], hashes[95:])
    ]
    layout = OutputLayout(str(tmp_path / "out"))
    layout.claim({"input": "an earlier run's"}, overwrite=False)
    layout.write_part(S.output_table(rows), "part-earlier.parquet")
    before = sorted(os.listdir(tmp_path / "out" / "data"))
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps({"configs": [{"num_actors": 1, "slots": 8, "frames_per_s": 50.0}]}))
    overrides = [f"data.path={data}", f"output.dir={tmp_path}/out", f"preview.bench={bench}"]
    figures = preview(compose_typed([*overrides, f"cluster.distributed_plan_rows={0 if distributed else 10**6}"]))
    assert last_json(capsys) == figures
    assert (figures["done"], figures["changed"], figures["retry"]) == (90, 5, 5)
    assert figures["to_synthesize"] == expected["to_synthesize"] - 90
    assert figures["estimated_hours"] == pytest.approx(figures["estimated_frames"] / 50.0 / 3600.0)
    assert sorted(os.listdir(tmp_path / "out" / "data")) == before
    assert sorted(os.listdir(tmp_path / "out")) == ["_chorus.json", "data"]


LONG = (
    "The committee met on a grey morning to settle the budget for the coming year. Nobody expected "
    "the debate to last past noon, yet by three o'clock the chairwoman was still calling for order, "
    "and the motion, amended twice, had grown to a page and a half. 会议一直开到深夜，大家都累了。 "
)


@pytest.mark.slow
@pytest.mark.parametrize("model", ["demo", "demo_s2"])
def test_previews_frames_are_the_demo_runs_for_long_rows(ray_cluster, tmp_path, small_settings, capsys, model):
    """Issue 57: preview plans long rows as the run does (segments and their budgets), so for
    the demo, whose every segment runs to its budget with EOS off, its frame estimate is the
    run's frame count exactly, row by row summed: long rows of several segments (English and
    Chinese), a dialogue-free short row, and a row with its own max_frames."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pipeline.run.steps import run

    texts = [LONG * 3, "Short one.", LONG, "短句。", LONG * 2]
    table = pa.table(
        {
            S.ID: [f"r{k}" for k in range(len(texts))],
            S.TEXT: texts,
            S.MAX_FRAMES: pa.array([None, None, None, 9, None], pa.int64()),
        }
    )
    pq.write_table(table, tmp_path / "long.parquet")
    overrides = [*small_settings, f"model={model}", f"data.path={tmp_path}/long.parquet", f"output.dir={tmp_path}/out"]
    figures = preview(compose_typed(overrides))
    assert figures["estimated_from"] == "budgets" and figures["segments"] > len(texts) + 5
    done = run(compose_typed(overrides))
    rows = OutputLayout(f"{tmp_path}/out").read([S.ID, S.STATUS, S.N_FRAMES, S.SEGMENTS]).to_pylist()
    assert all(r[S.STATUS] == S.STATUS_OK for r in rows) and done.summary["run_rows"] == len(texts)
    assert figures["estimated_frames"] == figures["budget_frames"] == sum(r[S.N_FRAMES] for r in rows)
    assert figures["segments"] == sum(r[S.SEGMENTS] for r in rows)
    assert figures["estimated_audio_hours"] == pytest.approx(done.summary["audio_hours"], rel=1e-6)
