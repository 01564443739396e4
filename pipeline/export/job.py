"""The export's driver: check the source (a finished chorus output, no run writing it), plan
the units from the footers, start or resume the destination's record, run the units as Ray
Data work (one task each, progress as they finish), publish the pieces under their numbered
names, write the format's last files and mark the record done. The driver holds one record per
unit (a shard's worth of rows) and sums, never a row.
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Optional

import pyarrow.parquet as pq
import yaml

from ..cluster import TASK_CPUS, Cluster
from ..errors import USER_ERRORS, OutputInUse, OutputMismatch
from ..names import CONFIG_FILE, IDENTITY_FILE, SUMMARY_FILE
from ..output.layout import OutputLayout
from ..output.lease import Lease
from . import filters, formats
from .destination import Destination
from .formats import Bounds
from .plan import ExportPlan, plan_units
from .task import write_unit

if TYPE_CHECKING:  # the config module imports Hydra: not in the export's Ray tasks (they import this module)
    from ..config import ExportCluster, ExportSettings

log = logging.getLogger("chorus")

# what makes two exports the same export: a rerun with all of these equal resumes (or, done,
# changes nothing); any other is refused unless export.overwrite
IDENTITY_KEYS = ("format", "source_files", "filters", "bounds", "prefix", "columns", "splits", "card")
PUBLISH_THREADS = 8  # an object store's copies are slow one at a time


@dataclass
class ExportReport:
    destination: str
    summary: dict
    already_done: bool  # a finished export of the same rows and settings: nothing was written


def check_source(layout: OutputLayout) -> None:
    """A finished chorus output that no run is writing: every id in its live files once."""
    if not layout.is_chorus_output():
        raise OutputMismatch(f"{layout.location} is not a chorus output (no {IDENTITY_FILE}): pass a run's output.dir")
    lease = Lease(layout, run_id="export")
    held = lease.held_by()
    if held is not None and lease.stale_reason(held) is None:
        raise OutputInUse(
            f"{layout.location} is being written by a chorus run (host {held.get('host')}, pid {held.get('pid')}, "
            f"run {held.get('run')}): export it once that run has finished"
        )
    text = layout.read_text(SUMMARY_FILE)
    on_disk = sum(pq.read_metadata(p, filesystem=layout.fs).num_rows for p in layout.live_files())
    if text is None or json.loads(text).get("rows_total") != on_disk:
        raise OutputMismatch(
            f"{layout.location} holds rows of a run that did not finish ({on_disk} rows in its files, "
            f"{SUMMARY_FILE} {'missing' if text is None else 'counts others'}); rerun the job's own command "
            f"to finish it (it resumes, and its end keeps each row once), then export"
        )


def _source_facts(layout: OutputLayout) -> dict:
    """The run's model, checkpoint, sampling and quality settings, for a dataset card."""
    identity = json.loads(layout.read_text(IDENTITY_FILE) or "{}")
    config = yaml.safe_load(layout.read_text(CONFIG_FILE) or "{}") or {}
    quality = config.get("quality") or {}
    return {
        "model": identity.get("model"),
        "checkpoint": identity.get("checkpoint"),
        "sampling": config.get("sampling"),
        "quality": {k: quality.get(k) for k in ("reject", "max_attempts", "asr", "speaker", "mos")},
    }


def begin(destination: Destination, fmt, wanted: dict, overwrite: bool) -> Optional[dict]:
    """Start or resume the destination's record; the record of a finished export of the same
    rows and settings (then nothing is to be written), else None."""
    record = destination.record()
    if record is None:
        destination.check_empty()
    elif overwrite:
        log.info("export.overwrite: deleting the %d file(s) of the earlier export", destination.wipe(fmt.owns))
    else:
        changed = [key for key in IDENTITY_KEYS if record.get(key) != wanted[key]]
        if changed:
            raise OutputMismatch(
                f"export.dir {destination.location} holds an export of other rows or settings ({', '.join(changed)} "
                f"differ); pass export.overwrite=true to replace it, or choose another export.dir"
            )
        if record.get("state") == "done":
            return record
        log.info("resuming the export in %s", destination.location)
    destination.write_record({**wanted, "state": "running"})
    return None


class ExportProgress:
    """Units and rows done, rows kept; a line every `interval_s` and at the end."""

    def __init__(self, plan: ExportPlan, interval_s: float):
        self.plan, self.interval_s = plan, interval_s
        self.began = self.last = time.monotonic()
        self.units = self.read = self.kept = 0

    def add(self, record: dict) -> None:
        self.units += 1
        self.read += record["read"]
        self.kept += sum(p["rows"] for p in record["pieces"])
        now = time.monotonic()
        if now - self.last >= self.interval_s or self.units == len(self.plan.units):
            self.last = now
            elapsed = now - self.began
            share = self.read / self.plan.rows if self.plan.rows else 1.0
            eta = f", ETA {elapsed / share - elapsed:.0f} s" if 0 < share < 1 else ""
            log.info(
                "export progress: %d/%d units, %s/%s rows read, %s kept, %.0f s%s",
                *(self.units, len(self.plan.units), f"{self.read:,}", f"{self.plan.rows:,}", f"{self.kept:,}"),
                *(elapsed, eta),
            )


def _unit_row(row: dict, job: dict) -> dict:
    return {"record": json.dumps(write_unit(row["unit"], json.loads(row["slices"]), job))}


def _user_error(error: BaseException) -> Optional[BaseException]:
    """The user error (a store's refusal, ...) a failed Ray task carries, if any."""
    seen = error
    while seen is not None:
        if isinstance(seen, USER_ERRORS):
            return seen
        seen = seen.__cause__ or getattr(seen, "cause", None)
    return None


