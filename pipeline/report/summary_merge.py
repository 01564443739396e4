"""summary.json's figures above cluster.distributed_plan_rows (pipeline/report/summary.py): one Ray
task per live file computes that file's partial figures, and the driver merges them as they
arrive, holding one partial at a time plus the merged one (O(actors + sketch buckets), not
O(rows)).

What merges exactly: row counts, sums, per-actor sums (an actor's node and device are those
of its first row, the file earliest in reading order deciding), quality tallies, engine
figures (a batch counted once per file: a block's rows are written as one part, which
compaction and rewrites move whole). Percentiles come from pipeline/report/sketch.py's histograms
(<= 1% relative; summary.json says so). The top errors: each file's message counts stay in
the object store; when there are few kinds in all the driver merges them, otherwise a hash
shuffle by message sums each kind in one partition, whose top ten the driver merges. Ties
go to the message seen first in the exact way's reading order (file, then row).
"""

from __future__ import annotations

import math
from typing import Optional

import pyarrow as pa
import pyarrow.compute as pc

from actors import schema as S

from ..cluster import PARTITION_ROWS, TASK_CPUS
from ..names import is_rejected_part
from ..output.layout import OutputLayout
from ..output.parts import engine_figures
from ..output.reading import conform, read_file
from . import metrics
from . import quality_figures as quality
from .sketch import DESCRIPTION, LogHistogram
from .summary_figures import ACTOR_KEYS, ENGINE_KEYS, ERROR_CHARS, SUMMARY_COLUMNS, TOP_ERRORS, engines, totals

DRIVER_MERGE_GROUPS = 100_000  # error kinds (summed over files) the driver merges itself
_POSITION = 1 << 32  # a row's place in reading order: file index * _POSITION + row
MESSAGES_SCHEMA = pa.schema([("error", pa.string()), ("rows", pa.int64()), ("first", pa.int64())])


def reading_order(layout: OutputLayout) -> list[str]:
    """The live files in the order OutputLayout.read concatenates them: the rejected part last."""
    files = layout.live_files()
    return [p for p in files if not is_rejected_part(p)] + [p for p in files if is_rejected_part(p)]


def top_messages(groups: pa.Table, limit: int = TOP_ERRORS) -> pa.Table:
    """Message counts (MESSAGES_SCHEMA) summed per message, the `limit` most common, ties to
    the first seen. Any grouping of the same counts gives the same answer."""
    if not groups.num_rows:  # an empty partition may come without columns
        return MESSAGES_SCHEMA.empty_table()
    grouped = groups.group_by("error").aggregate([("rows", "sum"), ("first", "min")])
    grouped = grouped.rename_columns(["error", "rows", "first"]).select(MESSAGES_SCHEMA.names)
    return grouped.sort_by([("rows", "descending"), ("first", "ascending")]).slice(0, limit)


def _file_messages(table: pa.Table, index: int) -> pa.Table:
    errors = metrics.error_messages(table, ERROR_CHARS)
    positions = pa.array(range(index * _POSITION, index * _POSITION + errors.num_rows), pa.int64())
    counted = pa.table({"error": errors.column("error"), "rows": pa.array([1] * errors.num_rows, pa.int64())})
    return top_messages(counted.append_column("first", positions), limit=errors.num_rows)


def _metric_parts(table: pa.Table) -> dict:
    parts = {}
    for name in quality.present_metrics(table):
        values = metrics.finite(table.column(name))
        parts[name] = {"sketch": LogHistogram().add(values.to_numpy()), "sum": float(pc.sum(values).as_py() or 0.0)}
    return parts


def file_figures(location: str, path: str, index: int, run_id: str) -> tuple[dict, pa.Table]:
    """One file's partial figures, and its error messages' counts (MESSAGES_SCHEMA)."""
    table = metrics.normalise(read_file(OutputLayout(location).fs, path, SUMMARY_COLUMNS))
    this_run = metrics.run_rows(table, run_id)
    run_ok = metrics.ok_rows(this_run)
    (by_actor, engine), idle = engines(this_run), engine_figures([])
    actors = {}
    for actor, figures in metrics.per_actor(this_run).items():
        mine = metrics.ok_rows(this_run.filter(pc.fill_null(pc.equal(this_run.column(S.ACTOR), actor), False)))
        actors[actor] = {
            **{k: figures[k] for k in ACTOR_KEYS if k != "row_rtf_p50"},
            **{k: by_actor.get(actor, idle)[k] for k in ENGINE_KEYS},
            "first": index,
            "rtf": LogHistogram().add(metrics.finite(mine.column(S.RTF)).to_numpy()),
        }
    messages = _file_messages(table, index)
    return {
        **totals(table, this_run, run_ok),
        "per_actor": actors,
        "engine": {k: engine[k] for k in ENGINE_KEYS},
        "quality": quality.tallies(table),
        "metrics": _metric_parts(table),
        "error_kinds": messages.num_rows,
    }, messages


