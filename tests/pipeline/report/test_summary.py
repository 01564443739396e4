"""summary.json both ways (pipeline/summary.py): in-process and exact, and from per-file
partials merged on the driver (pipeline/summary_parts.py), on one output of real Parquet
files -- counts and sums the same, percentiles within the sketch's bound -- and the sketch
(pipeline/sketch.py) against numpy's percentiles."""

from __future__ import annotations

import numpy as np
import pytest

from actors import schema as S
from actors.quality.settings import FLAGS
from helpers import assert_same_summary
from pipeline.names import REJECTED_PART
from pipeline.output import shards
from pipeline.output.layout import OutputLayout
from pipeline.output.parts import write_block
from pipeline.report.sketch import DESCRIPTION, RELATIVE_ERROR, LogHistogram
from pipeline.report.summary import summary_of
from pipeline.report.summary_figures import EXACT, SUMMARY_COLUMNS

OLD, NEW = "20260101-000000-aaaaaa", "20260102-000000-bbbbbb"
MESSAGES = ["engine: out of slots", "codec failed " + "y" * 200, "codec failed " + "y" * 150 + "z" * 60, "short"]


def random_rows(rng: np.random.Generator, start: int, n: int, run: str, actor: str, batch: str) -> list[dict]:
    rows = []
    for k in range(start, start + n):
        status = rng.choice([S.STATUS_OK] * 6 + [S.STATUS_ERROR, S.STATUS_REJECTED])
        flags = [f for f in FLAGS if rng.random() < 0.15]
        row = {
            S.ID: f"u{k:05d}",
            S.STATUS: status,
            S.ERROR: rng.choice(MESSAGES + [None]) if status == S.STATUS_ERROR else None,
            S.AUDIO_SECONDS: float(rng.uniform(0.5, 9.0)),
            S.N_FRAMES: int(rng.integers(5, 400)),
            S.RTF: float(rng.lognormal(-2.0, 0.8)),
            S.TOTAL_MS: float(rng.uniform(50, 5000)),
            S.ACTOR: actor,
            S.NODE: f"node-{actor}",
            S.DEVICE: "cpu",
            S.RUN: run,
            S.FINISHED_AT: 1000.0 + k,
            S.ATTEMPTS: int(rng.integers(1, 4)),
            S.QUALITY_FLAGS: flags,
            S.DISCARDED_FRAMES: int(rng.integers(0, 30)),
            # every shape a metric takes: zeros, negatives, NaN, nulls, spread over decades
            S.SILENCE_RATIO: float(rng.choice([0.0, rng.uniform(0, 0.4)])),
            S.LOUDNESS_LUFS: float(rng.normal(-23.0, 4.0)) if rng.random() < 0.9 else None,
            S.REPEAT_RATIO: float("nan") if rng.random() < 0.05 else float(rng.exponential(0.05)),
            S.SPEECH_RATE_S_PER_CHAR: float(rng.lognormal(-2.5, 1.5)),
        }
        row[S.BATCH] = {
            S.BATCH_ID: batch,
            S.BATCH_ROWS: n,
            S.BATCH_ENGINE_MS: float(rng.uniform(100, 900)),
            S.BATCH_ENGINE_STEPS: float(rng.uniform(10, 60)),
            S.BATCH_SLOT_ROWS: float(rng.uniform(50, 500)),
            S.BATCH_SLOTS: 16,
        }
        rows.append(row)
    return rows


@pytest.fixture(scope="module")
def rich_output(tmp_path_factory) -> OutputLayout:
    """~1,700 rows of two runs and three actors: shards and parts, one block per batch, and
    the driver's rejected part with a message per row."""
    rng = np.random.default_rng(7)
    layout = OutputLayout(str(tmp_path_factory.mktemp("summary") / "out"))
    layout.claim({"input": "rich"}, overwrite=False, run_id=NEW)
    start = 0
    for block in range(40):
        run = OLD if block < 15 else NEW
        actor = ("a", "b", "c")[block % 3] if run == NEW else "old-actor"
        n = int(rng.integers(10, 70))
        write_block(S.output_table(random_rows(rng, start, n, run, actor, f"{run}:{block}")), layout.location, run)
        start += n
        if block in (14, 30):
            shards.compact_all(layout, run, 1 << 30, 400)
    refused = [S.error_row(f"dup{k}", f"duplicate id 'dup{k}' (in.parquet row {k})", **{S.RUN: NEW}) for k in range(30)]
    layout.write_part(S.output_table(refused), REJECTED_PART, owner=NEW)
    return layout


@pytest.mark.parametrize("driver_merge_groups", [None, 0], ids=["errors-merged-here", "errors-shuffled"])
def test_both_ways_agree(ray_cluster, rich_output, driver_merge_groups):
    extra = {"output": rich_output.location}
    exact = summary_of(rich_output, NEW, 12.5, extra, distributed=False)
    sketched = summary_of(
        rich_output, NEW, 12.5, extra, distributed=True, driver_merge_groups=driver_merge_groups, merge_batch=3
    )
    assert exact["percentiles"] == EXACT and sketched["percentiles"] == DESCRIPTION
    assert_same_summary(exact, sketched, rich_output.read(SUMMARY_COLUMNS), NEW)
    assert len(exact["per_actor"]) == 3 and exact["rows_total"] > 1500 and exact["run_rows"] < exact["rows_total"]
    assert exact["top_errors"][0]["rows"] > 1 and len(exact["top_errors"]) == 10
    assert exact["quality"]["metrics"][S.LOUDNESS_LUFS]["p5"] < 0


def test_an_output_without_files(ray_cluster, tmp_path):
    layout = OutputLayout(str(tmp_path / "empty"))
    layout.claim({"input": "none"}, overwrite=False)
    exact = summary_of(layout, NEW, 1.0, {}, distributed=False)
    sketched = summary_of(layout, NEW, 1.0, {}, distributed=True)
    assert_same_summary(exact, sketched, layout.read(SUMMARY_COLUMNS), NEW)
    assert sketched["rows_total"] == 0 and sketched["per_actor"] == {} and sketched["top_errors"] == []


@pytest.mark.parametrize("shape", ["lognormal", "signed", "zeros", "one", "decades"])
def test_the_sketch_keeps_its_bound(shape):
    rng = np.random.default_rng(3)
    values = {
        "lognormal": rng.lognormal(0.0, 2.0, 20_000),
        "signed": rng.normal(-5.0, 20.0, 20_000),
        "zeros": np.concatenate([np.zeros(5000), rng.uniform(0, 1, 300)]),
        "one": np.array([42.0]),
        "decades": 10.0 ** rng.uniform(-9, 9, 20_000),
    }[shape]
    halves = np.array_split(values, 7)  # merged from parts, in no particular order
    sketch = LogHistogram()
    for part in halves[::-1]:
        sketch.merge(LogHistogram().add(part))
    assert sketch.count == len(values)
    qs = [0, 1, 5, 25, 50, 75, 95, 99, 100]
    ordered = np.sort(values)
    for q, got in zip(qs, sketch.percentiles(qs)):
        h = q / 100 * (len(values) - 1)
        lo, hi = ordered[int(np.floor(h))], ordered[int(np.ceil(h))]
        assert abs(got - np.percentile(values, q)) <= RELATIVE_ERROR * max(abs(lo), abs(hi)) + 1e-12, q
    assert LogHistogram().add([float("nan"), float("inf")]).percentiles([50]) == [None]
