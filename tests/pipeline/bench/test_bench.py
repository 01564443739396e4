"""`python -m pipeline.bench bench=smoke`: every figure present, and the figures agree with the
rows actually written."""

import json
import math
import time

import pyarrow.parquet as pq
import pytest

from actors import schema as S
from helpers import run_module

FIGURES = [
    "rows_per_s",
    "frames_per_s",
    "audio_s_per_wall_s",
    "latency_ms_p50",
    "latency_ms_p95",
    "latency_ms_p99",
    "time_to_first_row_s",
    "actor_utilisation",
    "engine_busy",
    "slot_occupancy",
    "vs_engine_only",
    "vs_engine_only_whole_run",
    "frames_per_s_serving",
    "model_busy_s",
    "peak_rss_mb_per_actor",
    "kv_bytes",
    "vs_one_row_loop",
    "overhead_fraction",
    "overhead_fraction_after_startup",
    "actor_startup_s",
    "run_end_s",
    "actor_init_s",
    "pipeline_overhead_fraction",
    "wall_s",
    "frames",
    "audio_seconds",
    "report_s",
]


@pytest.mark.slow
def test_bench_smoke_end_to_end(tmp_path):
    out = tmp_path / "bench"
    t0 = time.monotonic()
    proc = run_module("pipeline.bench", "bench=smoke", f"output.dir={out}", timeout=300)
    elapsed = time.monotonic() - t0
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert elapsed < 240  # the smoke benchmark is meant for < 2 minutes on this machine
    report = json.loads((out / "bench.json").read_text())
    configs = report["configs"]
    assert [(c["num_actors"], c["slots"]) for c in configs] == [(1, 1), (1, 8)]
    for c in configs:
        for name in FIGURES:
            assert c[name] is not None and not (isinstance(c[name], float) and math.isnan(c[name])), name
        assert set(c["split_s"]) == {"prep", "engine", "codec", "checks", "write", "other"}
        assert all(v >= 0 for v in c["split_s"].values())
        host = c["host_s_per_audio_s"]  # host seconds per audio second, by stage, and their sum
        assert set(host) == {"prep", "codec", "checks", "flac_and_rows", "parquet_write", "total"}
        assert all(v >= 0 for v in host.values()) and host["total"] == pytest.approx(sum(host.values()) - host["total"])
        assert host["checks"] > 0 and host["codec"] > 0  # every row is measured and decoded
        # internal consistency with the rows on disk
        rows = pq.read_table(
            f"{c['output']}/data", columns=[S.STATUS, S.N_FRAMES, S.AUDIO_SECONDS, S.TOTAL_MS, S.BATCH]
        ).to_pylist()
        ok = [r for r in rows if r[S.STATUS] == S.STATUS_OK]
        assert len(rows) == c["rows"] == 24
        assert sum(r[S.N_FRAMES] for r in ok) == c["frames"]
        assert math.isclose(sum(r[S.AUDIO_SECONDS] for r in ok), c["audio_seconds"], rel_tol=1e-9)
        assert math.isclose(c["frames_per_s"], c["frames"] / c["wall_s"], rel_tol=1e-9)
        assert math.isclose(c["rows_per_s"], c["rows"] / c["wall_s"], rel_tol=1e-9)
        assert math.isclose(c["audio_s_per_wall_s"], c["audio_seconds"] / c["wall_s"], rel_tol=1e-9)
        assert c["latency_ms_p50"] <= c["latency_ms_p95"] <= c["latency_ms_p99"] <= max(r[S.TOTAL_MS] for r in ok)
        assert 0 < c["actor_utilisation"] <= 1 and 0 <= c["overhead_fraction"] < 1
        assert 0 < c["slot_occupancy"] <= 1 and c["engine_busy"] == c["actor_utilisation"]
        # the engine-only pass generates the very same rows: the same frames, in less time
        assert c["engine_only"]["frames"] == c["frames"] and c["engine_only"]["rows"] == c["rows_ok"]
        # compared over the serving time (the engine-only pass starts no process, loads nothing):
        # the first actor call to the last block's part written; the run's end (packing parts
        # into shards, summary.json) comes after it, once per job
        assert 0 < c["run_end_s"] < c["wall_s"] - c["actor_startup_s"]
        summary = json.loads((tmp_path / "bench" / "runs" / f"a1-s{c['slots']}" / "summary.json").read_text())
        finished = pq.read_table(f"{c['output']}/data", columns=[S.FINISHED_AT]).column(S.FINISHED_AT)
        assert max(finished.to_pylist()) <= summary["last_block_at"] <= time.time()
        serving_s = c["wall_s"] - c["actor_startup_s"] - c["run_end_s"]
        assert math.isclose(c["frames_per_s_serving"], c["frames"] / serving_s, rel_tol=1e-9)
        assert math.isclose(c["vs_engine_only"], c["frames_per_s_serving"] / c["engine_only"]["frames_per_s"])
        assert math.isclose(c["vs_engine_only_whole_run"], c["frames_per_s"] / c["engine_only"]["frames_per_s"])
        assert 0 < c["vs_engine_only_whole_run"] < c["vs_engine_only"]
        assert c["vs_engine_only_whole_run"] < 1
        # engine and codec overlap: their union is at least either one and at most their sum
        engine_s, codec_s = c["split_s"]["engine"], c["split_s"]["codec"]
        assert max(engine_s, codec_s) * 0.999 <= c["model_busy_s"] <= (engine_s + codec_s) * 1.001 + 0.05
        assert math.isclose(c["overhead_fraction"], max(0.0, 1 - c["model_busy_s"] / c["wall_s"]))
        assert math.isclose(sum(c["split_s"].values()), c["wall_s"], rel_tol=1e-6) or c["split_s"]["other"] == 0
        assert c["split_s"]["engine"] > 0 and c["split_s"]["codec"] > 0
        assert 0 < c["actor_init_s"] < c["actor_startup_s"] < c["time_to_first_row_s"] < c["wall_s"]
        assert c["pipeline_overhead_fraction"] <= c["overhead_fraction"]
        assert c["report_s"] > 0 and (tmp_path / "bench" / "runs" / f"a1-s{c['slots']}" / "report.html").is_file()
    # the ratio is measured against the 1-slot loop of the same run, and KV grows with slots
    assert configs[0]["vs_one_row_loop"] == 1.0
    assert math.isclose(configs[1]["vs_one_row_loop"], configs[1]["frames_per_s"] / configs[0]["frames_per_s"])
    assert configs[1]["kv_bytes"] == 8 * configs[0]["kv_bytes"]
    table = (out / "bench.md").read_text()
    assert table.count("\n") == 4 and "| 1 | 8 |" in table and "vs engine only" in table
    page = (out / "report.html").read_text()
    assert "<svg" in page and "<audio" in page and "chorus bench" in page
