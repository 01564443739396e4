"""The one place that names the columns chorus reads and writes (docs/architecture.md §7); the
types an input column may have, checked before any work starts, are actors/input_types.py's.

Input columns have canonical names here; `data.columns` maps each to the user's column name
and the driver renames them on read, so everything after the read speaks canonical names.
Only pyarrow is imported: the driver and the actors both use this module.
"""

from __future__ import annotations

import hashlib
import re
from typing import Optional

import pyarrow as pa

# ---- input ----------------------------------------------------------------------------
ID = "id"
TEXT = "text"
REF_AUDIO = "ref_audio"  # WAV/FLAC/OGG bytes
REF_AUDIO_PATH = "ref_audio_path"  # local path (relative to data.audio_root) or URI
REF_TEXT = "ref_text"
REF_ID = "ref_id"  # rows sharing one reference clip
# the reference already encoded, [num_codebooks][frames] codec codes (python -m pipeline.encode_refs
# makes them): used instead of ref_audio / ref_audio_path, nothing is encoded
REF_CODES = "ref_codes"
SPEAKER = "speaker"  # a label, copied to the output (rows may still differ in clip)
# a dialogue row's voices: a list of structs, voices[i] the voice of <|speaker:i|> in the text;
# each has a clip (bytes or path, as ref_audio / ref_audio_path) or codes (as ref_codes), and
# the clip's transcript
VOICES = "voices"
VOICE_AUDIO = "audio"
VOICE_AUDIO_PATH = "audio_path"
VOICE_TEXT = "text"
VOICE_CODES = "codes"
SEED = "seed"
# per-row overrides of the run's settings
MAX_FRAMES = "max_frames"
TEMPERATURE = "temperature"
TOP_P = "top_p"
TOP_K = "top_k"

REQUIRED_INPUT = (ID, TEXT)
OPTIONAL_INPUT = (
    REF_AUDIO,
    REF_AUDIO_PATH,
    REF_TEXT,
    REF_ID,
    REF_CODES,
    VOICES,
    SPEAKER,
    SEED,
    MAX_FRAMES,
    TEMPERATURE,
    TOP_P,
    TOP_K,
)
INPUT_COLUMNS = REQUIRED_INPUT + OPTIONAL_INPUT


ID_MAX_CHARS = 256


def id_problem(value: object) -> Optional[str]:
    """Why a value cannot be a row id (None if it can). Ids are data: any non-empty string
    up to ID_MAX_CHARS ('speaker/utt', spaces, any script). They never become paths as they
    are: file names come from `audio_file_stem`, which hashes every id that is not a plain
    name."""
    if value is None:
        return "id is null"
    if not isinstance(value, str):
        return f"id must be a string, got {type(value).__name__}"
    if not value:
        return "id is empty"
    if len(value) > ID_MAX_CHARS:
        return f"id is {len(value)} characters long (at most {ID_MAX_CHARS})"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "id is not valid UTF-8 (it contains an unpaired surrogate)"
    return None


_PLAIN_STEM = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
# a WebDataset sample key: no dot (its reader splits key and extension at a name's first dot)
_PLAIN_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,99}")
_UNSAFE_KEY = re.compile(r"[^A-Za-z0-9_-]+")
_HASHED_TAIL = re.compile(r"-[0-9a-f]{12}$")  # what a hashed key ends with


def _hashed_stem(row_id: str, unsafe: re.Pattern) -> str:
    """The id's safe characters (at most 60) plus a hash of the whole id: two ids never share it."""
    digest = hashlib.blake2b(row_id.encode("utf-8"), digest_size=6).hexdigest()
    readable = unsafe.sub("_", row_id).strip("._-")[:60]
    return f"{readable}-{digest}" if readable else f"id-{digest}"


def audio_file_stem(row_id: str, with_hash: bool = False) -> str:
    """A file name stem for a row id, safe on every filesystem: plain ids (letters, digits,
    '.', '_', '-', at most 100 characters, not starting with a dot) are used as they are; any
    other id (or any id, with_hash) is reduced to its safe characters plus a hash of the whole
    id, so two ids never share a stem."""
    if not with_hash and _PLAIN_STEM.fullmatch(row_id) and not row_id.endswith("."):
        return row_id
    return _hashed_stem(row_id, _UNSAFE)


