"""The export as Ray Data work on the session's Ray (cluster.distributed_rows=0): the demo job's
real output and the same on S3 to an S3 destination (tests/object_store.py), each format read
back by its own library; and a 200k-row output (scripts/make_scale_output.py) to WebDataset
with the driver's memory flat and the units spread over Ray's workers."""

from __future__ import annotations

import sys
import tarfile
from collections import Counter
from pathlib import Path

import pytest
from test_export_formats import READERS, decoded

from actors import schema as S
from helpers import REPO, export_cluster, export_settings
from pipeline.config import compose_typed
from pipeline.export.job import export
from pipeline.run.steps import run

pytestmark = pytest.mark.slow

DISTRIBUTED = export_cluster(0)
DEMO = REPO / "data" / "demo"


def expected_rows(location: str) -> dict:
    """id -> (frames, channels, text) of the output's ok rows, read straight from its files."""
    from pipeline.output.layout import OutputLayout

    rows = OutputLayout(location).read([S.ID, S.STATUS, S.AUDIO, S.TEXT]).to_pylist()
    ok = [r for r in rows if r[S.STATUS] == S.STATUS_OK]
    return {r[S.ID]: (*decoded(r[S.AUDIO][S.AUDIO_BYTES]), r[S.TEXT]) for r in ok}


@pytest.fixture(scope="module")
def demo_output(ray_cluster, small_settings, tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("demo") / "out"
    run(compose_typed([*small_settings, f"output.dir={out}", "cluster.rows_per_block=6"]))
    return str(out)


@pytest.mark.parametrize("fmt", ["webdataset", "lhotse", "hf"])
def test_the_demo_output_exports_as_ray_data_work(demo_output, tmp_path, fmt):
    dest = tmp_path / fmt
    report = export(demo_output, export_settings(fmt, dest, shard_rows=8), DISTRIBUTED)
    expected = expected_rows(demo_output)
    assert report.summary["units"] >= 3 and report.summary["rows"] == len(expected) > 20
    assert READERS[fmt](dest) == expected  # every ok row once, its samples, channels and text


@pytest.mark.parametrize("fmt", ["webdataset", "lhotse", "hf"])
def test_an_s3_output_exports_to_an_s3_destination(s3_store, ray_cluster, demo_output, tmp_path, fmt):
    source = f"{s3_store.bucket()}/out"
    s3_store.upload(Path(demo_output), source)
    dest = f"{s3_store.bucket()}/exports/{fmt}"
    report = export(source, export_settings(fmt, dest, shard_rows=8), DISTRIBUTED)
    assert report.summary["units"] >= 3
    again = export(source, export_settings(fmt, dest, shard_rows=8), DISTRIBUTED)
    assert again.already_done  # a rerun changes nothing
    keys = s3_store.keys(dest)
    assert not [k for k in keys if k.startswith(".chorus-staging")]
    local = tmp_path / "copy"
    s3_store.download(dest, local)  # the libraries read local paths (lhotse's in_dir, datasets without s3fs)
    assert READERS[fmt](local) == expected_rows(demo_output)


def test_a_200k_row_output_exports_to_webdataset_with_a_flat_driver(ray_cluster, tmp_path):
    sys.path.insert(0, str(REPO / "scripts"))
    from bench_export import PeakRss, rss_mb
    from make_scale_output import make

    counts = make(200_000, str(tmp_path / "out"))
    dest = tmp_path / "wds"
    before = rss_mb()
    with PeakRss() as peak:
        report = export(str(tmp_path / "out"), export_settings("webdataset", dest, shard_rows=10_000), DISTRIBUTED)
    assert peak.peak - before < 150  # MB: the driver holds one record per unit, never a row
    summary = report.summary
    assert summary["rows"] == counts[S.STATUS_OK] and summary["removed"]["status"] == 200_000 - counts[S.STATUS_OK]
    assert summary["units"] >= 20 and summary["workers"] >= 2  # spread over Ray's worker processes
    members = Counter()
    for k in range(summary["shards"]):
        with tarfile.open(dest / f"train-{k:06d}.tar") as tar:
            members.update(m.name.rsplit(".", 1)[1] for m in tar)
    assert members == {"flac": counts[S.STATUS_OK], "json": counts[S.STATUS_OK]}
