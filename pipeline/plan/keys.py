"""What planning needs of each input row, from one fragment at a time wherever planning puts
it (pipeline/plan/decide.py: a Ray Data task, or in-process for a small job): its id and the
id's problems, its content hash (everything its audio depends on), the clip it names, its
text length. KEY_SCHEMA is the keys' table."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from typing import Optional

import pyarrow as pa
import pyarrow.compute as pc

from actors import schema as S
from actors.engine.segment import SPEAKER_TAG

from ..location import is_local
from .estimate import RowEstimate
from .inputs import Fragment


def _value_bytes(value) -> bytes:
    """A typed, unambiguous encoding of one cell for hashing."""
    if value is None:
        return b"n"
    if isinstance(value, (bytes, bytearray, memoryview)):
        return b"b" + hashlib.blake2b(bytes(value), digest_size=16).digest()
    if isinstance(value, str):
        return b"s" + value.encode("utf-8", "surrogatepass")
    return b"v" + repr(value).encode("utf-8")


class _ClipStat:
    """path + mtime + size of a local reference file (cached: many rows share one clip), so a
    clip replaced under the same name changes the rows that use it; a URI counts by name."""

    def __init__(self, audio_root: str | None, input_dir: str | None):
        self.audio_root, self.input_dir = audio_root, input_dir
        self.cache: dict[str, bytes] = {}

    def __call__(self, path: str) -> bytes:
        if path in self.cache:
            return self.cache[path]
        stamp = b""
        if is_local(path):
            local = path[len("file://") :] if path.startswith("file://") else path
            local = os.path.expanduser(local)
            root = self.audio_root if self.audio_root is not None else self.input_dir
            if not os.path.isabs(local) and root is not None:
                local = os.path.join(root, local)
            try:
                st = os.stat(local)
                stamp = f"|{st.st_mtime_ns}|{st.st_size}".encode()
            except OSError:
                stamp = b"|missing"
        self.cache[path] = stamp
        return stamp


FRAGMENT = "_fragment"  # int32: Fragment.index
ROW = "_row"  # int64: the row within its file (for messages: "bad.parquet row 7")
PROBLEM = "_problem"  # why the id cannot name an output row (null when it can)
REASON = "_reason"  # the problem's kind, for the counts: null_id, malformed_id, long_id, ...
CLIP = "_clip"  # binary: which reference clip the row names (see _clip_identity)
TEXT_CHARS = "_text_chars"  # int64
VOICES = "_voices"  # int32: a dialogue row's voices (0: a plain row)
TURNS = "_turns"  # int32: a dialogue row's speaker turns (0: a plain row)
# as the run will plan the row (pipeline/plan/estimate.py; 0 when planning without an estimate)
SEGMENTS = "_segments"  # int32
BUDGET_FRAMES = "_budget_frames"  # int64: its segments' budgets summed
SPEECH_FRAMES = "_speech_frames"  # int64: real speech of its text
ESTIMATE_COLUMNS = {SEGMENTS: "segments", BUDGET_FRAMES: "budget_frames", SPEECH_FRAMES: "speech_frames"}
KEY_SCHEMA = pa.schema(
    [
        (S.ID, pa.string()),
        (S.CONTENT_HASH, pa.string()),
        (S.REF_ID, pa.string()),
        (CLIP, pa.binary()),
        (PROBLEM, pa.string()),
        (REASON, pa.string()),
        (FRAGMENT, pa.int32()),
        (ROW, pa.int64()),
        (TEXT_CHARS, pa.int64()),
        (VOICES, pa.int32()),
        (TURNS, pa.int32()),
        (SEGMENTS, pa.int32()),
        (BUDGET_FRAMES, pa.int64()),
        (SPEECH_FRAMES, pa.int64()),
    ]
)


def _reason(problem: str) -> str:
    if problem == "id is null":
        return "null_id"
    if "characters long" in problem:
        return "long_id"
    return "malformed_id"


@dataclass(frozen=True)
class RowHasher:
    """Everything a row's content hash depends on besides the row: picklable, so each planning
    task builds its own (its clip cache lives as long as the task). `channels` (output.channels)
    counts for dialogue rows only: a plain row's audio is mono either way."""

    settings_digest: str
    audio_root: Optional[str]
    input_dir: Optional[str]
    channels: str = S.CHANNELS_MONO

    def hashes(self, table: pa.Table) -> list[Optional[str]]:
        """Each row's digest of everything its audio depends on: every input column (clip
        bytes by hash, clip paths with the file's mtime and size, a dialogue row's every voice
        alike) and the run's settings + model fingerprint; None for a row whose id is unusable.
        `table` has canonical names."""
        clip_stat = _ClipStat(self.audio_root, self.input_dir)
        order = sorted(table.column_names)
        columns = [(name.encode() + b"=", table.column(name).to_pylist(), name) for name in order]
        ids = table.column(S.ID).to_pylist()
        out: list[Optional[str]] = []
        for r, row_id in enumerate(ids):
            if S.id_problem(row_id) is not None:
                out.append(None)
                continue
            digest = hashlib.blake2b(self.settings_digest.encode(), digest_size=16)
            for prefix, values, name in columns:
                value = values[r]
                if name == S.VOICES:
                    digest.update(prefix + _voices_bytes(value, clip_stat, self.channels) + b"\x00")
                    continue
                digest.update(prefix + _value_bytes(value) + b"\x00")
                if name == S.REF_AUDIO_PATH:
                    digest.update(_path_stamp(value, clip_stat))
            out.append(digest.hexdigest())
        return out


