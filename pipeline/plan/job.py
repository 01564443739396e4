"""Planning a job: every input row's decision against what the output holds, and their sums.
Shared by the run (pipeline/run/steps.py) and `python -m pipeline.preview`: the rows come
from pipeline/plan/decide.py, the sums from pipeline/plan/counts.py. The driver holds sums, a
few example ids and one entry per fragment.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow.fs as pafs

from ..config import ChorusConfig
from ..location import absolute
from ..output.layout import OutputLayout
from . import rules as P
from .counts import DecisionCounts, count_decisions, refuse_changed
from .decide import Decided, decide, output_key_files
from .estimate import RowEstimate
from .inputs import InputScan
from .keys import RowHasher


@dataclass
class Plan:
    """A job's plan: the input scanned, every row decided, the sums."""

    scan: InputScan
    decided: Decided
    counts: DecisionCounts


def plan_job(config: ChorusConfig, scan: InputScan, layout: OutputLayout, digest: str, distributed: bool) -> Plan:
    """Every input row's decision against what `layout` holds, and their sums; `distributed`:
    as Ray Data work (pipeline/cluster.py decides, once per run). Raises OutputMismatch for
    changed rows under output.on_change=refuse."""
    output = config.output
    hasher = RowHasher(digest, absolute(config.data.audio_root), scan.root, output.channels)
    present = layout.fs.get_file_info(layout.data_dir).type == pafs.FileType.Directory
    files = output_key_files(layout.live_files()) if present else []
    estimate = RowEstimate(config.model.budget, config.long_form, config.engine.max_tokens)
    retry = P.Retry(output.retry_errors, output.retry_rejected)
    decided = decide(scan, hasher, files, layout.fs, retry, distributed, estimate)
    counts = count_decisions(decided, scan.total_rows)
    if output.on_change == "refuse":
        refuse_changed(counts)
    return Plan(scan, decided, counts)