def run_units(plan: ExportPlan, job: dict, cluster_settings: ExportCluster, interval_s: float) -> list:
    """Every unit's record, in plan order: one Ray task per unit, as Ray Data work, for an
    output of at least cluster.distributed_rows rows; else in this process, unit by unit."""
    progress = ExportProgress(plan, interval_s)
    if not plan.units:
        return []
    if plan.rows < cluster_settings.distributed_rows:
        records = []
        for unit, slices in enumerate(plan.units):
            records.append(write_unit(unit, slices, job))
            progress.add(records[-1])
        return records
    cluster = Cluster(cluster_settings, distributed=True)
    cluster.connect()
    import ray

    items = [{"unit": i, "slices": json.dumps(slices)} for i, slices in enumerate(plan.units)]
    dataset = ray.data.from_items(items, override_num_blocks=len(items))
    dataset = dataset.map(_unit_row, fn_kwargs={"job": job}, num_cpus=TASK_CPUS)
    records = []
    try:
        for row in dataset.iter_rows():
            records.append(json.loads(row["record"]))
            progress.add(records[-1])
    except Exception as error:
        raise (_user_error(error) or error) from error
    finally:
        cluster.close()
    return sorted(records, key=lambda r: r["unit"])


def publish(destination: Destination, fmt, records: list, wanted: dict) -> list:
    """Every piece under its final name, numbered in plan order within its split; the pieces,
    in that order."""
    pieces = [piece for record in records for piece in record["pieces"]]
    split_of = (lambda piece: piece["split"]) if wanted["splits"] else (lambda piece: None)
    totals = Counter(split_of(p) for p in pieces)
    seen: Counter = Counter()
    names = []
    for piece in pieces:
        split = split_of(piece)
        names.append(fmt.final_names(seen[split], totals[split], split, wanted["prefix"]))
        seen[split] += 1
    with ThreadPoolExecutor(PUBLISH_THREADS) as pool:
        list(pool.map(destination.publish, pieces, names))
    return pieces


def summarize(records: list, pieces: list, wanted: dict) -> dict:
    removed = Counter()
    for record in records:
        removed.update(record["removed"])
    rates = [r["sample_rate"] for r in records if r["sample_rate"]]
    return {
        "rows": sum(p["rows"] for p in pieces),
        "read": sum(r["read"] for r in records),
        "removed": dict(sorted(removed.items())),
        "audio_seconds": round(sum(p["audio_seconds"] for p in pieces), 3),
        "audio_bytes": sum(p["audio_bytes"] for p in pieces),
        "shards": len(pieces) if formats.get(wanted["format"]).sharded else 0,
        "units": len(records),
        "units_reused": sum(1 for r in records if r.get("reused")),
        "workers": len({r["worker"] for r in records}),
        "store_retries": sum(r["store_retries"] for r in records),
        "sample_rate": rates[0] if rates else None,
        "filters": wanted["filters"],
        "prefix": wanted["prefix"],
        "columns": wanted["columns"],
        "splits": _split_counts(pieces, list(wanted["splits"] or [])),
        "split_shares": wanted["splits"],
        "card": wanted["card"],
    }


def _split_counts(pieces: list, order: list) -> dict:
    """Rows, audio and files per split with rows, in export.splits' order."""
    out: dict = {split: None for split in order}
    for piece in pieces:
        entry = out.get(piece["split"]) or {"rows": 0, "audio_seconds": 0.0, "audio_bytes": 0, "shards": 0}
        out[piece["split"]] = entry
        entry["rows"] += piece["rows"]
        entry["audio_seconds"] = round(entry["audio_seconds"] + piece["audio_seconds"], 3)
        entry["audio_bytes"] += piece["audio_bytes"]
        entry["shards"] += 1
    return {split: counts for split, counts in out.items() if counts is not None}


def export(source_dir: str, settings: ExportSettings, cluster_settings: ExportCluster) -> ExportReport:
    """`python -m pipeline.export`: the output in `source_dir` exported as `settings` say,
    on the Ray `cluster_settings` names (pipeline/config.py ExportConfig's groups)."""
    began = time.monotonic()
    fmt = formats.get(settings.format)
    formats.check_installed(fmt)
    layout = OutputLayout(source_dir)
    check_source(layout)
    destination = Destination(settings.dir or f"{layout.location}/{fmt.default_dir}", fmt.record_name)
    bounds = Bounds.of(fmt, settings.shard_rows, settings.shard_bytes)
    plan = plan_units(layout, bounds)
    wanted = {
        "format": fmt.name,
        "source_files": plan.files,
        "filters": filters.settings_of(settings),
        "bounds": asdict(bounds),
        "prefix": settings.prefix,
        "columns": settings.export_columns(),
        "splits": settings.split_shares(),
        "card": {"license": settings.license, "language": list(settings.language)},
    }
    done = begin(destination, fmt, wanted, settings.overwrite)
    if done is not None:
        destination.remove_staging()  # what a run killed after marking itself done left
        return ExportReport(destination.location, done["summary"], already_done=True)
    job = {**wanted, "source": layout.location, "dest": destination.location}
    records = run_units(plan, job, cluster_settings, settings.progress_interval_s)
    pieces = publish(destination, fmt, records, wanted)
    summary = {**summarize(records, pieces, wanted), "source_dir": layout.location, "source": _source_facts(layout)}
    fmt.finish(destination, pieces, summary)
    summary["seconds"] = round(time.monotonic() - began, 3)
    destination.write_record({**wanted, "state": "done", "summary": summary})
    destination.remove_staging()
    return ExportReport(destination.location, summary, already_done=False)
