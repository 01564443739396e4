"""One run's fixed facts, made once at its start and handed to each of its steps."""

from __future__ import annotations

import datetime
import uuid
from dataclasses import dataclass

from actors.synth.job_settings import OutputSettings

from ..cluster import Cluster
from ..config import ChorusConfig
from ..location import scratch_dir
from ..output.layout import OutputLayout
from ..plan.inputs import InputScan


def new_run_id() -> str:
    """When the run started, to the second, and a random tail: sortable, and unique per run."""
    return datetime.datetime.now().strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]


@dataclass
class Job:
    """A run: its config, its id, its input, its output, its Ray and its clock (monotonic,
    for durations; unix, for rows' timestamps)."""

    config: ChorusConfig
    run_id: str
    scan: InputScan
    layout: OutputLayout
    cluster: Cluster
    started: float
    started_unix: float
    store_retries_from: int = 0  # this process's object-store retries when the run began

    @property
    def output(self) -> OutputSettings:
        return self.config.output

    def scratch(self, folder: str) -> str:
        """This run's working folder `folder` (pipeline/location.py scratch_dir)."""
        return scratch_dir(self.layout.location, folder, self.run_id)