def _add(into: dict, other: dict, keys) -> None:
    for k in keys:
        into[k] = into.get(k, 0) + other.get(k, 0)


def merge(into: dict, part: dict) -> dict:
    """Add one file's partial figures into the merged ones (order does not matter)."""
    if not into:
        return part
    for key in ("whole", "run", "engine"):
        _add(into[key], part[key], part[key].keys())
    _add(into, part, ("audio_seconds", "run_audio_seconds", "run_frames", "error_kinds"))
    for actor, theirs in part["per_actor"].items():
        mine = into["per_actor"].setdefault(actor, theirs)
        if mine is theirs:
            continue
        _add(mine, theirs, ("rows", "rows_ok", "rows_error", "audio_s", "frames", *ENGINE_KEYS))
        mine["rtf"].merge(theirs["rtf"])
        if theirs["first"] < mine["first"]:
            mine.update(first=theirs["first"], node=theirs["node"], device=theirs["device"])
    quality.merge_tallies(into["quality"], part["quality"])
    for name, theirs in part["metrics"].items():
        mine = into["metrics"].setdefault(name, theirs)
        if mine is not theirs:
            mine["sketch"].merge(theirs["sketch"])
            mine["sum"] += theirs["sum"]
    return into


def _distributions(parts: dict) -> dict:
    out = {}
    for name in quality.METRIC_COLUMNS:
        if name in parts:
            sketch, n = parts[name]["sketch"], parts[name]["sketch"].count
            values = sketch.percentiles(quality.PERCENTILES)
            out[name] = dict(
                zip((f"p{q}" for q in quality.PERCENTILES), values), mean=parts[name]["sum"] / n if n else None
            )
    return out


def top_errors(message_refs: list, kinds: int, driver_merge_groups: int) -> list[dict]:
    import ray

    if not kinds:
        return []
    if kinds <= driver_merge_groups:
        top = top_messages(pa.concat_tables(ray.get(message_refs)))
    else:
        partitions = max(2, math.ceil(kinds / PARTITION_ROWS))
        by_message = ray.data.from_arrow_refs(message_refs).repartition(partitions, shuffle=True, keys=["error"])
        tops = by_message.map_batches(top_messages, batch_format="pyarrow", batch_size=None, num_cpus=TASK_CPUS)
        top = top_messages(pa.Table.from_pylist(tops.take_all(), schema=MESSAGES_SCHEMA))
    return [{"error": r["error"], "rows": r["rows"]} for r in top.to_pylist()]


def distributed_figures(
    layout: OutputLayout, run_id: str, driver_merge_groups: Optional[int] = None, merge_batch: int = 64
) -> dict:
    """summary.py's figures from a Ray task per live file, merged here as they finish (up to
    `merge_batch` partials fetched at once). `driver_merge_groups`: DRIVER_MERGE_GROUPS."""
    import ray

    task = ray.remote(num_cpus=TASK_CPUS, num_returns=2)(file_figures)
    refs = [task.remote(layout.location, path, i, run_id) for i, path in enumerate(reading_order(layout))]
    merged, pending = {}, [figures for figures, _ in refs]
    while pending:
        ready, pending = ray.wait(pending, num_returns=min(merge_batch, len(pending)))
        for part in ray.get(ready):
            merged = merge(merged, part)
    if not merged:
        merged = file_figures_of_nothing()
    limit = DRIVER_MERGE_GROUPS if driver_merge_groups is None else driver_merge_groups
    per_actor = {}
    for actor in sorted(merged["per_actor"]):
        a = merged["per_actor"][actor]
        per_actor[actor] = {**a, "rows_error": a["rows"] - a["rows_ok"], "row_rtf_p50": a["rtf"].percentiles([50])[0]}
    return {
        **{k: merged[k] for k in ("whole", "audio_seconds", "run", "run_audio_seconds", "run_frames", "engine")},
        "per_actor": per_actor,
        "top_errors": top_errors([m for _, m in refs], merged["error_kinds"], limit),
        "quality": quality.from_tallies(merged["quality"], _distributions(merged["metrics"])),
        "percentiles": DESCRIPTION,
    }


def file_figures_of_nothing() -> dict:
    """The partial figures of an output without files."""
    empty = metrics.normalise(conform(S.OUTPUT_SCHEMA.empty_table(), SUMMARY_COLUMNS))
    counted = metrics.counts(empty)
    return {
        "whole": counted,
        "audio_seconds": 0.0,
        "run": dict(counted),
        "run_audio_seconds": 0.0,
        "run_frames": 0,
        "per_actor": {},
        "engine": {k: 0.0 for k in ENGINE_KEYS},
        "quality": quality.tallies(empty),
        "metrics": {},
        "error_kinds": 0,
    }
