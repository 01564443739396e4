"""The end of a run: each id's older copies removed from the files on disk, so that data/
holds every id once (pipeline/output/layout.py's module doc says why there are older copies).

Three ways, chosen by `drop_superseded`:

- none at all, in O(files), when no id can have two copies (`may_hold_copies`);
- in-process (a job below cluster.distributed_plan_rows): every live file's (id, run,
  finished_at) read here and `newest_copy_mask` run over all of it -- exact and, at that size,
  faster than starting a shuffle;
- distributed (larger jobs): the same keys read by Ray Data tasks with each row's file and
  position, a hash shuffle by id whose partitions run the same `newest_copy_mask` and name
  the copies to drop, then one task per file holding drops rewrites it with its keep mask.
  The driver holds one entry per file; a task holds its partition, or one file's drops.

Either way a file is rewritten as a new shard that absorbs it (pipeline/output/shards.py rewrite):
the rows kept are committed before the old file goes, so a crash between files (or a retried
task) leaves some older copies behind -- which readers skip and the next run's end drops --
and never loses a row.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from actors import schema as S

from ..cluster import PARTITION_ROWS, TASK_CPUS
from ..names import REJECTED_PART, is_rejected_part, is_shard
from . import shards
from .layout import OutputLayout
from .reading import newest_copy_mask, read_file

FILE, ROW = "_file", "_row"  # a key row's file (index into the list of files) and position in it
REFUSED = "_refused"  # a key row that only says its id is refused (from the rejected part)
KEY_COLUMNS = [S.ID, S.RUN, S.FINISHED_AT]  # what deciding the current copy reads (never audio)
DRIVER_DROPS = 1_000_000  # (file, row) pairs the driver groups by file itself (~12 MB)


def row_files(layout: OutputLayout) -> list[str]:
    """The live files that may hold an older copy: all but the rejected part, which each run
    replaces whole."""
    return [p for p in layout.live_files() if not is_rejected_part(p)]


def footer_rows(layout: OutputLayout, files: list[str]) -> int:
    """Rows in these files, from their footers: O(files), no column read."""
    return sum(pq.read_metadata(path, filesystem=layout.fs).num_rows for path in files)


def rejected_part(layout: OutputLayout) -> Optional[str]:
    """The rejected part's path, when this run's plan refused any row."""
    path = f"{layout.data_dir}/{REJECTED_PART}"
    return path if layout.fs.get_file_info(path).type == pafs.FileType.File else None


def refused_ids_of(layout: OutputLayout) -> pa.Array:
    """The ids the rejected part answers (refused by this run's plan): no other copy of them
    may stay. Read whole: the in-process pass only, a job below the distributed size."""
    path = rejected_part(layout)
    if path is None:
        return pa.array([], pa.string())
    ids = pq.read_table(path, filesystem=layout.fs, columns=[S.ID]).column(S.ID).combine_chunks()
    return pc.unique(pc.drop_null(ids))


@dataclass(frozen=True)
class PlannedRows:
    """What the run's plan (pipeline/plan/counts.py) says of the rows it leaves on disk:
    `accepted`, every input row it did not refuse; `redone`, the changed and retried rows
    among them (each has an earlier copy beside the one this run wrote); `removed`, the ids
    the output holds and the input no longer names, and whether they are `pruned`."""

    accepted: int
    redone: int
    removed: int = 0
    pruned: bool = False

    @property
    def kept(self) -> int:
        """The rows the live files should hold once each id has one copy."""
        return self.accepted + (0 if self.pruned else self.removed)


def may_hold_copies(planned: PlannedRows, refused_ids: int, rows_on_disk: int) -> bool:
    """Whether any id can have two copies in the live files after this run's synthesis.

    The plan answers the planned cases: a changed or retried row has its earlier copy on disk
    next to the one this run wrote, and a refused id may have a copy from before it was refused. The rest is answered by counting. Two more causes were
    weighed: a block Ray re-executes after an actor crash writes the same part name (run +
    ids, names.part_name), replacing its own file, or is dead on arrival when a shard already
    absorbed that name; compaction moves whole files and commits before deleting, so a live
    file never shares rows with another. But a run killed while redoing rows leaves its new
    copies beside the old ones, and the next run plans those ids as done; and any future way
    to double a row should not depend on this list being complete. So the pass is skipped only
    when the live files' footers hold exactly the plan's accepted rows: each accepted id has
    at least one copy (done rows had one, this run wrote every row it synthesized), so equal
    counts mean one copy each."""
    if planned.redone or refused_ids or (planned.pruned and planned.removed):
        return True
    return rows_on_disk != planned.kept


def drop_superseded(
    layout: OutputLayout, planned: PlannedRows, refused_ids: int, distributed: bool, pruned=None
) -> int:
    """The run's end pass (see the module doc), after the run wrote its rejected part (which
    names the refused ids, `refused_ids` of them); `pruned`: the ids whose every row goes too
    (the removed ids under output.on_removed=prune: an array in-process, a Ray Dataset of `id`
    rows distributed). Returns the rows removed."""
    files = row_files(layout)
    if not files or not may_hold_copies(planned, refused_ids, footer_rows(layout, files)):
        return 0
    if not distributed:
        gone = refused_ids_of(layout)
        if pruned is not None and len(pruned):
            gone = pa.concat_arrays([gone, pruned.cast(pa.string())])
        return drop_in_process(layout, gone)
    return drop_distributed(layout, files, pruned=pruned)


def apply_keep(layout: OutputLayout, path: str, keep: pa.Array) -> None:
    """Keep only `keep`'s rows of one file: rewritten as a shard absorbing it, or (a part
    with nothing kept) deleted."""
    if pc.any(keep).as_py() or is_shard(path.rsplit("/", 1)[-1]):
        # a shard's successor stays, emptied or not: its footer keeps what it absorbed gone
        shards.rewrite(layout, path, keep, owner="compact")
    else:
        layout.fs.delete_file(path)


def _keep_mask(keys: pa.Table, refused: Optional[pa.Array]) -> pa.Array:
    """The one rule: the current copy of each id, less every row of a refused id."""
    keep = newest_copy_mask(keys.column(S.ID), keys.column(S.RUN), keys.column(S.FINISHED_AT))
    if refused is not None and len(refused):
        refused_rows = pc.fill_null(pc.is_in(keys.column(S.ID), value_set=refused), False)
        keep = pc.and_(keep, pc.invert(refused_rows))
    return keep


def drop_in_process(layout: OutputLayout, refused: Optional[pa.Array] = None) -> int:
    """Every file's keys read here, the mask over all of them, each file rewritten in turn.
    Refused: the ids `refused` names, else those of the rejected part."""
    files = row_files(layout)
    if not files:
        return 0
    keys = [read_file(layout.fs, p, KEY_COLUMNS) for p in files]
    keep = _keep_mask(pa.concat_tables(keys), refused_ids_of(layout) if refused is None else refused)
    removed, offset = 0, 0
    for path, table in zip(files, keys):
        file_keep = keep.slice(offset, table.num_rows)
        offset += table.num_rows
        dropped = table.num_rows - int(pc.sum(pc.cast(file_keep, pa.int64())).as_py() or 0)
        if dropped:
            removed += dropped
            apply_keep(layout, path, file_keep)
    return removed


# ---- distributed -----------------------------------------------------------------------------


def _file_keys(batch: pa.Table, location: str) -> pa.Table:
    """One file's key columns, each row with its file index and position; for the rejected
    part, its ids only, each marked refused (FILE and ROW are never used for those)."""
    layout = OutputLayout(location)
    tables = []
    for index, path in zip(batch.column(FILE).to_pylist(), batch.column("path").to_pylist()):
        refused = is_rejected_part(path)
        keys = read_file(layout.fs, path, KEY_COLUMNS)
        if refused:  # its ids alone matter: the runs and times of its error rows decide nothing
            keys = keys.filter(pc.is_valid(keys.column(S.ID)))
        n = keys.num_rows
        keys = keys.append_column(FILE, pa.array(np.full(n, index, np.int32)))
        keys = keys.append_column(ROW, pa.array(np.arange(n, dtype=np.int64)))
        tables.append(keys.append_column(REFUSED, pa.array(np.full(n, refused))))
    return pa.concat_tables(tables)


def _drops(partition: pa.Table) -> pa.Table:
    """The copies to drop among one partition's rows (every row of the ids it holds, and the
    refused marks of those ids). Sorted back into reading order first: the rule's last
    tie-break is the order rows were read."""
    if not partition.num_rows:  # an empty partition may come without columns
        return pa.table({FILE: pa.array([], pa.int32()), ROW: pa.array([], pa.int64())})
    marks = partition.column(REFUSED)
    refused = pc.unique(partition.filter(marks).column(S.ID))
    rows = partition.filter(pc.invert(marks)).sort_by([(FILE, "ascending"), (ROW, "ascending")])
    return rows.filter(pc.invert(_keep_mask(rows, refused))).select([FILE, ROW])


def _rewrite_file(drops: pa.Table, location: str, files: list[str]) -> pa.Table:
    """One file's drops (map_groups hands every drop of a file to one call): its keep mask,
    then the rewrite. A retried task whose first attempt committed finds the file gone."""
    layout = OutputLayout(location)
    index = drops.column(FILE)[0].as_py()
    path = files[index]
    if layout.fs.get_file_info(path).type != pafs.FileType.File:
        return pa.table({FILE: pa.array([index], pa.int32()), "removed": pa.array([0], pa.int64())})
    keep = np.ones(pq.read_metadata(path, filesystem=layout.fs).num_rows, dtype=bool)
    keep[drops.column(ROW).to_numpy()] = False
    apply_keep(layout, path, pa.array(keep))
    return pa.table({FILE: pa.array([index], pa.int32()), "removed": pa.array([int((~keep).sum())], pa.int64())})


def _each_file(blocks: list[pa.Table]):
    """The drops of each file in turn, as tables of their own (copies: a task gets its file's)."""
    blocks = [t.select([FILE, ROW]) for t in blocks if t.num_rows]
    if not blocks:
        return
    table = pa.concat_tables(blocks).sort_by(FILE)
    file_of, row_of = table.column(FILE).to_numpy(), table.column(ROW).to_numpy()
    bounds = np.flatnonzero(np.diff(file_of, prepend=-1, append=-1))
    for start, end in zip(bounds[:-1], bounds[1:]):
        yield pa.table({FILE: pa.array(file_of[start:end].copy()), ROW: pa.array(row_of[start:end].copy())})


def _marks(ids: pa.Table) -> pa.Table:
    """Ids whose every row goes, as key rows marked refused (their FILE and ROW never used)."""
    ids = ids.filter(pc.is_valid(ids.column(S.ID)))
    n = ids.num_rows
    return pa.table(
        {
            S.ID: ids.column(S.ID).cast(pa.string()),
            S.RUN: pa.nulls(n, S.OUTPUT_SCHEMA.field(S.RUN).type),
            S.FINISHED_AT: pa.nulls(n, S.OUTPUT_SCHEMA.field(S.FINISHED_AT).type),
            FILE: pa.array(np.full(n, -1, np.int32)),
            ROW: pa.array(np.full(n, -1, np.int64)),
            REFUSED: pa.array(np.full(n, True)),
        }
    )


def drop_distributed(layout: OutputLayout, files: list[str], driver_drops: Optional[int] = None, pruned=None) -> int:
    """Ray Data: keys per file (and the rejected part's refused ids) -> shuffle by id -> drops
    -> grouped by file -> rewrites. When there are at most `driver_drops` drops in all
    (DRIVER_DROPS: ~12 MB) the driver groups them by file itself, sparing a second shuffle's
    start-up, and hands each file's drops to its own rewrite task; else Ray Data groups them.
    The driver keeps a row per file; the refused ids stay in the shuffle."""
    import ray

    rows = footer_rows(layout, files)
    partitions = max(2, math.ceil((rows + 1) / PARTITION_ROWS))
    rejected = rejected_part(layout)
    if rejected is not None:
        files = [*files, rejected]  # last: every drop names a file before it
    listing = ray.data.from_items([{FILE: i, "path": p} for i, p in enumerate(files)], override_num_blocks=len(files))
    keys = listing.map_batches(
        _file_keys, fn_kwargs={"location": layout.location}, batch_format="pyarrow", batch_size=1, num_cpus=TASK_CPUS
    )
    if pruned is not None:
        keys = keys.union(pruned.map_batches(_marks, batch_format="pyarrow", batch_size=None, num_cpus=TASK_CPUS))
    by_id = keys.repartition(partitions, shuffle=True, keys=[S.ID])
    drops = by_id.map_batches(_drops, batch_format="pyarrow", batch_size=None, num_cpus=TASK_CPUS).materialize()
    if drops.count() <= (DRIVER_DROPS if driver_drops is None else driver_drops):
        task = ray.remote(num_cpus=TASK_CPUS)(_rewrite_file)
        results = [task.remote(mine, layout.location, files) for mine in _each_file(ray.get(drops.to_arrow_refs()))]
        return sum(r.column("removed")[0].as_py() for r in ray.get(results))
    rewritten = drops.groupby(FILE, num_partitions=min(partitions, len(files))).map_groups(
        _rewrite_file,
        fn_kwargs={"location": layout.location, "files": files},
        batch_format="pyarrow",
        num_cpus=TASK_CPUS,
    )
    return sum(r["removed"] for r in rewritten.take_all())
