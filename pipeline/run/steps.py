"""One synthesis run, start to end: check the settings, input and output; take the lease;
plan every row; stream the rows to do through the actors; settle the output; write the
summary and the report. Each step is a function below, in the order the run takes them.

    plan (pipeline/plan/job.py: every row new / done / changed / retry / rejected)
      -> read the chosen rows (pipeline/run/chosen_rows.py: small blocks, content hash attached)
      -> map_batches(SynthStage, actor pool): rows written as crash-safe parts as they finish
         (pipeline/output/parts.py PartSink), each part's stats to the run's inbox
      (Ray tasks, while it runs): each shard's worth of parts packed into a shard

The driver drains the parts' stats every second (pipeline/run/synthesis.py): that is the
progress, and what fills a shard starts its compaction; the run's end packs the remaining
parts. The live files are the resume state (pipeline/output/layout.py). Nothing here imports
torch.
"""

from __future__ import annotations

import datetime
import json
import logging
import shutil
import time
from dataclasses import asdict, dataclass

from actors.storage import retries_spent
from actors.synth.budget import ACCEPT

from ..cluster import Cluster
from ..config import ChorusConfig, as_yaml, check_for_run
from ..errors import ConfigError, StoreError
from ..names import ATTEMPTS_DIR, CONFIG_FILE, DATA_DIR, PLAN_DIR, REJECTED_PART, SUMMARY_FILE
from ..output import shards, space, supersede
from ..output.layout import OutputLayout
from ..output.lease import Lease
from ..plan import rules as P
from ..plan.estimate import CODEC_FRAMES_PER_SECOND
from ..plan.identity import identity, model_fingerprint, settings_digest
from ..plan.inputs import output_inside_input, scan_input
from ..plan.job import Plan, plan_job
from ..plan.records import write_ids, write_rejected
from ..plan.todo import todo_fragments
from ..report.summary import summary_of
from .actor_settings import actor_arguments
from .context import Job, new_run_id
from .synthesis import synthesize

log = logging.getLogger("chorus")


@dataclass
class RunReport:
    output: str
    summary: dict
    report_s: float = 0.0  # writing report.html, after the data is complete (not in summary wall_s)


def run(config: ChorusConfig) -> RunReport:
    """One run of `config` (pipeline/config.py typed): everything that can be checked is
    checked before Ray starts; rows already in the output are skipped; summary.json is
    rewritten at the end."""
    check_for_run(config)
    started, started_unix, run_id, retried = time.monotonic(), time.time(), new_run_id(), retries_spent()
    scan = scan_input(config.data.path, asdict(config.data.columns))
    output = config.output
    if output_inside_input(scan, output.dir):
        raise ConfigError(
            f"output.dir={output.dir!r} is inside the input directory {scan.base_dir}: its part files "
            f"would be read back as input on the next run; choose an output.dir outside it"
        )
    layout = OutputLayout(output.dir)
    layout.check_ours()  # before the lease file goes in: a foreign directory is left untouched
    with Cluster.for_rows(config.cluster, scan.total_rows) as cluster:
        if cluster.distributed:
            cluster.connect()  # planning runs on Ray too
        job = Job(config, run_id, scan, layout, cluster, started, started_unix, store_retries_from=retried)
        lease = Lease(layout, run_id, heartbeat_s=output.lease_heartbeat_s, stale_s=output.lease_stale_s)
        lease.acquire()
        try:
            return _run_leased(job, lease)
        except StoreError as e:
            e.at_work = True  # the store failed a run at work: exit status 4, not a refusal (pipeline/cli)
            raise
        except OSError as e:
            full = space.full_disk(e)  # the driver's own writes (the run's end)
            if full is None or not layout.local:
                raise
            raise space.output_full(layout, full, rows_left=0) from e
        finally:
            lease.release()


