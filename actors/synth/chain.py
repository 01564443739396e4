"""Segment chains: a row's text cut into segments, each one engine request whose prompt carries
the codes of the segments before it (README, "Long text"). A one-segment row is a plain row,
its prompt exactly `PromptBuilder.build`'s.

Pure host code (prompts are numpy arrays built by the tokenizer), testable without an engine:
`ChainPlanner.plan` makes a row's `RowChain` in the block's caller thread; the engine feeder
then asks the chain for its next `Request` and records each result.

The chain is also where a quality gate (per-attempt checks, regeneration) plugs in: a segment's
result may be rejected instead of recorded (`retry`), and the same segment is asked for again
with the same prompt (the same history) and a seed derived from the attempt.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass, replace
from typing import Any, Optional

import numpy as np

from actors import schema as S
from actors.engine.architecture import FAMILY_S2
from actors.engine.prompt import PreviousSegment, Prompt, PromptError, Reference, check_text
from actors.engine.segment import utf8_len
from actors.engine.types import STOP_BUDGET, STOP_ERROR, Request, Result
from actors.synth.budget import ACCEPT
from actors.synth.rows import RowError, RowSpec, escape_special_tokens, row_seed
from actors.synth.segmenting import Pieces, SegmentingError, Sizing, dialogue_pieces, plain_pieces
from actors.synth.settings import ActorSettings

log = logging.getLogger(f"chorus.{__name__}")  # one namespace: configuring "chorus" reaches every module


@dataclass(frozen=True)
class SegmentPlan:
    """A row's segments, the frame budget of each, and the key its prompts' reference part is
    shared under (None without a reference). `turns`: the row's speaker turns as the output
    reports them, (voice, words), and `segment_turns` the turn each segment belongs to (a plain
    row: one turn, the whole text); `spoken`: each segment's words, without speaker tags (what
    its speech rate is measured against)."""

    texts: tuple[str, ...]
    frames: tuple[int, ...]
    prefix_key: Optional[str] = None
    turns: tuple[tuple[int, str], ...] = ()
    segment_turns: tuple[int, ...] = ()
    spoken: tuple[str, ...] = ()

    @property
    def max_frames(self) -> int:
        return sum(self.frames)

    @property
    def words(self) -> str:
        """The row's words as spoken: its turns' words, one turn a line."""
        return "\n".join(text for _, text in self.turns)

    def turn_frames(self, segment_frames: list[int]) -> list[int]:
        """Frames per turn, from the frames of each segment (in order)."""
        out = [0] * len(self.turns)
        for turn, frames in zip(self.segment_turns, segment_frames):
            out[turn] += frames
        return out


def segment_seed(seed: int, segment: int, attempt: int = 0) -> int:
    """Segment 0's first attempt samples with the row's seed (a one-segment row is what it
    always was); every other (segment, attempt) draws its own stream, derived from the row's
    seed, rather than replaying it."""
    if segment == 0 and attempt == 0:
        return seed
    name = f"segment {segment}" if attempt == 0 else f"segment {segment} attempt {attempt}"
    return row_seed(name, seed)


class RowChain:
    """One row's segments through the engine, one request at a time: `request` asks for the
    current segment, `record` accepts its result (False once the row is done or failed),
    `joined` is the row's result. Owned by one thread at a time (the caller builds it, then
    the engine feeder alone touches it)."""

    def __init__(self, spec: RowSpec, plan: SegmentPlan, planner: ChainPlanner, references: list[Reference]):
        self.spec, self.plan, self.planner = spec, plan, planner
        self.references = references  # one per voice, in voice order
        self.results: list[Result] = []
        self.steps: list[int] = []  # the actor's engine step at which each segment finished
        self.history: list[int] = []  # how many previous segments each segment's prompt kept
        self.attempt = 0  # of the current segment: 0, then one more for each `retry`
        self.first_attempts: dict[int, int] = {}  # segment -> its first attempt after a `rewind`
        self.budgets = list(plan.frames)  # each segment's frame budget, as `grow` raised it
        self.growths = 0  # times a segment's budget grew (each a generation again)
        self._prompt: Optional[Prompt] = None  # the current segment's, kept for a retry

    @property
    def segment(self) -> int:
        """The segment to run next (len(plan.texts) once all are done)."""
        return len(self.results)

    def label(self, k: int) -> str:
        return f"segment {k + 1} of {len(self.plan.texts)}: " if len(self.plan.texts) > 1 else ""

    def prompt(self) -> Prompt:
        """The current segment's prompt, built once (PromptError, labelled, if it cannot be)."""
        if self._prompt is None:
            k = self.segment
            previous = [PreviousSegment(s, r.codes) for s, r in zip(self.plan.texts, self.results)]
            try:
                self._prompt = self.planner.builder.build_segment(
                    self.plan.texts[k],
                    previous,
                    references=self.references,
                    max_columns=self.planner.positions - self.budgets[k],
                )
            except PromptError as e:
                raise PromptError(self.label(k) + str(e)) from None
            self.history.append(self._prompt.history_kept)
        return self._prompt

    def request(self, request_id: str) -> Request:
        """The engine request for the current segment and attempt; `request_id` names the row
        uniquely in the actor (the segment and attempt are added)."""
        k, prompt = self.segment, self.prompt()
        suffix = f"#{k}" + (f"~{self.attempt}" if self.attempt else "") + (f"+{self.growths}" if self.growths else "")
        sampling = self.spec.sampling
        seed = segment_seed(self.spec.seed, k, self.attempt)
        return Request(
            request_id + suffix,
            prompt.tokens,
            self.budgets[k],
            sampling=sampling if seed == sampling.seed else sampling.with_seed(seed),
            stop_on_eos=self.planner.settings.engine.stop_on_eos,
            prefix_key=self.plan.prefix_key,
            prefix_len=prompt.prefix_len if self.plan.prefix_key else 0,
        )

    @property
    def budget_chosen(self) -> bool:
        """Whether the user chose where the row stops: a max_frames column, or EOS off (every
        row then runs to its budget by request)."""
        return self.spec.explicit_frames or not self.planner.settings.engine.stop_on_eos

    @property
    def cut_rejects(self) -> bool:
        """Whether a segment its budget cut fails the row (model.budget.on_cut grow or reject),
        rather than being kept, `ok` and flagged (accept, or a budget the user chose)."""
        return self.planner.settings.model.budget.on_cut != ACCEPT and not self.budget_chosen

    def grow(self, result: Result) -> bool:
        """A segment its budget cut, under model.budget.on_cut=grow: the same segment asked for
        again with a larger budget (budget.FrameBudget.grown: twice, up to max_frames and what
        the slot's positions leave beside its prompt) and the same seed, so it is what that
        budget would have given at once. False when it was not cut or may not grow."""
        if result.stop_reason != STOP_BUDGET or self.budget_chosen:
            return False
        k = self.segment
        try:
            room = self._room(k)
        except PromptError:  # cannot happen for a segment that ran; never fail the row over it
            return False
        grown = self.planner.settings.model.budget.grown(self.budgets[k], room)
        if grown is None:
            return False
        self.budgets[k], self.growths = grown, self.growths + 1
        del self.history[k:]
        self._prompt = None  # built again: a larger budget may leave room for less history
        return True

    def _room(self, k: int) -> int:
        """The most frames segment k may take: the positions its prompt without history leaves."""
        alone = self.planner.builder.build_segment(
            self.plan.texts[k], [], references=self.references, max_columns=self.planner.positions
        )
        return self.planner.positions - alone.tokens.shape[1]

    def cut_reason(self) -> Optional[str]:
        """Why a row its budget cut is rejected: the first cut segment and its budget."""
        cut = [k for k, r in enumerate(self.results) if r.stop_reason == STOP_BUDGET]
        if not cut or not self.cut_rejects:
            return None
        k = cut[0]
        ceiling = self.planner.settings.model.budget.max_frames
        return (
            f"{self.label(k)}cut off by its frame budget of {self.budgets[k]} frames in every attempt "
            f"(model.budget.on_cut={self.planner.settings.model.budget.on_cut}, ceiling model.budget.max_frames="
            f"{ceiling}); raise model.budget.max_frames, or pass model.budget.on_cut=accept to keep such rows"
        )

    def retry(self) -> None:
        """Reject the current segment's last result: the next `request` asks for the same
        segment again, same prompt, next attempt's seed."""
        self.attempt += 1

    def rewind(self, segment: int, first_attempts: dict[int, int]) -> None:
        """Generate `segment` and every later one again (a check on the decoded audio rejected
        the row there): their results are dropped, each later segment's prompt is built anew
        from the new history, and segment k's attempts go on from `first_attempts[k]`."""
        del self.results[segment:], self.steps[segment:], self.history[segment:]
        self.first_attempts = dict(first_attempts)
        self._prompt, self.attempt = None, self.first_attempts.get(segment, 0)

    def record(self, result: Result, step: int) -> Optional[str]:
        """Accept the current segment's result (finished at engine step `step`); the row's
        failure when the segment failed, else None."""
        label = self.label(self.segment)
        self.results.append(result)
        self.steps.append(step)
        self._prompt, self.attempt = None, self.first_attempts.get(self.segment, 0)
        if result.stop_reason == STOP_ERROR:
            return f"{label}generation: {result.error}"
        if result.frames == 0:
            return f"{label}generation produced no audio (stopped on {result.stop_reason} before the first frame)"
        return None

    @property
    def more(self) -> bool:
        return self.segment < len(self.plan.texts)

    def joined(self) -> Result:
        """The row's segments as one result: codes concatenated in order, times summed (segment
        k+1 is submitted when k finishes, so the sums span the row's time in the engine)."""
        results = self.results
        if len(results) == 1:
            return results[0]
        last = results[-1]
        return Result(
            request_id=last.request_id.split("#")[0],
            codes=np.concatenate([r.codes for r in results], axis=1),
            stop_reason=last.stop_reason,
            prompt_tokens=sum(r.prompt_tokens for r in results),
            frames=sum(r.frames for r in results),
            prefix_reused_tokens=sum(r.prefix_reused_tokens for r in results),
            queue_ms=sum(r.queue_ms for r in results),
            prefill_ms=sum(r.prefill_ms for r in results),
            decode_ms=sum(r.decode_ms for r in results),
            first_frame_ms=results[0].first_frame_ms,
            total_ms=sum(r.total_ms for r in results),
        )