def sample_key(row_id: str) -> str:
    """A row's key in a tar shard (WebDataset's `__key__`, a Lhotse cut's id): plain ids
    (letters, digits, '_', '-', at most 100 characters) as they are, any other id (a dot, a '/',
    a space, or one ending like a hashed key) its safe characters plus a hash of the whole id,
    so keys are unique whenever ids are. The id itself travels in the sample's metadata."""
    if _PLAIN_KEY.fullmatch(row_id) and not _HASHED_TAIL.search(row_id):
        return row_id
    return _hashed_stem(row_id, _UNSAFE_KEY)


# ---- output ---------------------------------------------------------------------------
STATUS = "status"
STATUS_OK = "ok"
STATUS_ERROR = "error"
# every attempt failed quality.reject: the best attempt's audio is kept with its flags, and a
# rerun counts the row as done (unless output.retry_rejected)
STATUS_REJECTED = "rejected"
ERROR = "error"
STOP_REASON = "stop_reason"
AUDIO = "audio"
AUDIO_BYTES = "bytes"
AUDIO_PATH = "path"
SAMPLE_RATE = "sample_rate"
N_FRAMES = "n_frames"
AUDIO_SECONDS = "audio_seconds"
CODES = "codes"
PROMPT_TOKENS = "prompt_tokens"
QUEUE_MS = "queue_ms"
PREFILL_MS = "prefill_ms"
DECODE_MS = "decode_ms"
CODEC_MS = "codec_ms"
TOTAL_MS = "total_ms"
RTF = "rtf"
ACTOR = "actor"
NODE = "node"
DEVICE = "device"
MODEL = "model"
RUN = "run"
FINISHED_AT = "finished_at"  # unix time the row's audio was ready
# the actor call (batch) the row was part of, with that call's wall time per phase: what the
# benchmark splits a run's time with, and what tells a user where an actor spends its time
BATCH = "batch"
BATCH_ID = "id"
BATCH_ROWS = "rows"
BATCH_STARTED_AT = "started_at"  # unix time the actor call began
BATCH_PREP_MS = "prep_ms"  # parsing, reference decode + encode, prompt building
BATCH_ENGINE_MS = "engine_ms"  # the batch's share of the engine's step time (see below)
BATCH_CODEC_MS = "codec_ms"  # codes -> waveforms
BATCH_ENCODE_MS = "encode_ms"  # FLAC encoding + building the output rows
BATCH_CHECKS_MS = "checks_ms"  # the quality checks on decoded audio (the finisher thread's CPU time)
BATCH_ACTOR_INIT_MS = "actor_init_ms"  # the actor's construction: imports, model + codec load
BATCH_PEAK_RSS_MB = "peak_rss_mb"  # the actor process's peak resident memory so far
BATCH_KV_BYTES = "kv_bytes"  # the actor engine's KV cache (slow + fast)
# the engine is shared by the blocks in flight on an actor: each engine step's time is split
# among the blocks by their live rows in it, so these sum over blocks to the actor's totals
BATCH_ENGINE_STEPS = "engine_steps"  # the batch's share of the actor's engine steps
BATCH_SLOT_ROWS = "slot_rows"  # the batch's live rows summed over engine steps
BATCH_SLOTS = "slots"  # the actor engine's slots (max_rows)
# mean over the engine steps the batch had rows in of (live rows of every block / slots)
BATCH_SLOT_OCCUPANCY = "slot_occupancy"
# share of the batch's wall time (its call's start to its end) the actor's engine was stepping
BATCH_ENGINE_BUSY = "engine_busy"
# the actor's seconds so far (cumulative, at the batch's end) during which its engine or its
# codec was running: the union of the two, so work that overlaps counts once; the bench takes
# each actor's last value as its model-busy time
BATCH_ACTOR_MODEL_BUSY_MS = "actor_model_busy_ms"
REPETITION_PENALTY = "repetition_penalty"
RAS_WINDOW = "ras_window"
# long-form rows are generated as a chain of segments (1 for a row that fits one request)
SEGMENTS = "segments"  # how many segments the row's text was cut into
SEGMENT_FRAMES = "segment_frames"  # frames generated per segment, in order (sum = n_frames)
SEGMENT_STOP_REASONS = "segment_stop_reasons"  # each segment's stop reason (eos | budget | error)
TRUNCATED_SEGMENTS = "truncated_segments"  # indices of segments cut off by their frame budget
# error rows: true when the cause may be gone on a rerun (I/O, timeout, internal error), so a
# rerun redoes the row; false for content errors, which stay until the row changes
RETRYABLE = "retryable"
# the quality gate (actors/quality/): how many attempts the row took (the most any of its
# segments took), the flags of what was kept (most severe first), the frames generated by
# attempts not kept, and one column per metric
ATTEMPTS = "attempts"
QUALITY_FLAGS = "quality_flags"
DISCARDED_FRAMES = "discarded_frames"
REPEAT_RATIO = "repeat_ratio"  # share of codebook-0 4-grams repeating an earlier one (worst segment)
SPEECH_RATE_S_PER_CHAR = "speech_rate_s_per_char"  # seconds of audio per non-space character
SILENCE_RATIO = "silence_ratio"  # share of 20 ms frames below quality.silence_dbfs
CLIPPED_RATIO = "clipped_ratio"  # share of samples at full scale
LOUDNESS_LUFS = "loudness_lufs"  # integrated loudness, ITU-R BS.1770-4 (null: too short or silent)
# with quality.asr: the transcript, the language it was decoded in (quality.asr_language or
# Whisper's detection; a Whisper code such as "en"), its word / character error rates against
# `text`, and the recipe they were computed by (actors/quality/text.py: "whisper-english" or
# "whisper-basic", Whisper's normaliser then jiwer)
ASR_TEXT = "asr_text"
ASR_LANGUAGE = "asr_language"
WER = "wer"
CER = "cer"
WER_RECIPE = "wer_recipe"
# the reference clip the row's voice came from, as the actor read it: its path (confined to
# data.audio_root) or URI; null when it was given as bytes or codes, or there was none
REFERENCE = "reference"
# with quality.speaker: cosine similarity of speaker embeddings, the row's audio against its
# reference clip (null without a reference or for a clip too short to embed)
SPEAKER_SIMILARITY = "speaker_similarity"
# with quality.mos: DNSMOS P.835's predicted overall quality, signal and background (1-5)
MOS = "mos"
MOS_SIG = "mos_sig"
MOS_BAK = "mos_bak"
# a row's speaker turns in order (a plain row has one: voice 0, the whole text), each with its
# voice (an index into the row's voices), its words, its span in the row's audio (seconds, at
# frame seams) and its speaker similarity against its own voice (null without quality.speaker)
TURNS = "turns"
TURN_SPEAKER = "speaker"
TURN_TEXT = "text"
TURN_START_S = "start_s"
TURN_END_S = "end_s"
TURN_SPEAKER_SIMILARITY = SPEAKER_SIMILARITY
# output.channels: the audio as one channel, or (dialogue rows) one channel per voice
CHANNELS_MONO = "mono"
CHANNELS_PER_SPEAKER = "per_speaker"
CHANNEL_CHOICES = (CHANNELS_MONO, CHANNELS_PER_SPEAKER)
FLAC_MAX_CHANNELS = 8  # what a FLAC stream holds: per_speaker rows with more voices are errors
# a digest of everything the row's audio depends on (text, reference, settings, model): a
# rerun redoes a row whose digest changed
CONTENT_HASH = "content_hash"

