"""The figures of an output table (actors/schema.py), computed once with pyarrow compute and
`group_by`: what summary.json (summary.py), the benchmark (bench.measure) and the report
page (report.py) show. Each takes the metadata columns of the rows it describes.

Tables may come from older or foreign writers (the report reads whatever is under data/):
`normalise` gives every column read here its canonical type first, a value that cannot be
read becoming null, and a missing column a column of nulls. One percentile definition holds
everywhere: linear interpolation between the closest ranks (numpy's default)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Optional

import pyarrow as pa
import pyarrow.compute as pc

from actors import schema as S

# the columns the figures read, with the type each is read as
NUMBER_COLUMNS = (
    S.AUDIO_SECONDS,
    S.N_FRAMES,
    S.TOTAL_MS,
    S.RTF,
    S.FINISHED_AT,
    S.QUEUE_MS,
    S.PREFILL_MS,
    S.DECODE_MS,
    S.CODEC_MS,
)
TEXT_COLUMNS = (S.ID, S.STATUS, S.ERROR, S.STOP_REASON, S.ACTOR, S.NODE, S.DEVICE, S.MODEL, S.RUN, S.TEXT)
TIMING_COLUMNS = (S.QUEUE_MS, S.PREFILL_MS, S.DECODE_MS, S.CODEC_MS, S.TOTAL_MS)
OK = "__ok"  # the boolean column `normalise` adds: status == ok
# "first" means the first row's value, null or not (as a row-by-row loop would read it)
_FIRST = pc.ScalarAggregateOptions(skip_nulls=False)


# ---- reading columns ----------------------------------------------------------------------


def _as_number(column: pa.ChunkedArray) -> pa.ChunkedArray:
    """Numbers keep their type (integer sums stay integers); timestamps become unix seconds;
    anything else is parsed, a value that is not a number becoming null."""
    if pa.types.is_integer(column.type) or pa.types.is_floating(column.type):
        return column
    if pa.types.is_timestamp(column.type):
        return pc.divide(pc.cast(pc.cast(column, pa.timestamp("us")), pa.int64()), 1e6)
    try:
        return pc.cast(column, pa.float64(), safe=False)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        values = []
        for v in column.to_pylist():
            try:
                values.append(float(v))
            except (TypeError, ValueError):
                values.append(None)
        return pa.chunked_array([pa.array(values, pa.float64())])


def _as_text(column: pa.ChunkedArray) -> pa.ChunkedArray:
    if pa.types.is_string(column.type):
        return column
    try:
        return pc.cast(column, pa.string())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return pa.chunked_array([pa.array([None if v is None else str(v) for v in column.to_pylist()], pa.string())])


def normalise(table: pa.Table) -> pa.Table:
    """`table` with every column the figures read in its canonical type (missing ones null)
    and the OK column added."""
    for names, convert, empty in (
        (NUMBER_COLUMNS, _as_number, pa.float64()),
        (TEXT_COLUMNS, _as_text, pa.string()),
    ):
        for name in names:
            if name in table.column_names:
                table = table.set_column(table.column_names.index(name), name, convert(table.column(name)))
            else:
                table = table.append_column(name, pa.nulls(table.num_rows, empty))
    ok = pc.fill_null(pc.equal(table.column(S.STATUS), S.STATUS_OK), False)
    return table.append_column(OK, ok)


def ok_rows(table: pa.Table) -> pa.Table:
    return table.filter(table.column(OK))


def run_rows(table: pa.Table, run_id: str) -> pa.Table:
    return table.filter(pc.fill_null(pc.equal(table.column(S.RUN), run_id), False))


def total(table: pa.Table, name: str) -> Any:
    """Sum of a column, nulls left out (0 for none: an int for integer columns)."""
    value = pc.sum(table.column(name)).as_py()
    return value if value is not None else (0 if pa.types.is_integer(table.column(name).type) else 0.0)


def finite(values) -> pa.Array:
    """The values that are numbers: nulls and NaN/inf left out, as float64."""
    if not isinstance(values, (pa.Array, pa.ChunkedArray)):
        values = pa.array(values, pa.float64())
    values = pc.cast(values, pa.float64())
    return pc.filter(values, pc.fill_null(pc.is_finite(values), False))


def percentiles(values, qs: Sequence[float]) -> list[Optional[float]]:
    """Percentiles (0-100) of the finite values; None for each when there are none."""
    values = finite(values)
    if not len(values):
        return [None] * len(qs)
    return [float(v) for v in pc.quantile(values, q=[q / 100.0 for q in qs], interpolation="linear").to_pylist()]


def mean(values) -> Optional[float]:
    values = finite(values)
    return float(pc.mean(values).as_py()) if len(values) else None


def rate(amount: float, seconds: Optional[float]) -> Optional[float]:
    return amount / seconds if seconds else None


# ---- the figures --------------------------------------------------------------------------


def _rejected(table: pa.Table) -> pa.ChunkedArray:
    return pc.fill_null(pc.equal(table.column(S.STATUS), S.STATUS_REJECTED), False)


def counts(table: pa.Table) -> dict:
    """Rows, and how many are ok, rejected by the quality gate (audio kept, not an error) and
    errors (everything else)."""
    ok = int(pc.sum(table.column(OK)).as_py() or 0)
    rejected = int(pc.sum(_rejected(table)).as_py() or 0)
    return {
        "rows": table.num_rows,
        "rows_ok": ok,
        "rows_error": table.num_rows - ok - rejected,
        "rows_rejected": rejected,
    }


def error_messages(table: pa.Table, max_chars: Optional[int] = None, name_missing: bool = False) -> pa.Table:
    """The error rows as (error, id), each message as error_kinds counts it: a null message
    reads as "" (or, name_missing, as a note with the row's status), cut to `max_chars`."""
    errors = table.filter(pc.invert(pc.or_(table.column(OK), _rejected(table))))
    messages = errors.column(S.ERROR)
    if name_missing and messages.null_count:
        statuses = errors.column(S.STATUS).to_pylist()
        messages = pa.array(
            [m if m is not None else f"(no message; status={s!r})" for m, s in zip(messages.to_pylist(), statuses)],
            pa.string(),
        )
    messages = pc.fill_null(messages, "")
    if max_chars is not None:
        messages = pc.utf8_slice_codeunits(messages, 0, max_chars)
    return pa.table({"error": messages, "id": errors.column(S.ID)})


def error_kinds(
    table: pa.Table, limit: Optional[int] = None, max_chars: Optional[int] = None, name_missing: bool = False
) -> list[dict]:
    """The error rows' messages, most common first (ties in order of first appearance):
    [{"error", "rows", "example_id"}]. A null message reads as "" (or, name_missing, as a
    note with the row's status); `max_chars` cuts messages before they are counted, so long
    messages that differ only in their tail count as one."""
    errors = error_messages(table, max_chars, name_missing)
    if not errors.num_rows:
        return []
    # the tie-break by each message's first row, spelled out: a hash group-by's output order
    # is not the order of first appearance (seen with 40 distinct messages)
    errors = errors.append_column("at", pa.array(range(errors.num_rows), pa.int64()))
    grouped = errors.group_by("error", use_threads=False).aggregate(
        [("id", "count", pc.CountOptions(mode="all")), ("id", "first", _FIRST), ("at", "min")]
    )
    kinds = grouped.sort_by([("id_count", "descending"), ("at_min", "ascending")]).to_pylist()
    return [{"error": k["error"], "rows": k["id_count"], "example_id": k["id_first"]} for k in kinds[:limit]]


def distinct_values(table: pa.Table, name: str) -> list[tuple[str, int]]:
    """(value, rows) of a text column's non-empty values, most common first."""
    values = table.column(name)
    values = pc.filter(values, pc.fill_null(pc.not_equal(values, ""), False))
    if not len(values):
        return []
    counted = pc.value_counts(values)
    pairs = list(zip(counted.field("values").to_pylist(), counted.field("counts").to_pylist()))
    return sorted(pairs, key=lambda p: -p[1])  # stable: ties in order of first appearance


def per_actor(table: pa.Table, wall_s: Optional[float] = None) -> dict[str, dict]:
    """Figures per actor, sorted by actor name; rows that never reached an actor (rejected
    by the driver) are left out."""
    table = table.filter(pc.is_valid(table.column(S.ACTOR)))
    if not table.num_rows:
        return {}
    ok = table.column(OK)
    grouped = (
        pa.table(
            {
                "actor": table.column(S.ACTOR),
                "ok": pc.cast(ok, pa.int64()),
                "audio": pc.if_else(ok, table.column(S.AUDIO_SECONDS), None),
                "frames": pc.if_else(ok, table.column(S.N_FRAMES), None),
                "node": table.column(S.NODE),
                "device": table.column(S.DEVICE),
            }
        )
        .group_by("actor", use_threads=False)
        .aggregate(
            [
                ("ok", "count", pc.CountOptions(mode="all")),
                ("ok", "sum"),
                ("audio", "sum"),
                ("frames", "sum"),
                ("node", "first", _FIRST),
                ("device", "first", _FIRST),
            ]
        )
        .sort_by("actor")
    )
    figures = {}
    for g in grouped.to_pylist():
        mine = ok_rows(table.filter(pc.equal(table.column(S.ACTOR), g["actor"])))
        figures[g["actor"]] = {
            "node": g["node_first"],
            "device": g["device_first"],
            "rows": g["ok_count"],
            "rows_ok": g["ok_sum"],
            "rows_error": g["ok_count"] - g["ok_sum"],
            "audio_s": g["audio_sum"] or 0.0,
            "frames": g["frames_sum"] or 0,
            "latency_ms_p50": percentiles(mine.column(S.TOTAL_MS), [50])[0],
            "row_rtf_p50": percentiles(mine.column(S.RTF), [50])[0],
            "rows_per_s": rate(g["ok_count"], wall_s),
            "frames_per_s": rate(g["frames_sum"] or 0, wall_s),
        }
    return figures


def batches(meta: pa.Table) -> pa.Table:
    """One row per actor call (the `batch` struct every output row carries), with its actor,
    in order of first appearance."""
    rows = meta.filter(pc.is_valid(meta.column(S.BATCH)))
    fields = [f.name for f in S.BATCH_TYPE]
    flat = pa.table({"actor": rows.column(S.ACTOR), **{f: pc.struct_field(rows.column(S.BATCH), f) for f in fields}})
    grouped = flat.group_by(S.BATCH_ID, use_threads=False).aggregate(
        [("actor", "first", _FIRST)] + [(f, "first", _FIRST) for f in fields if f != S.BATCH_ID]
    )
    return grouped.rename_columns([c.removesuffix("_first") for c in grouped.column_names])


def actor_batches(calls: pa.Table) -> pa.Table:
    """Per actor (sorted by name), over its calls: seconds of each phase, rows, peak memory,
    when its first call began and its construction time."""
    ms = (S.BATCH_PREP_MS, S.BATCH_ENGINE_MS, S.BATCH_CODEC_MS, S.BATCH_ENCODE_MS, S.BATCH_CHECKS_MS)
    grouped = calls.group_by("actor", use_threads=False).aggregate(
        [(c, "sum") for c in ms]
        + [
            (S.BATCH_ROWS, "sum"),
            (S.BATCH_PEAK_RSS_MB, "max"),
            (S.BATCH_STARTED_AT, "min"),
            (S.BATCH_ACTOR_INIT_MS, "first", _FIRST),
            (S.BATCH_ACTOR_MODEL_BUSY_MS, "max"),
        ]
    )
    return grouped.sort_by("actor")


def wall_from_rows(table: pa.Table) -> Optional[float]:
    """A run's wall time from its rows alone: first row's start (finish - total) to the last
    finish; None without finish times."""
    finished = table.column(S.FINISHED_AT)
    if not len(finite(finished)):
        return None
    starts = pc.subtract(
        finished, pc.divide(pc.fill_null(pc.cast(table.column(S.TOTAL_MS), pa.float64()), 0.0), 1000.0)
    )
    return float(pc.max(finished).as_py() - pc.min(starts).as_py())


def headline(table: pa.Table, wall_s: Optional[float]) -> dict:
    """The figures a run's report leads with, from its rows: counts, audio, speeds against
    `wall_s` (summary.json's; the rows' own span when it is not known), latency and per-row
    RTF percentiles of the ok rows."""
    counted, ok = counts(table), ok_rows(table)
    wall_from_row_times = wall_s is None
    if wall_from_row_times:
        wall_s = wall_from_rows(table)
    audio_s = float(total(ok, S.AUDIO_SECONDS))
    latency_p50, latency_p90 = percentiles(ok.column(S.TOTAL_MS), (50, 90))
    return {
        **counted,
        "audio_s": audio_s,
        "wall_s": wall_s,
        "wall_from_row_times": wall_from_row_times and wall_s is not None,
        "rows_per_s": rate(counted["rows"], wall_s),
        "frames_per_s": rate(float(total(ok, S.N_FRAMES)), wall_s) or None,
        "rtf": rate(wall_s, audio_s) if wall_s else None,
        "latency_ms_p50": latency_p50,
        "latency_ms_p90": latency_p90,
        "row_rtf_p50": percentiles(ok.column(S.RTF), (50,))[0],
    }