def _path_stamp(value, clip_stat: _ClipStat) -> bytes:
    return clip_stat(value) if isinstance(value, str) else b""


def _voices_bytes(voices, clip_stat: _ClipStat, channels: str) -> bytes:
    """A voices cell for hashing: each voice's fields (its clip by hash, its path with the
    file's mtime and size), and the channels its audio gets; null or [] as a plain row's."""
    if not voices:
        return _value_bytes(None)
    parts = [f"channels:{channels}".encode()]
    for voice in voices:
        if not isinstance(voice, dict):
            parts.append(_value_bytes(voice))
            continue
        for key in sorted(voice):
            value = voice[key]
            stamp = _path_stamp(value, clip_stat) if key == S.VOICE_AUDIO_PATH else b""
            parts.append(key.encode() + b":" + _value_bytes(value) + stamp)
        parts.append(b"|")
    return b"v" + hashlib.blake2b(b"\x00".join(parts), digest_size=16).digest()


def _text_chars(texts) -> pa.Array:
    """Characters per text (bytes for a binary column, which may hold invalid UTF-8)."""
    if len(texts) == 0:
        return pa.array([], pa.int64())
    if pa.types.is_string(texts.type) or pa.types.is_large_string(texts.type):
        return pc.fill_null(pc.utf8_length(texts), 0)
    return pc.fill_null(pc.binary_length(texts), 0)


def annotate(
    table: pa.Table, fragment: Fragment, hasher: RowHasher, estimate: Optional[RowEstimate] = None
) -> pa.Table:
    """One fragment's rows (canonical names) -> their keys (KEY_SCHEMA); with `estimate`, each
    row's segments and frames as the run will plan them."""
    raw_ids = table.column(S.ID).to_pylist()
    problems = [S.id_problem(value) for value in raw_ids]
    ids = [value if isinstance(value, str) else (None if value is None else str(value)) for value in raw_ids]
    n = table.num_rows
    names = table.column_names
    chars = _text_chars(table.column(S.TEXT))
    return pa.table(
        {
            S.ID: pa.array(ids, pa.string()),
            S.CONTENT_HASH: pa.array(hasher.hashes(table), pa.string()),
            S.REF_ID: table.column(S.REF_ID).cast(pa.string()) if S.REF_ID in names else pa.nulls(n, pa.string()),
            CLIP: pa.array(_clip_identities(table), pa.binary()),
            PROBLEM: pa.array(problems, pa.string()),
            REASON: pa.array([None if p is None else _reason(p) for p in problems], pa.string()),
            FRAGMENT: pa.array([fragment.index] * n, pa.int32()),
            ROW: pa.array(range(fragment.first_row, fragment.first_row + n), pa.int64()),
            TEXT_CHARS: pc.cast(chars, pa.int64()),
            **_dialogue_counts(table),
            **_estimates(table, estimate),
        },
        schema=KEY_SCHEMA,
    )


def _estimates(table: pa.Table, estimate: Optional[RowEstimate]) -> dict:
    if estimate is None:
        return {name: pa.array([0] * table.num_rows, KEY_SCHEMA.field(name).type) for name in ESTIMATE_COLUMNS}
    columns = estimate.columns(table)
    return {name: pa.array(columns[key], KEY_SCHEMA.field(name).type) for name, key in ESTIMATE_COLUMNS.items()}


def _dialogue_counts(table: pa.Table) -> dict:
    """Per row: its voices (the length of its `voices` list) and, for a dialogue row, its turns
    (its speaker tags; an untagged one-voice text is one turn), for the plan's sums."""
    n = table.num_rows
    if S.VOICES not in table.column_names or pa.types.is_null(table.column(S.VOICES).type):
        zeros = pa.array([0] * n, pa.int32())
        return {VOICES: zeros, TURNS: zeros}
    voices = pc.cast(pc.fill_null(pc.list_value_length(table.column(S.VOICES)), 0), pa.int32())
    tags = pc.fill_null(pc.count_substring_regex(table.column(S.TEXT), SPEAKER_TAG.pattern), 0)
    turns = pc.if_else(pc.greater(voices, 0), pc.max_element_wise(tags, 1), 0)
    return {VOICES: voices, TURNS: pc.cast(turns, pa.int32())}


def _clip_identities(table: pa.Table) -> list[Optional[bytes]]:
    """Which clip each row names: its ref_audio bytes (by hash), else its ref_audio_path."""
    n, names = table.num_rows, table.column_names
    audio = table.column(S.REF_AUDIO).to_pylist() if S.REF_AUDIO in names else [None] * n
    paths = table.column(S.REF_AUDIO_PATH).to_pylist() if S.REF_AUDIO_PATH in names else [None] * n
    return [
        b"bytes:" + hashlib.blake2b(bytes(a), digest_size=16).digest()
        if a is not None
        else (None if p is None else b"path:" + p.encode("utf-8", "surrogatepass"))
        for a, p in zip(audio, paths)
    ]


def describe_clip(identity: bytes) -> str:
    kind, _, value = identity.partition(b":")
    if kind == b"path":
        return f"ref_audio_path {value.decode('utf-8', 'replace')!r}"
    return f"ref_audio bytes (blake2b {value.hex()[:12]})"
