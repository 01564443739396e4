"""Output rows: the only place the actor builds them (actors/schema.py's OUTPUT_SCHEMA), ok rows
and error rows alike, and the one list of provenance columns every row carries. A row whose
values its columns cannot hold becomes its own error row; the block's others are kept."""

from __future__ import annotations

import logging
import os
import socket
import sys
import time
import traceback
from typing import Any, Optional

import numpy as np
import pyarrow as pa

from actors import schema as S
from actors.alone import each_alone
from actors.engine.types import STOP_BUDGET
from actors.synth.jobs import BlockShare, RowJob
from actors.synth.rows import RowSpec
from actors.synth.settings import ActorSettings

log = logging.getLogger(f"chorus.{__name__}")  # one namespace: configuring "chorus" reaches every module

# who made a row: on every output row, ok or not
PROVENANCE = (S.ACTOR, S.NODE, S.DEVICE, S.MODEL, S.RUN)
# what an error row keeps when the row's own output could not be built
ERROR_KEEPS = (S.ID, *PROVENANCE, S.FINISHED_AT, S.BATCH, S.CONTENT_HASH)


def as_error(fields: dict, message: str, retryable: bool, keep: Optional[tuple] = None) -> dict:
    """An error row: `fields` (only the `keep` ones, when given) with status error, the message
    and whether a rerun may succeed. Every error row the actor returns is made here."""
    kept = fields if keep is None else {k: fields.get(k) for k in keep}
    row_id = fields.get(S.ID)
    return {
        **kept,
        S.ID: row_id if isinstance(row_id, str) else None,
        S.STATUS: S.STATUS_ERROR,
        S.ERROR: message,
        S.RETRYABLE: retryable,
    }


def output_table_per_row(rows: list[dict]) -> pa.Table:
    """The output rows as one table of OUTPUT_SCHEMA. Should a row hold a value its column
    cannot (a number out of an int32 column's range), that row alone becomes an error row
    naming the value; the others are kept."""

    def unfit(row: dict, e: Exception) -> pa.Table:
        message = f"a value of this row does not fit the output schema: {e}"
        return S.output_table([as_error(row, message, retryable=False, keep=ERROR_KEEPS)])

    # one table for the whole block, or one per row when the block's does not build
    return pa.concat_tables(each_alone(rows, lambda batch: [S.output_table(batch)], unfit))


def provenance() -> tuple[str, str]:
    """(actor, node) names for the output rows: Ray's ids inside Ray, host/pid outside."""
    host = socket.gethostname()
    if "ray" in sys.modules:
        try:
            import ray

            if ray.is_initialized():
                context = ray.get_runtime_context()
                actor_id = context.get_actor_id()
                node_id = context.get_node_id()
                if actor_id:
                    return f"actor-{actor_id[:8]}-{os.getpid()}", f"{host}/{node_id[:8]}"
        except Exception:  # provenance is best effort; never fail an actor over a name
            pass
    return f"{host}-{os.getpid()}", host


class RowWriter:
    def __init__(self, settings: ActorSettings, model_name: str, device: str, sample_rate: int, frame_length: int):
        self.settings, self.sample_rate, self.frame_length = settings, sample_rate, frame_length
        actor, node = provenance()
        self.provenance = dict(zip(PROVENANCE, (actor, node, device, model_name, settings.run.run_id)))

    @property
    def actor(self) -> str:
        return self.provenance[S.ACTOR]

    def error(self, spec: RowSpec, message: str, retryable: bool) -> dict:
        """The error row of a row that never got as far as its own output."""
        fields = {S.ID: spec.id, **self.provenance, S.FINISHED_AT: time.time(), S.CONTENT_HASH: spec.content_hash}
        return as_error(fields, message, retryable)

    def row(self, job: RowJob, flac: Optional[bytes]) -> dict:
        """The row's output (ok with `flac`, else its failure), or an error row when building it
        fails: inside the per-row boundary like every other step."""
        try:
            return self._row(job, flac)
        except Exception as e:
            log.error("building the output of row %r failed:\n%s", job.spec.id, traceback.format_exc())
            return self.error(job.spec, f"internal error building the output row: {e!r}", retryable=True)

    def _row(self, job: RowJob, flac: Optional[bytes]) -> dict:
        spec, chain = job.spec, job.chain
        out = {
            S.ID: spec.id if isinstance(spec.id, str) else None,
            **self.provenance,
            S.SEED: spec.seed,
            S.MAX_FRAMES: sum(chain.budgets) if chain is not None else spec.max_frames,
            S.TEXT: spec.text,
            S.SPEAKER: None if spec.values.get(S.SPEAKER) is None else str(spec.values[S.SPEAKER]),
            S.REFERENCE: _reference_source(spec),
            S.FINISHED_AT: time.time(),
            S.CONTENT_HASH: spec.content_hash,
            **_segment_columns(chain),
            **_columns_of(spec.sampling, SAMPLING_COLUMNS),
            **_columns_of(job.result, TIMING_COLUMNS),
            **(job.quality.columns() if job.quality is not None else {}),
        }
        silent = job.ok and job.quality is not None and job.result is not None and job.result.frames == 0
        if job.failure is not None or (flac is None and not silent):
            failure = job.failure
            return as_error(
                out, failure.message if failure else "unknown failure", failure.retryable if failure else False
            )
        if silent:  # the gate kept no frames after every attempt: rejected, nothing to play
            return {**out, S.STATUS: S.STATUS_REJECTED, S.N_FRAMES: 0, S.AUDIO_SECONDS: 0.0}
        audio = self._audio_columns(job, flac)
        if job.quality is not None and job.quality.rejected:
            audio[S.STATUS] = S.STATUS_REJECTED
            audio[S.ERROR] = job.chain.cut_reason()  # why, when its budget cut it
        return {**out, **audio}

    def _audio_columns(self, job: RowJob, flac: bytes) -> dict:
        result, seconds = job.result, job.heard.samples / self.sample_rate
        total_ms = result.total_ms + job.codec_ms
        audio = {
            S.TURNS: self._turns(job),
            S.STATUS: S.STATUS_OK,
            S.AUDIO: {S.AUDIO_BYTES: flac, S.AUDIO_PATH: S.audio_file_stem(job.spec.id) + ".flac"},
            S.SAMPLE_RATE: self.sample_rate,
            S.N_FRAMES: result.frames,
            S.AUDIO_SECONDS: seconds,
            S.CODEC_MS: job.codec_ms,
            S.TOTAL_MS: total_ms,
            S.RTF: (total_ms / 1000.0) / seconds if seconds > 0 else None,
        }
        if self.settings.output.keep_codes:
            audio[S.CODES] = np.asarray(result.codes, dtype=np.int16).tolist()
        return audio

    def _turns(self, job: RowJob) -> list[dict]:
        """The row's turns in order, each its voice, words, span in the audio (at the frame
        seams between its segments and the next turn's) and similarity to its own voice."""
        plan, quality = job.chain.plan, job.quality
        frames = plan.turn_frames([r.frames for r in job.chain.results])
        similarities = quality.turn_similarities if quality is not None else []

        def seconds(frame: int) -> float:  # as audio_seconds is: samples / rate
            return frame * self.frame_length / self.sample_rate

        out, start = [], 0
        for k, ((voice, words), n) in enumerate(zip(plan.turns, frames)):
            out.append(
                {
                    S.TURN_SPEAKER: voice,
                    S.TURN_TEXT: words,
                    S.TURN_START_S: seconds(start),
                    S.TURN_END_S: seconds(start + n),
                    S.TURN_SPEAKER_SIMILARITY: similarities[k] if k < len(similarities) else None,
                }
            )
            start += n
        return out