BATCH_TYPE = pa.struct(
    [
        pa.field(BATCH_ID, pa.string()),
        pa.field(BATCH_ROWS, pa.int32()),
        pa.field(BATCH_STARTED_AT, pa.float64()),
        pa.field(BATCH_PREP_MS, pa.float64()),
        pa.field(BATCH_ENGINE_MS, pa.float64()),
        pa.field(BATCH_CODEC_MS, pa.float64()),
        pa.field(BATCH_ENCODE_MS, pa.float64()),
        pa.field(BATCH_CHECKS_MS, pa.float64()),
        pa.field(BATCH_ACTOR_INIT_MS, pa.float64()),
        pa.field(BATCH_PEAK_RSS_MB, pa.float64()),
        pa.field(BATCH_KV_BYTES, pa.int64()),
        pa.field(BATCH_ENGINE_STEPS, pa.float64()),
        pa.field(BATCH_SLOT_ROWS, pa.float64()),
        pa.field(BATCH_SLOTS, pa.int32()),
        pa.field(BATCH_SLOT_OCCUPANCY, pa.float64()),
        pa.field(BATCH_ENGINE_BUSY, pa.float64()),
        pa.field(BATCH_ACTOR_MODEL_BUSY_MS, pa.float64()),
    ]
)
TURN_TYPE = pa.struct(
    [
        pa.field(TURN_SPEAKER, pa.int32()),
        pa.field(TURN_TEXT, pa.string()),
        pa.field(TURN_START_S, pa.float64()),
        pa.field(TURN_END_S, pa.float64()),
        pa.field(TURN_SPEAKER_SIMILARITY, pa.float64()),
    ]
)
AUDIO_TYPE = pa.struct([pa.field(AUDIO_BYTES, pa.binary()), pa.field(AUDIO_PATH, pa.string())])

