"""One synthesis run: check the input and output, build the Ray Data plan, stream it, report.

    plan (pipeline/resume.py: every row new / done / changed / retry / rejected)
      -> read the chosen rows (pipeline/todo_read.py: small blocks, content hash attached)
      -> map_batches(SynthActor, actor pool)
      -> map_batches(write_block): one crash-safe part file per block, stats back to the driver
      (Ray tasks, while it runs): each shard's worth of parts packed into a shard

The driver consumes the stream of per-block stats: that is the progress, and what fills a
shard starts its compaction (pipeline/compaction.py); the run's end packs the remaining
parts. The live files are the resume state (pipeline/output.py). Nothing here imports torch.
"""

from __future__ import annotations

import datetime
import json
import logging
import math
import os
import shutil
import time
import uuid
from dataclasses import dataclass, replace

from omegaconf import DictConfig, OmegaConf

from actors.settings import ActorSettings, CrashSettings, RunContext

from . import planner as P
from . import shards, supersede
from .config import ConfigError, in_ray_job, settings, to_plain, validate
from .identity import identity, input_ids_digest, model_fingerprint, settings_digest
from .inputs import output_inside_input, scan_input
from .lease import Lease, OutputInUse
from .output import (
    ATTEMPTS_DIR,
    CONFIG_FILE,
    REJECTED_PART,
    SUMMARY_FILE,
    OutputLayout,
    is_local,
    local_path,
)
from .planning import todo_fragments, use_distributed
from .resume import plan_job, write_changed, write_rejected
from .stream import blocks_per_actor, connect, data_context, synthesize
from .summary import summary_of

log = logging.getLogger("chorus")


@dataclass
class RunReport:
    output: str
    summary: dict
    report_s: float = 0.0  # writing report.html, after the data is complete (not in summary wall_s)


def _check_settings(cfg: DictConfig, plain: dict) -> None:
    """Everything about the settings that can be checked before Ray starts: each group's range
    checks (pipeline/config.py::validate), then what depends on where the run is."""
    validate(cfg)
    output = plain["output"]
    if in_ray_job() and is_local(output["dir"]) and not os.path.isabs(os.path.expanduser(output["dir"])):
        raise ConfigError(
            f"output.dir={output['dir']!r} is relative: inside a Ray Job that is the job's "
            f"temporary working directory, deleted afterwards; pass an absolute path or a URI"
        )
    model = plain["model"]
    checkpoint = model["checkpoint"]
    if checkpoint is not None and is_local(checkpoint):
        if not os.path.isfile(os.path.join(local_path(checkpoint), "config.json")):
            raise ConfigError(f"model.checkpoint={checkpoint!r} is not a checkpoint directory (no config.json there)")
        codec = model["codec"] or os.path.join(checkpoint, "codec.pth")
        if is_local(codec) and not os.path.exists(local_path(codec)):
            raise ConfigError(f"codec {codec!r} does not exist (set model.codec)")


def attempts_dir(output_location: str, run_id: str) -> str:
    """Where actors count the blocks that killed them: beside the output when it is local (a
    shared filesystem serves every node), else in this machine's cache (one node only)."""
    if is_local(output_location):
        return os.path.join(local_path(output_location), ATTEMPTS_DIR, run_id)
    return os.path.join(os.path.expanduser("~"), ".cache", "chorus", ATTEMPTS_DIR, run_id)


