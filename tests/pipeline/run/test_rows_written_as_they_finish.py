"""No head-of-line blocking (issue 57): short rows that share a block with a long row are in the
output, as a crash-safe part of their own, while the long row is still being generated; the
long row follows in a part of its own; each id ends on disk once. Watched from outside, as a
user (or a crash) would see the output: the live files polled while the run goes on."""

from __future__ import annotations

from collections import Counter

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from actors import schema as S
from pipeline.config import compose_typed
from pipeline.output.layout import OutputLayout
from pipeline.run.steps import run
from tests.helpers import watching_output

pytestmark = pytest.mark.slow

SENTENCE = "The long row goes on and on, one clause after another, until the very end. "


def test_short_rows_are_written_before_the_long_row_of_their_block_finishes(ray_cluster, tmp_path, small_settings):
    texts = {"long": SENTENCE * 12, "short-1": "Hello there.", "short-2": "A second short one."}
    pq.write_table(pa.table({S.ID: list(texts), S.TEXT: list(texts.values())}), tmp_path / "in.parquet")
    output = str(tmp_path / "out")
    settings = [
        *small_settings,
        f"data.path={tmp_path}/in.parquet",
        f"output.dir={output}",
        "cluster.rows_per_block=3",  # one block holds all three
        "output.write_within_s=0.5",
    ]
    with watching_output(output) as seen:
        done = run(compose_typed(settings))
    rows = {r[S.ID]: r for r in OutputLayout(output).read([S.ID, S.STATUS, S.FINISHED_AT, S.BATCH]).to_pylist()}
    assert all(r[S.STATUS] == S.STATUS_OK for r in rows.values()) and done.summary["run_rows"] == 3
    held = Counter(r[S.ID] for r in OutputLayout(output).read([S.ID], latest_only=False).to_pylist())
    assert held == Counter(list(texts))  # each id once
    long_done = rows["long"][S.FINISHED_AT]
    assert long_done - max(rows[i][S.FINISHED_AT] for i in ("short-1", "short-2")) > 3  # it is long
    for short in ("short-1", "short-2"):
        # on disk, readable, while the long row was still being generated
        assert seen[short] < long_done - 2, (seen, long_done)
    assert seen["long"] >= long_done
    # the short rows and the long row went in separate parts of one block: each part its share
    assert rows["long"][S.BATCH][S.BATCH_ID] != rows["short-1"][S.BATCH][S.BATCH_ID]
    assert rows["long"][S.BATCH][S.BATCH_ROWS] == 1
