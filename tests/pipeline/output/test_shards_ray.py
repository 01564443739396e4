"""A real run ends in shards: compaction while the job runs (Ray tasks) and at its end."""

from __future__ import annotations

import json
import math
from collections import Counter

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from actors import schema as S
from pipeline.config import compose_typed
from pipeline.names import DATA_DIR, is_shard
from pipeline.output import hf_features
from pipeline.output.layout import OutputLayout
from pipeline.run.steps import run
from tests.helpers import REPO

pytestmark = pytest.mark.slow

DEMO_TABLE = REPO / "data" / "demo" / "demo.parquet"
COPIES, BLOCK_ROWS, SHARD_ROWS = 7, 6, 36


def test_a_run_ends_in_shards_each_id_once(ray_cluster, demo_table, tmp_path, small_settings, read_rows):
    ids = [f"{i}/copy{k}" for k in range(COPIES) for i in demo_table.column(S.ID).to_pylist()]
    rows = demo_table.num_rows
    copies = [demo_table.set_column(0, S.ID, pa.array(ids[k * rows : (k + 1) * rows])) for k in range(COPIES)]
    source = tmp_path / "corpus.parquet"
    pq.write_table(pa.concat_tables(copies), source)
    out = tmp_path / "out"
    report = run(
        compose_typed(
            [
                *small_settings,
                f"data.path={source}",
                f"data.audio_root={DEMO_TABLE.parent}",
                f"output.dir={out}",
                f"cluster.rows_per_block={BLOCK_ROWS}",
                f"output.shard_rows={SHARD_ROWS}",
            ]
        )
    )
    names = sorted(p.name for p in (out / DATA_DIR).iterdir())
    assert all(is_shard(n) for n in names), names  # no part, no temp file left
    assert len(names) == math.ceil(len(ids) / SHARD_ROWS)
    sizes = [pq.read_metadata(out / DATA_DIR / n).num_rows for n in names]
    assert max(sizes) <= SHARD_ROWS and sum(sizes) == len(ids)
    # most shards were packed while blocks were still being synthesized, the rest at the end
    assert report.summary["shards_while_running"] >= len(names) - 2 and report.summary["shard_failures"] == 0
    counts = Counter(r[S.ID] for r in read_rows(out))
    assert sorted(counts) == sorted(ids) and max(counts.values()) == 1
    assert OutputLayout(str(out)).live_files() == [str(out / DATA_DIR / n) for n in names]
    for name in names:
        features = json.loads(pq.read_schema(out / DATA_DIR / name).metadata[hf_features.METADATA_KEY])
        assert features["info"]["features"][S.AUDIO] == {"sampling_rate": 44100, "decode": True, "_type": "Audio"}
    assert report.summary["rows_total"] == len(ids)