def concurrent_blocks(engine, rows_per_block: int, rows: int | None = None, actors: int = 1) -> int:
    """Blocks one actor holds at once: engine.max_concurrent_blocks, or (null) enough that the
    rows in flight cover the slots and the feed queue, plus two: one whose last rows are
    finishing and one being prepared. With fewer, a slot freed near a block's end waits for
    Ray to hand over the next block and for its references (measured on the demo, 16 slots,
    16-row blocks: 2 blocks 71% slot occupancy, 4 blocks 89%). Given the input's `rows`, never
    more than each actor's share of its blocks: Ray Data hands blocks to whichever actor has
    room, so an actor that starts first would otherwise take a small job's every block while
    the others sit idle."""
    if engine.max_concurrent_blocks is not None:
        return int(engine.max_concurrent_blocks)
    cover = -(-(engine.max_rows + engine.feed_queue_rows) // rows_per_block) + 2
    if rows is None:
        return cover
    return max(1, min(cover, blocks_per_actor(rows, rows_per_block, actors)))


# the run config's groups SynthActor receives, as their dataclasses (actors/settings.py)
ACTOR_GROUPS = ("model", "data", "engine", "long_form", "sampling", "quality")


def actor_arguments(
    cfg: DictConfig, input_dir: str | None, run_id: str, attempts: str | None = None, rows: int | None = None
) -> dict:
    """SynthActor's constructor arguments: one ActorSettings (actors/settings.py) holding the
    actor's groups as typed dataclasses (`OmegaConf.to_object`: resolved, each default from its
    dataclass), the run context and the crash settings; small, picklable and the same on every
    actor. `rows`: the input's row count, when known (see concurrent_blocks)."""
    groups = {group: settings(cfg, group) for group in ACTOR_GROUPS}
    data = groups["data"]
    if data.audio_root is not None and is_local(data.audio_root):
        groups["data"] = replace(data, audio_root=local_path(data.audio_root))
    cluster = settings(cfg, "cluster")
    engine = groups["engine"]
    blocks = concurrent_blocks(engine, cluster.rows_per_block, rows, cluster.num_actors)
    groups["engine"] = replace(engine, max_concurrent_blocks=blocks)
    run_context = RunContext(
        run_id=run_id,
        input_dir=input_dir,
        keep_codes=bool(cfg.output.keep_codes),
        threads=cluster.threads_per_actor or max(1, math.floor(cluster.cpus_per_actor)),
    )
    crash = CrashSettings(
        attempts_dir=attempts,
        quarantine_after=cluster.crash_quarantine_after,
        block_timeout_s=cluster.block_timeout_s,
        crash_on_batch=cluster.crash_on_batch,
        crash_marker=cluster.crash_marker,
        crash_on_id=cluster.crash_on_id,
    )
    return {"settings": ActorSettings(**groups, run=run_context, crash=crash)}


def run(cfg: DictConfig) -> RunReport:
    """One run: everything that can be checked is checked before Ray starts; rows already in
    the output are skipped; summary.json is rewritten at the end."""
    plain = to_plain(cfg)
    _check_settings(cfg, plain)
    started = time.monotonic()
    started_unix = time.time()
    run_id = datetime.datetime.now().strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]
    scan = scan_input(plain["data"]["path"], plain["data"]["columns"])
    output = plain["output"]
    if output_inside_input(scan, output["dir"]):
        raise ConfigError(
            f"output.dir={output['dir']!r} is inside the input directory {scan.base_dir}: its part files "
            f"would be read back as input on the next run; choose an output.dir outside it"
        )
    layout = OutputLayout(output["dir"])
    layout.check_ours()  # before the lease file goes in: a foreign directory is left untouched
    distributed = use_distributed(scan, plain["cluster"]["distributed_plan_rows"])
    started_ray = connect(plain["cluster"]) if distributed else False  # planning runs on Ray too
    try:
        if distributed:
            data_context()
        lease = Lease(layout, run_id, heartbeat_s=output["lease_heartbeat_s"], stale_s=output["lease_stale_s"])
        lease.acquire()
        try:
            return _run_leased(cfg, plain, scan, layout, lease, run_id, started, started_unix)
        finally:
            lease.release()
    finally:
        if started_ray:
            import ray

            ray.shutdown()


def plan_dir(output_location: str, run_id: str) -> str:
    """Where a distributed plan's per-fragment row lists go (beside the output when local)."""
    if is_local(output_location):
        return os.path.join(local_path(output_location), PLAN_DIR, run_id)
    return os.path.join(os.path.expanduser("~"), ".cache", "chorus", PLAN_DIR, run_id)


PLAN_DIR = "_plan"


