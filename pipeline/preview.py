"""`chorus preview [settings]` (`python -m pipeline.preview`): what `chorus run` would do with
these settings, planned by the same code (pipeline/plan/job.py plan_job), without a model, actors
or writing anything into the output. Prints a table, then as its last line one JSON object:
rows_total, to_synthesize, done, changed, retry, removed (ids the output holds that the input
no longer names), rejected (reason -> rows), text_chars,
dialogue_rows, voices and turns (of the rows to synthesize: rows with a `voices` list, their
voices, their speaker turns), segments (as the run will cut the rows), budget_frames (their
frame budgets summed: the most the run generates), estimated_frames (the budgets when every
segment runs to its budget -- EOS off, or the demo's random model -- else real speech of the
text: `estimated_from` says which; pipeline/plan/estimate.py), estimated_audio_hours,
estimated_hours (from preview.bench=PATH, a bench.json; else null).
"""

from __future__ import annotations

import json
import logging
import sys
from dataclasses import asdict
from typing import Optional

from .cluster import Cluster
from .config import ChorusConfig, check_for_run
from .location import local_path
from .output.layout import OutputLayout
from .plan import rules as P
from .plan.counts import DecisionCounts
from .plan.estimate import CODEC_FRAMES_PER_SECOND
from .plan.identity import model_fingerprint, settings_digest
from .plan.inputs import scan_input
from .plan.job import plan_job

log = logging.getLogger("chorus")


def bench_frames_per_s(path: str, num_actors: int, slots: int) -> float:
    """Frames/s a bench.json measured for this many actors and slots: its run of exactly that
    shape, else its fastest scaled by the number of actors."""
    with open(local_path(path), encoding="utf-8") as f:
        configs = json.load(f)["configs"]
    same = [c for c in configs if c["num_actors"] == num_actors and c["slots"] == slots]
    if same:
        return float(same[0]["frames_per_s"])
    best = max(configs, key=lambda c: c["frames_per_s"])
    return float(best["frames_per_s"]) * num_actors / best["num_actors"]


def result(summary: DecisionCounts, frames_per_s: Optional[float], fills_budgets: bool) -> dict:
    """The figures; `fills_budgets`: every segment runs to its budget (EOS off, or the demo's
    random model), so the budgets' sum is the estimate, else real speech of the text is."""
    frames = summary.budget_frames if fills_budgets else summary.speech_frames
    hours = frames / frames_per_s / 3600.0 if frames_per_s else None
    return {
        "rows_total": summary.rows_total,
        "to_synthesize": summary.to_synthesize,
        "done": summary.count(P.DONE),
        "changed": summary.count(P.CHANGED),
        "retry": summary.count(P.RETRY),
        "removed": summary.count(P.REMOVED),
        "rejected": dict(sorted(summary.rejected.items())),
        "text_chars": summary.text_chars,
        "dialogue_rows": summary.dialogue_rows,
        "voices": summary.voices,
        "turns": summary.turns,
        "segments": summary.segments,
        "budget_frames": summary.budget_frames,
        "estimated_frames": frames,
        "estimated_from": "budgets" if fills_budgets else "speech",
        "estimated_audio_hours": frames / CODEC_FRAMES_PER_SECOND / 3600.0,
        "estimated_hours": hours,
    }


def table(figures: dict, summary: DecisionCounts) -> str:
    lines = ["| rows | count |", "|---|---:|"]
    for key in ("rows_total", "to_synthesize", "done", "changed", "retry", "removed"):
        lines.append(f"| {key} | {figures[key]:,} |")
    lines.append(f"| new | {summary.count(P.NEW):,} |")
    for reason, rows in figures["rejected"].items():
        lines.append(f"| rejected: {reason} | {rows:,} |")
    lines.append(f"| text characters to synthesize | {figures['text_chars']:,} |")
    if figures["dialogue_rows"]:
        lines.append(
            f"| dialogue rows (voices, turns) | {figures['dialogue_rows']:,} ({figures['voices']:,}, {figures['turns']:,}) |"
        )
    lines.append(f"| segments (as the run cuts them) | {figures['segments']:,} |")
    lines.append(f"| frame budgets (the most the run generates) | {figures['budget_frames']:,} |")
    lines.append(f"| estimated frames (from the {figures['estimated_from']}) | {figures['estimated_frames']:,} |")
    lines.append(f"| estimated audio hours | {figures['estimated_audio_hours']:.3f} |")
    hours = figures["estimated_hours"]
    lines.append(f"| estimated hours | {'-' if hours is None else f'{hours:.2f}'} |")
    if summary.changed_examples:
        lines.append(f"changed, e.g.: {', '.join(map(repr, summary.changed_examples))}")
    return "\n".join(lines)


def preview(config: ChorusConfig) -> dict:
    """Plan the run `config` describes; returns the figures (see the module doc)."""
    check_for_run(config)
    scan = scan_input(config.data.path, asdict(config.data.columns))
    layout = OutputLayout(config.output.dir)
    layout.check_ours()
    with Cluster.for_rows(config.cluster, scan.total_rows) as cluster:
        if cluster.distributed:
            cluster.connect()
        digest = settings_digest(config, model_fingerprint(config.model))
        summary = plan_job(config, scan, layout, digest, cluster.distributed).counts
    bench = config.preview.bench
    rate = bench_frames_per_s(bench, config.cluster.num_actors, config.engine.max_rows) if bench else None
    fills = not config.engine.stop_on_eos or config.model.checkpoint is None  # the demo babbles to its budget
    figures = result(summary, rate, fills)
    print(table(figures, summary), flush=True)
    print(json.dumps(figures), flush=True)
    return figures


if __name__ == "__main__":
    from .cli import main

    sys.exit(main(["preview", *sys.argv[1:]], filter_stderr=True))