class ChainPlanner:
    """Cuts rows into segment chains: what the prompt builder, the slot's positions
    (`positions`: prompt + frames one request may take) and the long_form settings allow."""

    def __init__(self, settings: ActorSettings, builder: Any, positions: int, special_tokens: frozenset):
        self.settings, self.builder = settings, builder
        self.positions, self.special_tokens = positions, special_tokens

    def plan(self, spec: RowSpec, voice_codes: Optional[list] = None) -> RowChain:
        """The row's chain with its first prompt built (in the caller's thread, so the engine
        feeder only adds it); RowError, PromptError or ValueError when the row cannot run.
        `voice_codes`: each of the row's voices' codes, in order."""
        text = check_text(spec.text if spec.text is not None else spec.values.get(S.TEXT))
        escape = self._escape
        voice_texts = [escape(voice.text) for voice in spec.voices]
        references = [Reference(t or "", codes) for t, codes in zip(voice_texts, voice_codes or [])]
        problem = self.voices_problem(spec)
        if problem:
            raise RowError(problem)
        self._check_length(text)
        fixed = self.builder.build("x", references=references).tokens.shape[1] - len(self.builder.tokenizer.encode("x"))
        try:
            plan = self._dialogue(spec, text, fixed) if spec.dialogue else self._plain(spec, text, fixed)
        except SegmentingError as e:
            raise RowError(str(e)) from None
        chain = RowChain(spec, replace(plan, prefix_key=_prefix_key(spec, voice_texts)), self, references)
        chain.prompt()
        return chain

    def voices_problem(self, spec: RowSpec) -> Optional[str]:
        """Why the model cannot speak the row's voices (None when it can): an S1 prompt has one
        speaker. Asked before any clip is read, so a refused row costs nothing."""
        if len(spec.voices) > 1 and self.builder.config.family != FAMILY_S2:
            return (
                f"the row has {len(spec.voices)} voices, but an S1 checkpoint's prompt addresses one speaker "
                f"(upstream's S1 code tags every reference <|speaker:0|>): dialogue rows need an S2 checkpoint "
                f"(model=s2_pro, or model=demo_s2 to try)"
            )
        return None

    def _escape(self, text: Any) -> Any:
        if self.settings.data.allow_special_tokens:
            return text
        return escape_special_tokens(text, self.special_tokens)

    def _check_length(self, text: str) -> None:
        if not text.strip():
            raise RowError("text is empty")
        limit = self.settings.data.max_text_chars
        if len(text) > limit:
            raise RowError(
                f"text is {len(text)} characters long, more than data.max_text_chars={limit}; "
                f"split the row or raise data.max_text_chars"
            )

    def sizing(self, spec: RowSpec, fixed: int) -> Sizing:
        """What sizes this row's segments (segmenting.py): the model's budget rule, or the
        row's own max_frames column."""
        settings = self.settings
        return Sizing(
            settings.model.budget,
            settings.long_form,
            self.positions,
            fixed,
            row_frames=spec.max_frames if spec.explicit_frames else None,
        )

    def _plain(self, spec: RowSpec, text: str, fixed: int) -> SegmentPlan:
        """A plain row's segments and each one's frame budget (segmenting.plain_pieces)."""
        pieces = plain_pieces(text, self._escape(text), self.sizing(spec, fixed))
        if len(pieces.texts) > 1:
            log.debug("row %s: %d bytes in %d segments", spec.id, utf8_len(text), len(pieces.texts))
        return _plan(pieces, pieces.texts)

    def _dialogue(self, spec: RowSpec, text: str, fixed: int) -> SegmentPlan:
        """A dialogue row: each turn its own segment (segmenting.dialogue_pieces). S1's prompt has
        its own <|speaker:0|> before each text, so there a segment's text is its words alone."""
        pieces = dialogue_pieces(text, len(spec.voices), self.sizing(spec, fixed), self._escape)
        s2 = self.builder.config.family == FAMILY_S2
        return _plan(pieces, pieces.texts if s2 else pieces.spoken)


def _plan(pieces: Pieces, texts: tuple[str, ...]) -> SegmentPlan:
    return SegmentPlan(
        texts, pieces.frames, turns=pieces.turns, segment_turns=pieces.segment_turns, spoken=pieces.spoken
    )


def _prefix_key(spec: RowSpec, voice_texts: list) -> Optional[str]:
    """The key the prompts' reference part is shared under: the voices' clips and texts (None
    without a voice). A plain row's is its one clip's, as it always was."""
    if not spec.voices:
        return None
    parts = [f"{voice.ref.key}\x00{text or ''}" for voice, text in zip(spec.voices, voice_texts)]
    return hashlib.blake2b("\x01".join(parts).encode("utf-8", "replace"), digest_size=16).hexdigest()