def _run_leased(cfg, plain, scan, layout, lease, run_id, started, started_unix) -> RunReport:
    """The run under its lease: claim the output, plan, synthesize, then the run's end."""
    distributed = use_distributed(scan, plain["cluster"]["distributed_plan_rows"])
    _claim_output(cfg, plain, scan, layout, run_id, distributed)
    digest = settings_digest(plain, model_fingerprint(plain["model"]))
    arguments = actor_arguments(cfg, scan.root, run_id, attempts_dir(layout.location, run_id), rows=scan.total_rows)
    job = plan_job(plain, scan, layout, digest, arguments["settings"].data.audio_root)
    refused = write_rejected(job.decided, layout, run_id)
    _log_plan(plain["output"], scan, layout, job, refused.rows, run_id)
    stream = {}
    if job.summary.to_synthesize:
        todo = todo_fragments(job.decided, plan_dir(layout.location, run_id))
        stream = synthesize(plain, scan, todo, arguments, layout, job.summary.to_synthesize, run_id)
    shutil.rmtree(plan_dir(layout.location, run_id), ignore_errors=True)
    shutil.rmtree(attempts_dir(layout.location, run_id), ignore_errors=True)
    if lease.lost:
        raise OutputInUse(f"{lease.lost}: this run's rows may be incomplete; rerun to resume")
    _settle_output(plain["output"], layout, job.summary, refused.ids, run_id, distributed)
    wall = time.monotonic() - started
    extra = {
        "output": layout.location,
        "data": f"{layout.location}/data",
        "input": scan.source,
        "input_rows": scan.total_rows,
        "model": plain["model"]["name"],
        "finished_at": datetime.datetime.now().isoformat(timespec="seconds"),
        "started_at_unix": started_unix,
        **stream,
    }
    summary = summary_of(layout, run_id, wall, extra, distributed)
    layout.write_text(SUMMARY_FILE, json.dumps(summary, indent=2) + "\n")
    report_s = _write_report(layout, run_id)
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


def _claim_output(cfg, plain, scan, layout, run_id: str, distributed: bool) -> None:
    """Bind the output to this input and model, clear what earlier runs left for themselves
    only, and record the run's configuration."""
    layout.claim(
        identity(plain, scan, input_ids_digest(scan, distributed)),
        overwrite=plain["output"]["overwrite"],
        run_id=run_id,
    )
    if layout.local:  # crash counts of earlier runs' blocks mean nothing to this run's blocks
        shutil.rmtree(os.path.join(layout.base, ATTEMPTS_DIR), ignore_errors=True)
        shutil.rmtree(os.path.join(layout.base, PLAN_DIR), ignore_errors=True)
    layout.write_text(CONFIG_FILE, OmegaConf.to_yaml(cfg, resolve=True))


def _log_plan(output: dict, scan, layout, job, refused_rows: int, run_id: str) -> None:
    """What the plan decided, in the log: refused rows, rows to do, changed and retried rows
    (the changed ids, every one, into a file under the output)."""
    summary = job.summary
    if refused_rows:
        log.warning(
            "%d input rows rejected before synthesis (bad or duplicate ids, ref_id conflicts); they are error "
            "rows in %s",
            refused_rows,
            REJECTED_PART,
        )
    pending = summary.to_synthesize
    log.info(
        "input %s: %d rows in %d file(s); %d to synthesize, %d already in %s",
        scan.source,
        scan.total_rows,
        len(scan.files),
        pending,
        scan.total_rows - pending,
        layout.location,
    )
    if summary.count(P.CHANGED):
        log.warning(
            "%d rows changed since they were written (text, reference, settings or model) and are redone: %s "
            "(every id in %s)",
            summary.count(P.CHANGED),
            ", ".join(map(repr, summary.changed_examples))
            + (" ..." if summary.count(P.CHANGED) > len(summary.changed_examples) else ""),
            write_changed(job.decided, layout, run_id),
        )
    if summary.count(P.RETRY):
        log.info(
            "%d error or rejected rows are retried (%s)",
            summary.count(P.RETRY),
            "output.retry_errors / retry_rejected"
            if output["retry_errors"] or output["retry_rejected"]
            else "their errors were transient",
        )


def _settle_output(output: dict, layout, plan, refused_ids: int, run_id: str, distributed: bool) -> None:
    """The run's end on disk: each id's older copies dropped, the last parts packed."""
    superseded = supersede.drop_superseded(layout, plan, refused_ids, distributed)
    if superseded:
        log.info("removed %d older copies of rows this run redid", superseded)
    packed = shards.compact_all(layout, run_id, output["shard_bytes"], output["shard_rows"])
    if packed:
        log.info("packed the last %d parts into %d shard(s)", sum(p["parts"] for p in packed), len(packed))


def _write_report(layout, run_id: str) -> float:
    """report.html beside the data (a local output; for a URI output: report later); the
    seconds it took. A broken page never fails the run: the data is written."""
    began = time.monotonic()
    if is_local(layout.location):
        from .report import write_report

        try:
            write_report(local_path(layout.location), title=f"chorus run {run_id}")
        except Exception:
            log.exception("could not write report.html")
    return time.monotonic() - began