def _run_leased(job: Job, lease: Lease) -> RunReport:
    """The run under its lease: claim the output, plan, synthesize, then the run's end."""
    _claim_output(job)
    digest = settings_digest(job.config, model_fingerprint(job.config.model))
    plan = plan_job(job.config, job.scan, job.layout, digest, job.cluster.distributed)
    refused = write_rejected(plan.decided, job.layout, job.run_id)
    _log_plan(job, plan, refused.rows)
    lease.check()  # a lease lost meanwhile: no work launched
    stream = _synthesize(job, plan, lease.check)
    lease.check()
    settled = _settle_output(job, plan, refused.ids)
    lease.check()
    infrastructure = _infrastructure(job, lease, stream)  # takes its figures out of the stream's
    return _finish(job, {**stream, **settled, "infrastructure": infrastructure})


def _infrastructure(job: Job, lease: Lease, stream: dict) -> dict:
    """What the run met beneath it (summary.json's `infrastructure`): the lease's kind (and why
    an object store's is the weaker one), object-store calls retried (the driver's, its tasks'),
    and what the cluster did (pipeline/run/cluster_events.py)."""
    cluster = stream.pop("cluster", None) or {"nodes_lost": [], "actors_restarted": 0, "blocks_retried": 0}
    return {
        "lease": lease.kind,
        "lease_weaker_because": lease.weaker_because,
        "store_retries": retries_spent() - job.store_retries_from + stream.pop("store_retries", 0),
        **cluster,
    }


def _claim_output(job: Job) -> None:
    """Bind the output to this input and model, clear what earlier runs left for themselves
    only, and record the run's configuration."""
    layout = job.layout
    recorded = layout.claim(identity(job.config.model, job.scan), overwrite=job.output.overwrite, run_id=job.run_id)
    earlier = (recorded or {}).get("input")
    if earlier and earlier != job.scan.source:
        log.info("%s was last written from input %s; this run reads %s", layout.location, earlier, job.scan.source)
    if layout.local:  # crash counts of earlier runs' blocks mean nothing to this run's blocks
        shutil.rmtree(layout.path(ATTEMPTS_DIR), ignore_errors=True)
        shutil.rmtree(layout.path(PLAN_DIR), ignore_errors=True)
    layout.write_text(CONFIG_FILE, as_yaml(job.config))


def _log_plan(job: Job, plan: Plan, refused_rows: int) -> None:
    """What the plan decided, in the log: refused rows, rows to do, changed, retried and
    removed rows (the changed and removed ids, every one, into files under the output)."""
    counts, scan = plan.counts, job.scan
    _log_budget(job.config)
    if refused_rows:
        log.warning(
            "%d input rows rejected before synthesis (bad or duplicate ids, ref_id conflicts); they are error "
            "rows in %s",
            refused_rows,
            REJECTED_PART,
        )
    log.info(
        "input %s: %d rows in %d file(s); %d to synthesize, %d already in %s%s",
        scan.source,
        scan.total_rows,
        len(scan.files),
        counts.to_synthesize,
        counts.already_in,
        job.layout.location,
        f", {refused_rows} refused" if refused_rows else "",
    )
    for decision, what in (
        (P.CHANGED, "rows changed since they were written (text, reference, settings or model) and are redone"),
        (P.REMOVED, _removed_words(job.output.on_removed)),
    ):
        if counts.count(decision):
            examples = counts.changed_examples if decision == P.CHANGED else counts.removed_examples
            log.warning(
                "%d %s: %s (every id in %s)",
                counts.count(decision),
                what,
                ", ".join(map(repr, examples)) + (" ..." if counts.count(decision) > len(examples) else ""),
                write_ids(plan.decided, job.layout, job.run_id, decision),
            )
    if counts.count(P.RETRY):
        retried_by = job.output.retry_errors or job.output.retry_rejected
        log.info(
            "%d error or rejected rows are retried (%s)",
            counts.count(P.RETRY),
            "output.retry_errors / retry_rejected" if retried_by else "their errors were transient",
        )


