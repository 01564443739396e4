"""The quality gate (issue 21; the checks are actors/quality/): each segment's result is checked
as the engine returns it, and an attempt `quality.reject` rejects is generated again at once --
the same prompt, so the same history (the earlier segments' codes, the other segments
untouched), with the next attempt's seed (chain.segment_seed: a function of the row's seed
alone) -- up to `quality.max_attempts`; the least flawed attempt is kept. Once the row's audio
is decoded it is measured (and transcribed, with `quality.asr`, a codec batch at a time), and
the row is `rejected` when what it kept still fails the gate or has no audio.

The engine feeder calls `segment` for every attempt; the finisher calls `audio` for every
decoded batch. Both run on their own thread and touch only the job in hand.
"""

from __future__ import annotations

from typing import Any, Optional

from actors.engine.types import STOP_ERROR
from actors.quality.gate import RowQuality, SegmentAttempts
from actors.settings import ActorSettings
from actors.synth.jobs import Job


class QualityGate:
    def __init__(self, settings: ActorSettings, frames_per_second: float, sample_rate: int, asr: Any = None):
        self.settings, self.frames_per_second, self.sample_rate = settings, frames_per_second, sample_rate
        self.asr = asr  # an actors.quality.asr backend, or None

    def segment(self, job: Job, result: Any) -> Optional[Any]:
        """A segment attempt's result: None when it is to be generated again (the chain has
        moved to the next attempt), else the result to record (the kept attempt's). Engine
        errors are not judged: they are the row's error, as without a gate."""
        if result.stop_reason == STOP_ERROR:
            return result
        quality = self.settings.quality
        if job.quality is None:
            job.quality = RowQuality(quality)
        chain = job.chain
        if job.tries is None:
            job.tries = SegmentAttempts(quality, chain.plan.texts[chain.segment], self.frames_per_second)
        if job.tries.offer(result, result.codes, result.stop_reason):
            chain.retry()
            return None
        kept = job.quality.add_segment(job.tries)
        job.tries = None
        return kept.payload

    def audio(self, jobs: list[Job]) -> None:
        """Measure the decoded rows (and transcribe them, batched, with quality.asr)."""
        heard = [j for j in jobs if j.ok and j.wave is not None and j.quality is not None]
        for job in heard:
            job.quality.add_audio(job.wave, self.sample_rate, job.spec.text)
        if self.asr is not None and heard:
            scored = self.asr.score([j.wave for j in heard], self.sample_rate, [j.spec.text or "" for j in heard])
            for job, transcript in zip(heard, scored):
                job.quality.add_transcript(transcript)
