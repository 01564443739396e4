"""The Ray metrics an actor exports (`ray.util.metrics`), so that a cluster user watches the
job in Ray's dashboard and in Prometheus. Prometheus names get Ray's `ray_` prefix, and
counters a `_total` suffix: `chorus_rows` is scraped as `ray_chorus_rows_total`.

The actor calls `ActorMetrics.record_block(table)` once per finished block with the output
table it returns; every figure comes from that table (its status, frames, audio seconds and
the block's `batch` struct, which carries its share of the engine's steps), so the metrics
and the output rows never disagree.

Where Ray is not installed (the lent GPU image runs the actor without it: scripts/gpu_job.py)
the figures are still computed and returned, and nothing is exported.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import pyarrow as pa
import pyarrow.compute as pc

from actors import schema as S


@dataclass(frozen=True)
class Metric:
    name: str
    kind: str  # "counter" | "gauge"
    description: str
    tag_keys: tuple[str, ...] = ()


ROWS = Metric("chorus_rows", "counter", "Output rows finished, by status (ok / rejected / error)", ("actor", "status"))
FRAMES = Metric("chorus_frames", "counter", "Codec frames generated (ok rows)", ("actor",))
AUDIO_SECONDS = Metric("chorus_audio_seconds", "counter", "Seconds of audio synthesized (ok rows)", ("actor",))
BLOCKS = Metric("chorus_blocks", "counter", "Blocks finished", ("actor",))
SLOT_OCCUPANCY = Metric(
    "chorus_slot_occupancy",
    "gauge",
    "Mean share of the engine's slots holding a row per step, over the last finished block",
    ("actor",),
)
ENGINE_BUSY = Metric(
    "chorus_engine_busy", "gauge", "Share of the last finished block's wall time the engine was stepping", ("actor",)
)
METRICS = (ROWS, FRAMES, AUDIO_SECONDS, BLOCKS, SLOT_OCCUPANCY, ENGINE_BUSY)


def _sum(values: pa.ChunkedArray) -> float:
    return float(pc.sum(values).as_py() or 0)


def block_figures(table: pa.Table) -> dict:
    """What one finished block adds to the metrics: rows ok / rejected / error, frames and
    audio seconds of its ok rows, and its engine figures (None when no row reached the engine)."""
    status = table.column(S.STATUS)
    ok = table.filter(pc.fill_null(pc.equal(status, S.STATUS_OK), False))
    rejected = int(pc.sum(pc.fill_null(pc.equal(status, S.STATUS_REJECTED), False).cast(pa.int64())).as_py() or 0)
    batches = pc.drop_null(table.column(S.BATCH))
    batch = batches[0].as_py() if len(batches) else {}
    return {
        S.STATUS_OK: ok.num_rows,
        S.STATUS_REJECTED: rejected,
        S.STATUS_ERROR: table.num_rows - ok.num_rows - rejected,
        "frames": _sum(ok.column(S.N_FRAMES)),
        "audio_seconds": _sum(ok.column(S.AUDIO_SECONDS)),
        "slot_occupancy": batch.get(S.BATCH_SLOT_OCCUPANCY),
        "engine_busy": batch.get(S.BATCH_ENGINE_BUSY),
    }


def _ray_metrics():
    """`ray.util.metrics`, or None where Ray is not installed."""
    try:
        from ray.util import metrics
    except ImportError:
        return None
    return metrics


class ActorMetrics:
    """One actor's metrics, tagged with its name. Create it in the actor process (Ray's
    metrics record in the process that makes them); ray is imported only here, and where it
    cannot be, `exporting` is False and `record_block` only returns the figures."""

    def __init__(self, actor: str):
        metrics = _ray_metrics()
        self.actor = actor
        self._metrics = {}
        if metrics is not None:
            kinds = {"counter": metrics.Counter, "gauge": metrics.Gauge}
            self._metrics = {
                m.name: kinds[m.kind](m.name, description=m.description, tag_keys=m.tag_keys) for m in METRICS
            }
        for metric in self._metrics.values():
            metric.set_default_tags({"actor": actor})

    @property
    def exporting(self) -> bool:
        return bool(self._metrics)

    def record_block(self, table: pa.Table) -> dict:
        """Add one finished block (the output table the actor returns); returns its figures."""
        figures = block_figures(table)
        if not self.exporting:
            return figures
        rows = self._metrics[ROWS.name]
        for status in (S.STATUS_OK, S.STATUS_REJECTED, S.STATUS_ERROR):
            if figures[status]:
                rows.inc(figures[status], tags={"status": status})
        self._add(FRAMES, figures["frames"])
        self._add(AUDIO_SECONDS, figures["audio_seconds"])
        self._add(BLOCKS, 1)
        self._set(SLOT_OCCUPANCY, figures["slot_occupancy"])
        self._set(ENGINE_BUSY, figures["engine_busy"])
        return figures

    def _add(self, metric: Metric, value: float) -> None:
        if value:
            self._metrics[metric.name].inc(value)

    def _set(self, metric: Metric, value: Optional[float]) -> None:
        if value is not None:
            self._metrics[metric.name].set(value)