OUTPUT_SCHEMA = pa.schema(
    [
        pa.field(ID, pa.string()),
        pa.field(STATUS, pa.string(), nullable=False),
        pa.field(ERROR, pa.string()),
        pa.field(STOP_REASON, pa.string()),
        pa.field(AUDIO, AUDIO_TYPE),
        pa.field(SAMPLE_RATE, pa.int32()),
        pa.field(N_FRAMES, pa.int32()),
        pa.field(AUDIO_SECONDS, pa.float64()),
        pa.field(CODES, pa.list_(pa.list_(pa.int16()))),  # [num_codebooks][frames]
        pa.field(PROMPT_TOKENS, pa.int32()),
        pa.field(QUEUE_MS, pa.float64()),
        pa.field(PREFILL_MS, pa.float64()),
        pa.field(DECODE_MS, pa.float64()),
        pa.field(CODEC_MS, pa.float64()),
        pa.field(TOTAL_MS, pa.float64()),
        pa.field(RTF, pa.float64()),  # compute seconds per second of audio
        pa.field(ACTOR, pa.string()),
        pa.field(NODE, pa.string()),
        pa.field(DEVICE, pa.string()),
        pa.field(MODEL, pa.string()),
        pa.field(RUN, pa.string()),
        pa.field(FINISHED_AT, pa.float64()),
        pa.field(BATCH, BATCH_TYPE),
        pa.field(SEED, pa.int64()),
        pa.field(MAX_FRAMES, pa.int32()),
        pa.field(TEMPERATURE, pa.float64()),
        pa.field(TOP_P, pa.float64()),
        pa.field(TOP_K, pa.int32()),
        pa.field(REPETITION_PENALTY, pa.float64()),
        pa.field(RAS_WINDOW, pa.int32()),
        pa.field(TEXT, pa.string()),
        pa.field(SPEAKER, pa.string()),
        pa.field(REFERENCE, pa.string()),
        pa.field(SEGMENTS, pa.int32()),
        pa.field(SEGMENT_FRAMES, pa.list_(pa.int32())),
        pa.field(SEGMENT_STOP_REASONS, pa.list_(pa.string())),
        pa.field(TRUNCATED_SEGMENTS, pa.list_(pa.int32())),
        pa.field(TURNS, pa.list_(TURN_TYPE)),
        pa.field(RETRYABLE, pa.bool_()),
        pa.field(CONTENT_HASH, pa.string()),
        pa.field(ATTEMPTS, pa.int32()),
        pa.field(QUALITY_FLAGS, pa.list_(pa.string())),
        pa.field(DISCARDED_FRAMES, pa.int32()),
        pa.field(REPEAT_RATIO, pa.float64()),
        pa.field(SPEECH_RATE_S_PER_CHAR, pa.float64()),
        pa.field(SILENCE_RATIO, pa.float64()),
        pa.field(CLIPPED_RATIO, pa.float64()),
        pa.field(LOUDNESS_LUFS, pa.float64()),
        pa.field(ASR_TEXT, pa.string()),
        pa.field(ASR_LANGUAGE, pa.string()),
        pa.field(WER, pa.float64()),
        pa.field(CER, pa.float64()),
        pa.field(WER_RECIPE, pa.string()),
        pa.field(SPEAKER_SIMILARITY, pa.float64()),
        pa.field(MOS, pa.float64()),
        pa.field(MOS_SIG, pa.float64()),
        pa.field(MOS_BAK, pa.float64()),
    ]
)

# what summaries and progress read: everything but the heavy audio and codes
METADATA_COLUMNS = [f.name for f in OUTPUT_SCHEMA if f.name not in (AUDIO, CODES)]


def output_table(rows: list[dict]) -> pa.Table:
    """Rows (dicts keyed by output column; missing keys are null) -> a table of OUTPUT_SCHEMA."""
    return pa.Table.from_pylist(rows, schema=OUTPUT_SCHEMA)


def error_row(row_id: Optional[str], message: str, **fields) -> dict:
    return {ID: row_id, STATUS: STATUS_ERROR, ERROR: message, **fields}