def _reference_source(spec: Any) -> Optional[str]:
    """The clip path or URI of a row's one voice (null for several: each turn names its voice)."""
    if len(spec.voices) != 1:
        return None
    source = spec.voices[0].ref.source
    return source if isinstance(source, str) else None


def _segment_columns(chain: Any) -> dict:
    if chain is None:
        return {}
    results = chain.results
    return {
        S.SEGMENTS: len(chain.plan.texts),
        S.SEGMENT_FRAMES: [r.frames for r in results],
        S.SEGMENT_STOP_REASONS: [r.stop_reason for r in results],
        S.TRUNCATED_SEGMENTS: [k for k, r in enumerate(results) if r.stop_reason == STOP_BUDGET],
    }


# output column -> the attribute it reports, of a row's SamplingParams and of its engine Result
SAMPLING_COLUMNS = {
    S.TEMPERATURE: "temperature",
    S.TOP_P: "top_p",
    S.TOP_K: "top_k",
    S.REPETITION_PENALTY: "repetition_penalty",
    S.RAS_WINDOW: "ras_window",
}
TIMING_COLUMNS = {
    S.STOP_REASON: "stop_reason",
    S.PROMPT_TOKENS: "prompt_tokens",
    S.QUEUE_MS: "queue_ms",
    S.PREFILL_MS: "prefill_ms",
    S.DECODE_MS: "decode_ms",
}


def _columns_of(source: Any, columns: dict) -> dict:
    """The output columns `columns` names, read from `source`'s attributes (none when absent)."""
    return {} if source is None else {column: getattr(source, name) for column, name in columns.items()}


def batch_columns(block: BlockShare, batch_id: str, rows: int, slots: int, actor: dict) -> dict:
    """The `batch` struct every row of a block (or of a part of it) carries: what the block and
    its actor did for those rows. `actor`: the actor-wide figures (init_ms, kv_bytes, busy_s,
    model_busy_s) when they were written."""
    wall_s = time.perf_counter() - block.started
    busy = (actor["busy_s"] - block.busy_at_start) / wall_s if wall_s > 0 else None
    return {
        S.BATCH_ID: batch_id,
        S.BATCH_ROWS: rows,
        S.BATCH_STARTED_AT: block.started_unix,
        S.BATCH_PREP_MS: block.prep_ms,
        S.BATCH_ENGINE_MS: block.engine_ms,
        S.BATCH_CODEC_MS: block.codec_ms,
        S.BATCH_ENCODE_MS: block.encode_ms,
        S.BATCH_CHECKS_MS: block.checks_ms,
        S.BATCH_ACTOR_INIT_MS: actor["init_ms"],
        S.BATCH_PEAK_RSS_MB: _peak_rss_mb(),
        S.BATCH_KV_BYTES: actor["kv_bytes"],
        S.BATCH_ENGINE_STEPS: block.engine_steps,
        S.BATCH_SLOT_ROWS: block.slot_rows,
        S.BATCH_SLOTS: slots,
        S.BATCH_SLOT_OCCUPANCY: block.occupancy_sum / block.steps_seen if block.steps_seen else None,
        S.BATCH_ENGINE_BUSY: min(1.0, busy) if busy is not None else None,
        S.BATCH_ACTOR_MODEL_BUSY_MS: actor["model_busy_s"] * 1000.0,
    }


def _peak_rss_mb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux reports KiB