def _log_budget(config: ChorusConfig) -> None:
    """The frame budget rows get, said once: the demo's is short on purpose."""
    budget = config.model.budget
    if config.model.checkpoint is None and budget.on_cut == ACCEPT:
        log.info(
            "model %s is the demo: each segment gets its short budget (at most %d frames, %.1f s) and the random "
            "model babbles to it, so its rows end cut there and stay ok (flag truncated; model.budget.on_cut=accept); "
            "a real checkpoint gets real speech's budget and regenerates a cut segment",
            config.model.name,
            budget.max_frames,
            budget.max_frames / CODEC_FRAMES_PER_SECOND,
        )


def _removed_words(on_removed: str) -> str:
    if on_removed == "prune":
        return "rows of the output are in the input no more and are pruned from it (output.on_removed=prune)"
    return "rows of the output are in the input no more; kept (output.on_removed=prune removes them)"


def _synthesize(job: Job, plan: Plan, check) -> dict:
    """The rows to do through the actors (pipeline/run/synthesis.py), stopped when `check`
    raises; what only the stream sees. The run's scratch folders go afterwards."""
    stream = {}
    if plan.counts.to_synthesize:
        todo = todo_fragments(plan.decided, job.scratch(PLAN_DIR))
        arguments = actor_arguments(
            job.config, job.scan.root, job.run_id, job.scratch(ATTEMPTS_DIR), rows=job.scan.total_rows
        )
        stream = synthesize(job, todo, arguments, plan.counts.to_synthesize, check)
    shutil.rmtree(job.scratch(PLAN_DIR), ignore_errors=True)
    shutil.rmtree(job.scratch(ATTEMPTS_DIR), ignore_errors=True)
    return stream


def _settle_output(job: Job, plan: Plan, refused_ids: int) -> dict:
    """The run's end on disk: each id's older copies dropped (and, with output.on_removed=prune,
    the removed ids' rows), the last parts packed; summary.json's figures of the removed rows."""
    pruning = job.output.on_removed == "prune"
    planned = plan.counts.planned_rows(pruned=pruning)
    pruned = plan.decided.ids_where(P.REMOVED) if pruning and planned.removed else None
    superseded = supersede.drop_superseded(job.layout, planned, refused_ids, job.cluster.distributed, pruned)
    if superseded:
        log.info("removed %d rows: older copies of rows this run redid, and rows pruned", superseded)
    packed = shards.compact_all(job.layout, job.run_id, job.output.shard_bytes, job.output.shard_rows)
    if packed:
        log.info("packed the last %d parts into %d shard(s)", sum(p["parts"] for p in packed), len(packed))
    return {
        "rows_removed_from_input": planned.removed,
        "removed_rows": ("pruned" if pruning else "kept") if planned.removed else None,
    }


def _finish(job: Job, stream: dict) -> RunReport:
    """summary.json (its wall time ends here), then the report page, timed apart."""
    layout, scan = job.layout, job.scan
    wall = time.monotonic() - job.started
    extra = {
        "output": layout.location,
        "data": f"{layout.location}/{DATA_DIR}",
        "input": scan.source,
        "input_rows": scan.total_rows,
        "model": job.config.model.name,
        "finished_at": datetime.datetime.now().isoformat(timespec="seconds"),
        "started_at_unix": job.started_unix,
        **stream,
    }
    summary = summary_of(layout, job.run_id, wall, extra, job.cluster.distributed)
    layout.write_text(SUMMARY_FILE, json.dumps(summary, indent=2) + "\n")
    report_s = _write_report(layout, job.run_id)
    log.info(
        "done: %d rows (%d ok, %d error), %.3f h audio, %.1f s (+ %.1f s report); output in %s",
        summary["rows_total"],
        summary["rows_ok"],
        summary["rows_error"],
        summary["audio_hours"],
        wall,
        report_s,
        layout.location,
    )
    return RunReport(output=layout.location, summary=summary, report_s=report_s)


def _write_report(layout: OutputLayout, run_id: str) -> float:
    """report.html beside the data, local or on an object store; the seconds it took. A broken
    page never fails the run: the data is written."""
    from ..report.page import write_report  # matplotlib: only when a page is written

    began = time.monotonic()
    try:
        write_report(layout.location, title=f"chorus run {run_id}")
    except Exception:
        log.exception("could not write report.html")
    return time.monotonic() - began
