"""The quality gate (the checks are actors/quality/), in two places of a row's way:

- Each segment's result is checked as the engine returns it, and an attempt `quality.reject`
  rejects is generated again at once -- the same prompt, so the same history, with the next
  attempt's seed (chain.segment_seed: a function of the row's seed alone) -- up to
  `quality.max_attempts`; the least flawed attempt is kept.
- Once the row's audio is decoded it is measured (silence, clipping, loudness; with
  `quality.asr` / `.speaker` / `.mos` transcribed, compared with its reference, scored), a
  finisher batch at a time. A flag quality.reject lists sends the row back to the engine:
  from the first segment whose audio shows it (a one-segment row: the row), that segment and
  every later one generated again. Later segments go too because each one's prompt carries
  the segments before it as history: kept, they would continue audio that is no longer in the
  row. Checks that only the whole row can show (wer, speaker, mos) send it back from its
  first segment. Each segment's attempts go on counting (max_attempts bounds them all, and no
  attempt reuses a seed), and the frames generated again are bounded by
  `quality.max_regenerated_share` of the row's. When the row can go back no more, the best
  round (the same ordering as attempts) is written; `rejected` if it still fails.

The engine feeder calls `segment` for every attempt; the finisher calls `audio` for every
decoded batch. Both run on their own thread and touch only the jobs in hand. A job is the
actor's (actors/synth/jobs.py RowJob); this layer sits below the actor, so it names only the
fields it reads and writes (GatedRow).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Optional, Protocol

from actors.engine.types import STOP_ERROR
from actors.quality import attempts, checks, hearing
from actors.quality.hearing import Heard
from actors.quality.row_quality import RowQuality, SegmentAttempts
from actors.quality.settings import LOCAL_FLAGS, TRUNCATED, QualitySettings


class SettingsWithQuality(Protocol):
    """The actor's settings (ActorSettings), of which the gate reads the quality group at each
    use: a test's variant of the group reaches every part at once."""

    quality: QualitySettings


class GatedRow(Protocol):
    """What the gate reads and writes of a row in flight (the actor's RowJob)."""

    spec: Any  # its RowSpec: the voices a speaker check compares with
    chain: Any  # its RowChain: the segments, their attempts, results and budgets (grow, cut_rejects)
    quality: Optional[RowQuality]
    tries: Optional[SegmentAttempts]  # the segment in hand's attempts
    heard: Optional[Heard]
    result: Any
    rounds: list  # AudioRounds: each rejected decoded version, until written

    @property
    def ok(self) -> bool: ...


@dataclass
class AudioRound:
    """A row as one round left it: what would be written if this round is kept."""

    quality: RowQuality
    result: Any
    heard: Heard  # its FLAC and measurements
    results: list
    steps: list
    history: list


