"""An input that grows and shrinks between runs keeps its output (issue 57): rows and files
added are the only rows synthesized, every id is on disk once and the finished rows' bytes are
untouched; rows dropped from the input are reported (the log, summary.json, removed-ids-<run>.txt)
and kept, or pruned from the shards with output.on_removed=prune. On a local output and on the
S3 test server (tests/object_store.py), planned in-process and distributed."""

from __future__ import annotations

import hashlib
import logging
from collections import Counter

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from actors import schema as S
from pipeline.config import compose_typed
from pipeline.names import REMOVED_FILE, REPORT_FILE
from pipeline.output.layout import OutputLayout
from pipeline.run.steps import run

pytestmark = pytest.mark.slow

PLANS = pytest.mark.parametrize(
    "plan",
    ["cluster.distributed_plan_rows=100000", "cluster.distributed_plan_rows=0"],
    ids=["in-process", "distributed"],
)


def rows(prefix: str, n: int) -> pa.Table:
    ids = [f"{prefix}{k}" for k in range(n)]
    return pa.table({S.ID: ids, S.TEXT: [f"Sentence number {k} of {prefix}." for k in range(n)]})


class Folder:
    """The input folder, local or in a bucket: one Parquet file per name."""

    def __init__(self, root: str, store=None, scratch=None):
        self.root, self.store, self.scratch = root.rstrip("/"), store, scratch

    def write(self, name: str, table: pa.Table) -> None:
        if self.store is None:
            pq.write_table(table, f"{self.root}/{name}")
            return
        local = self.scratch / name
        pq.write_table(table, local)
        self.store.upload(local, f"{self.root}/{name}")

    def remove(self, name: str) -> None:
        if self.store is None:
            import os

            os.remove(f"{self.root}/{name}")
            return
        bucket, key = self.store.split(f"{self.root}/{name}")
        self.store.client.delete_object(Bucket=bucket, Key=key)


def on_disk(output: str) -> dict[str, dict]:
    """Every row the output's files hold, by id; an id held twice fails."""
    held = OutputLayout(output).read([S.ID, S.RUN, S.STATUS, S.AUDIO], latest_only=False).to_pylist()
    counts = Counter(r[S.ID] for r in held)
    assert max(counts.values()) == 1, [i for i, n in counts.items() if n > 1]
    return {r[S.ID]: r for r in held}


def file_digests(output: str) -> dict[str, str]:
    layout = OutputLayout(output)
    out = {}
    for path in layout.live_files():
        with layout.fs.open_input_stream(path) as f:
            out[path] = hashlib.blake2b(f.read(), digest_size=16).hexdigest()
    return out


def grow_and_shrink(folder: Folder, output: str, settings: list[str], caplog) -> None:
    """The scenario both outputs run: a file, then rows and a second file added, then rows
    and the second file dropped (kept), then pruned."""
    job = [*settings, f"data.path={folder.root}/", f"output.dir={output}"]
    folder.write("a.parquet", rows("a", 5))
    first = run(compose_typed(job))
    assert first.summary["run_rows"] == 5
    before, files_before = on_disk(output), file_digests(output)

    # grown: two rows appended to the file, a new file of three
    folder.write("a.parquet", pa.concat_tables([rows("a", 7)]))
    folder.write("b.parquet", rows("b", 3))
    with caplog.at_level(logging.INFO, logger="chorus"):
        grown = run(compose_typed(job))
    assert "5 to synthesize, 5 already in" in caplog.text
    assert grown.summary["run_rows"] == 5 and grown.summary["rows_total"] == 10
    now = on_disk(output)
    assert sorted(now) == sorted([f"a{k}" for k in range(7)] + ["b0", "b1", "b2"])
    assert all(r[S.STATUS] == S.STATUS_OK for r in now.values())
    for row_id, row in before.items():  # the finished rows: the same bytes, from the first run
        assert now[row_id][S.AUDIO] == row[S.AUDIO] and now[row_id][S.RUN] == first.summary["run_id"]
    new = {i for i, r in now.items() if r[S.RUN] == grown.summary["run_id"]}
    assert new == {"a5", "a6", "b0", "b1", "b2"}
    after = file_digests(output)
    assert {p: d for p, d in after.items() if p in files_before} == files_before  # not a byte rewritten

    # shrunk: the second file and two rows gone; the default keeps them, and says so
    folder.remove("b.parquet")
    folder.write("a.parquet", rows("a", 5))
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="chorus"):
        kept = run(compose_typed(job))
    assert "5 rows of the output are in the input no more; kept" in caplog.text
    assert kept.summary["run_rows"] == 0 and kept.summary["rows_removed_from_input"] == 5
    assert kept.summary["removed_rows"] == "kept" and kept.summary["rows_total"] == 10
    assert len(on_disk(output)) == 10
    assert "rows gone from the input (kept)" in OutputLayout(output).read_text(REPORT_FILE)
    listed = OutputLayout(output).read_text(REMOVED_FILE.format(run=kept.summary["run_id"]))
    assert sorted(listed.split()) == ["a5", "a6", "b0", "b1", "b2"]

    pruned = run(compose_typed([*job, "output.on_removed=prune"]))
    assert pruned.summary["run_rows"] == 0 and pruned.summary["rows_removed_from_input"] == 5
    assert pruned.summary["removed_rows"] == "pruned"
    assert pruned.summary["rows_total"] == pruned.summary["input_rows"] == 5
    final = on_disk(output)
    assert sorted(final) == [f"a{k}" for k in range(5)]
    assert all(final[i][S.AUDIO] == before[i][S.AUDIO] for i in final)

    again = run(compose_typed([*job, "output.on_removed=prune"]))  # nothing left to report
    assert again.summary["rows_removed_from_input"] == 0 and again.summary["removed_rows"] is None


@PLANS
def test_a_local_input_that_grows_and_shrinks(ray_cluster, tmp_path, small_settings, plan, caplog):
    (tmp_path / "in").mkdir()
    folder = Folder(str(tmp_path / "in"))
    grow_and_shrink(folder, str(tmp_path / "out"), [*small_settings, plan, "cluster.rows_per_block=2"], caplog)


@PLANS
def test_an_input_on_s3_that_grows_and_shrinks(ray_cluster, s3_store, tmp_path, small_settings, plan, caplog):
    bucket = s3_store.bucket()
    folder = Folder(f"{bucket}/in", s3_store, tmp_path)
    grow_and_shrink(folder, f"{bucket}/out", [*small_settings, plan, "cluster.rows_per_block=2"], caplog)


def test_the_plans_log_counts_refused_rows_apart(ray_cluster, tmp_path, small_settings, caplog):
    """A fresh output, two of three rows sharing an id: one to synthesize, none already in, two
    refused (issue 57: it said "1 to synthesize, 2 already in")."""
    table = pa.table({S.ID: ["x", "dup", "dup"], S.TEXT: ["One.", "Two.", "Three."]})
    pq.write_table(table, tmp_path / "in.parquet")
    settings = [*small_settings, f"data.path={tmp_path}/in.parquet", f"output.dir={tmp_path}/out"]
    with caplog.at_level(logging.INFO, logger="chorus"):
        run(compose_typed(settings))
    assert "1 to synthesize, 0 already in" in caplog.text and ", 2 refused" in caplog.text