class QualityGate:
    def __init__(
        self,
        settings: SettingsWithQuality,
        frame_length: int,
        sample_rate: int,
        asr: Any = None,
        speaker: Any = None,
        mos: Any = None,
    ):
        self.settings, self.frame_length, self.sample_rate = settings, frame_length, sample_rate
        self.frames_per_second = sample_rate / frame_length
        self.asr = asr  # an actors.quality.asr backend, or None
        self.speaker = speaker  # an actors.synth.listening.SpeakerCheck, or None
        self.mos = mos  # an actors.quality.mos predictor, or None
        self._cut_rejecting: tuple = (None, None)  # (quality group, it with truncated rejecting)

    def segment(self, job: GatedRow, result: Any) -> Optional[Any]:
        """A segment attempt's result: None when it is to be generated again (the chain has
        moved to the next attempt), else the result to record (the kept attempt's). Engine
        errors are not judged: they are the row's error, as without a gate."""
        if result.stop_reason == STOP_ERROR:
            return result
        settings = self._row_settings(job)
        if job.quality is None:
            job.quality = RowQuality(settings)
        chain = job.chain
        if chain.grow(result):  # cut by its budget: again with a larger one (its frames discarded)
            job.quality.generated_frames += result.frames
            return None
        if job.tries is None:
            text = chain.plan.spoken[chain.segment]
            job.tries = SegmentAttempts(settings, text, self.frames_per_second, first_attempt=chain.attempt)
        if job.tries.offer(result, result.codes, result.stop_reason):
            chain.retry()
            return None
        kept = job.quality.add_segment(job.tries)
        job.tries = None
        return kept.payload

    def _row_settings(self, job: GatedRow) -> QualitySettings:
        """The quality settings a row is judged by: quality's own, with `truncated` rejecting
        when a segment its budget cut fails the row (the chain says: model.budget.on_cut)."""
        quality = self.settings.quality
        if TRUNCATED in quality.reject or not job.chain.cut_rejects:
            return quality
        if self._cut_rejecting[0] is not quality:  # made once per quality group (tests swap it)
            self._cut_rejecting = (quality, replace(quality, reject=[*quality.reject, TRUNCATED]))
        return self._cut_rejecting[1]

    @property
    def needs_wave(self) -> bool:
        """Whether the decoded waves must come to the actor: for the checks on models it holds."""
        return any(check is not None for check in (self.asr, self.speaker, self.mos))

    def audio(self, jobs: list[GatedRow]) -> list[GatedRow]:
        """Judge the heard rows (their measurements made where they were decoded; the checks on
        models run here); returns those sent back to the engine (the caller hands them to the
        engine feeder instead of finishing them)."""
        heard = [j for j in jobs if j.ok and j.heard is not None and j.quality is not None]
        if not heard:
            return []
        self._measure(heard)
        return [job for job in heard if self._again(job)]

    def _measure(self, heard: list[GatedRow]) -> None:
        for job in heard:
            job.quality.add_audio(job.heard.metrics, job.heard.turn_metrics)
        if not self.needs_wave:
            return
        waves = [j.heard.wave for j in heard]
        if self.asr is not None:
            scored = self.asr.score(waves, self.sample_rate, [j.chain.plan.words or "" for j in heard])
            for job, transcript in zip(heard, scored):
                job.quality.add_transcript(transcript)
        if self.speaker is not None:
            self._speakers(heard)
        if self.mos is not None:
            for job, score in zip(heard, self.mos.score(waves, self.sample_rate)):
                job.quality.add_mos(score)
        for job in heard:
            job.heard.wave = None  # measured: the FLAC is what is kept

    def _speakers(self, heard: list[GatedRow]) -> None:
        """Each turn's similarity to its own voice (a plain row: one turn, its one reference),
        every turn of the batch embedded in one call."""
        waves, refs = [], []
        for job in heard:
            plan, voices = job.chain.plan, job.spec.voices
            frames = plan.turn_frames([r.frames for r in job.chain.results])
            for (voice, _), (start, end) in zip(plan.turns, hearing.stretches(frames, self.frame_length)):
                waves.append(job.heard.wave[start:end])
                refs.append(voices[voice].ref if voice < len(voices) else None)
        similarities = self.speaker.similarities(waves, refs, self.sample_rate)
        at = 0
        for job in heard:
            turns = len(job.chain.plan.turns)
            job.quality.add_speaker_similarities(similarities[at : at + turns])
            at += turns

    def _again(self, job: GatedRow) -> bool:
        """Whether the row goes back to the engine; if not, the round to write is in place."""
        quality, chain = job.quality, job.chain
        failing = quality.audio_rejections()
        if not failing:  # written as it is: no round needs keeping (most rows)
            return False
        # a failing round is kept: when no round passes, the best of them is written
        job.rounds.append(
            AudioRound(
                quality.snapshot(), job.result, job.heard, list(chain.results), list(chain.steps), list(chain.history)
            )
        )
        start = self._first_failing_segment(job, failing)
        redo = sum(kept.frames for kept in quality.segments[start:])
        limit = self.settings.quality.max_regenerated_share * quality.kept_frames
        if quality.tries.get(start, 0) >= self.settings.quality.max_attempts or (
            quality.regenerated_frames + redo > limit
        ):
            self._keep_best_round(job)
            return False
        quality.rewind(start)
        chain.rewind(start, {k: n for k, n in quality.tries.items() if k >= start})
        job.result = job.heard = None
        return True

    def _first_failing_segment(self, job: GatedRow, failing: list[str]) -> int:
        """The first segment whose own stretch of audio shows a rejected flag (measured where
        the row was heard); 0 when the row has one segment or only whole-row checks failed. A
        dialogue row's turns were each measured (silence, clipping, loudness, speaker): a turn
        that fails goes back from its own first segment, the turns before it kept."""
        plan = job.chain.plan
        if len(plan.turns) > 1:
            firsts = [self._turn_start(job, flag) for flag in failing]
            return min(firsts, default=0)
        local = [flag for flag in failing if flag in LOCAL_FLAGS]
        stretches = job.heard.segment_metrics
        if not local or not stretches:
            return 0
        for k, metrics in enumerate(stretches):
            shown = checks.audio_flags(metrics, self.settings.quality)
            if any(flag in shown for flag in local):
                return k
        return 0

    @staticmethod
    def _turn_start(job: GatedRow, flag: str) -> int:
        """The first segment of the first turn showing `flag` (0 for whole-row flags)."""
        turn = job.quality.first_failing_turn(flag)
        return 0 if turn is None else job.chain.plan.segment_turns.index(turn)

    def _keep_best_round(self, job: GatedRow) -> None:
        """Every round failed: write the best (least severe flags, the earliest among equals)."""
        rounds = job.rounds
        best = rounds[attempts.best_attempt([r.quality.flags for r in rounds])]
        # every round's attempts and frames were spent, whichever round is written
        best.quality.tries = dict(job.quality.tries)
        best.quality.generated_frames = job.quality.generated_frames
        best.quality.regenerated_frames = job.quality.regenerated_frames
        job.quality, job.result, job.heard = best.quality, best.result, best.heard
        job.chain.results[:], job.chain.steps[:], job.chain.history[:] = best.results, best.steps, best.history
