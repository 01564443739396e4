"""Reference clips: a row's reference columns read into a `RefSpec` (paths and URIs confined to
the root, sizes checked before anything is read, ref_codes checked against the model), and
specs resolved to codes: from the actor's LRU cache, or read (with a deadline) and encoded in
codec batches. A clip that fails fails only the rows that use it."""

from __future__ import annotations

import hashlib
import math
import os
import threading
import time
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from actors import schema as S
from actors.alone import each_alone
from actors.engine.dialogue import voice_text_problem
from actors.lru import LRU
from actors.storage import StoreError
from actors.synth.job_settings import uri_scheme
from actors.synth.jobs import Failure
from actors.synth.rows import RefSpec, RowError, VoiceSpec
from actors.synth.settings import ActorSettings


class ReferenceTooLarge(ValueError):
    def __init__(self, source: str, size: int, limit: int):
        super().__init__(f"{source} is {size} bytes; the limit is {limit} (data.max_reference_bytes)")


@dataclass(frozen=True)
class ClipColumns:
    """What a clip's three ways of being given are called in messages."""

    audio: str
    path: str
    codes: str


REF_CLIP = ClipColumns(S.REF_AUDIO, S.REF_AUDIO_PATH, S.REF_CODES)
# a dialogue row gives its voices in `voices` only: any of these beside it is an error
REF_COLUMNS = (S.REF_AUDIO, S.REF_AUDIO_PATH, S.REF_CODES, S.REF_TEXT, S.REF_ID)


@dataclass(frozen=True)
class CodecShape:
    """What a reference must match: the model's codebooks and the codec's frame rate."""

    codebooks: int
    codebook_size: int
    sample_rate: int
    frame_length: int


@dataclass(frozen=True)
class Resolved:
    """A reference key's outcome: its codes, or the failure of every row using it; `encode_ms`
    is the key's share of the encode call (its rows split it)."""

    codes: Optional[np.ndarray] = None
    failure: Optional[Failure] = None
    encode_ms: float = 0.0


def is_transient(error: BaseException) -> bool:
    """A failure a rerun may not meet again: I/O (an object store's too), a timeout, a clip that
    is not there (yet)."""
    return isinstance(error, (OSError, TimeoutError, StoreError)) or "not found" in str(error)


class ReferenceStore:
    """One per actor, shared by the callers of concurrent blocks (the cache is locked)."""

    def __init__(self, settings: ActorSettings, codec_runner: Any, shape: CodecShape):
        self.settings = settings
        self.codec_runner = codec_runner  # the codec, or its child process (engine.codec_process)
        self.shape = shape
        self.cache: LRU[np.ndarray] = LRU(settings.engine.reference_cache)
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.cache)

    @property
    def root(self) -> Optional[str]:
        """Where every clip path and URI must lie: data.audio_root, else the input's directory."""
        return self.settings.data.audio_root or self.settings.run.input_dir

    # ---- reading a row's reference columns (the caller's thread) ---------------------
    def voices(self, values: dict) -> tuple[VoiceSpec, ...]:
        """The row's voices: each entry of its `voices` list (a dialogue row), else the one voice
        its ref_* columns give (none without a reference); RowError naming a bad one."""
        listed = values.get(S.VOICES)
        if not listed:  # null or []: a plain row
            ref = self.spec(values)
            if ref is None:
                if values.get(S.REF_TEXT):
                    raise RowError(
                        "ref_text was given without a reference clip/codes (ref_audio, ref_audio_path or ref_codes)"
                    )
                return ()
            return (VoiceSpec(ref, values.get(S.REF_TEXT) or ""),)
        both = [column for column in REF_COLUMNS if values.get(column) is not None]
        if both:
            raise RowError(
                f"the row sets both voices and {', '.join(both)}: a dialogue row's voices are all in `voices` "
                f"(voices[0] is <|speaker:0|>); move the reference into voices[0] or leave voices null"
            )
        limit = self.settings.data.max_voices
        if len(listed) > limit:
            raise RowError(f"the row has {len(listed)} voices, more than data.max_voices={limit}; split the dialogue")
        if self.settings.output.channels == S.CHANNELS_PER_SPEAKER and len(listed) > S.FLAC_MAX_CHANNELS:
            raise RowError(
                f"the row has {len(listed)} voices, but output.channels=per_speaker gives each its channel and a "
                f"FLAC file holds at most {S.FLAC_MAX_CHANNELS}; split the dialogue or use output.channels=mono"
            )
        return tuple(self._voice(voice, index) for index, voice in enumerate(listed))

    def _voice(self, voice: Any, index: int) -> VoiceSpec:
        name = f"voices[{index}]"
        if not isinstance(voice, dict):
            raise RowError(f"{name} is null: give every voice a clip (audio or audio_path) or its codes")
        ref = self._clip(
            voice.get(S.VOICE_AUDIO),
            voice.get(S.VOICE_AUDIO_PATH),
            voice.get(S.VOICE_CODES),
            ClipColumns(f"{name}.{S.VOICE_AUDIO}", f"{name}.{S.VOICE_AUDIO_PATH}", f"{name}.{S.VOICE_CODES}"),
        )
        if ref is None:
            raise RowError(
                f"{name} has no audio, audio_path or codes: give it a clip, or its codes (python -m pipeline.encode_refs)"
            )
        text = voice.get(S.VOICE_TEXT) or ""
        problem = voice_text_problem(text, index) if isinstance(text, str) else None
        if problem:
            raise RowError(problem)
        return VoiceSpec(ref, text)

    def spec(self, values: dict) -> Optional[RefSpec]:
        """The clip of the row's ref_* columns (None when it has none); RowError for a bad one."""
        ref = self._clip(values.get(S.REF_AUDIO), values.get(S.REF_AUDIO_PATH), values.get(S.REF_CODES), REF_CLIP)
        # rows naming the same ref_id share one clip by contract, so one encode serves them all;
        # a `speaker` label is not trusted that far (tables often give each row its own clip)
        shared_id = values.get(S.REF_ID)
        if ref is None or ref.codes is not None or not shared_id:
            return ref
        return RefSpec(f"ref_id:{shared_id}", source=ref.source)

    def _clip(self, audio_bytes: Any, audio_path: Any, codes: Any, columns: ClipColumns) -> Optional[RefSpec]:
        """A clip given as codes (nothing read, nothing encoded), bytes or a path/URI (confined);
        None when none is given. `columns` names the values in messages."""
        data = self.settings.data
        if codes is not None:  # already encoded: no clip is read, nothing is encoded
            codes = self._check_codes(codes, columns.codes)
            digest = hashlib.blake2b(str(codes.shape).encode() + codes.tobytes(), digest_size=16)
            return RefSpec("codes:" + digest.hexdigest(), codes=codes)  # same codes, same prompt prefix
        if audio_bytes is not None:
            if len(audio_bytes) > data.max_reference_bytes:
                raise RowError(
                    f"{columns.audio} is {len(audio_bytes)} bytes; the limit is {data.max_reference_bytes} "
                    f"(data.max_reference_bytes)"
                )
            source = bytes(audio_bytes)
            return RefSpec("bytes:" + hashlib.blake2b(source, digest_size=16).hexdigest(), source=source)
        if audio_path is None:
            return None
        if not audio_path.strip():
            raise RowError(f"{columns.path} is empty")
        scheme = uri_scheme(audio_path)
        if scheme is not None and scheme != "file" and scheme not in data.uri_schemes:
            raise RowError(
                f"{columns.path} {audio_path!r}: URI scheme {scheme!r} is not allowed "
                f"(data.uri_schemes={list(data.uri_schemes)})"
            )
        source = self.confine(audio_path, columns.path)
        return RefSpec("path:" + source, source=source)

    def _check_codes(self, value: Any, column: str) -> np.ndarray:
        """A codes cell as the codec's codes array: [num_codebooks][frames] integers within
        the codebooks, at most max_reference_seconds long; RowError naming what is off."""
        shape, seconds = self.shape, self.settings.data.max_reference_seconds
        expected = f"{column} must be [{shape.codebooks}][frames] integers (python -m pipeline.encode_refs makes them)"
        try:
            codes = np.asarray(value)
        except ValueError:  # ragged lists
            raise RowError(f"{expected}; its codebooks differ in length") from None
        if codes.ndim != 2 or codes.shape[0] != shape.codebooks:
            raise RowError(f"{expected}; got shape {list(codes.shape)}")
        if codes.shape[1] == 0:
            raise RowError(f"{column} has no frames")
        if not np.issubdtype(codes.dtype, np.integer):
            raise RowError(f"{expected}; got {codes.dtype} values")
        if codes.min() < 0 or codes.max() >= shape.codebook_size:
            raise RowError(f"{column} values must lie in [0, {shape.codebook_size}) (the model's codebook size)")
        frames_limit = math.ceil(seconds * shape.sample_rate / shape.frame_length)
        if codes.shape[1] > frames_limit:
            raise RowError(
                f"{column} has {codes.shape[1]} frames, more than data.max_reference_seconds="
                f"{seconds:g} allows ({frames_limit})"
            )
        return codes.astype(np.int64)

    def confine(self, path: str, column: str = S.REF_AUDIO_PATH) -> str:
        """The clip a path column names, as an absolute path or URI inside the root; RowError
        for anything outside it. Runs before any filesystem access, so a row cannot learn what
        exists outside the root."""
        root = self.root
        outside = RowError(
            f"{column} {path!r} is outside the allowed directory {root} (data.audio_root, by default "
            f"the input's directory); move the clip under it or set data.audio_root"
        )
        if path.startswith("file://"):
            path = path[len("file://") :]
        if root is None:
            raise outside
        if uri_scheme(path) is not None or uri_scheme(root) is not None:
            if uri_scheme(path) is None:  # relative to a URI root
                if path.startswith("/"):
                    raise outside
                path = root.rstrip("/") + "/" + path
            parts = path.split("://", 1)[1].split("/")
            if ".." in parts or "." in parts or not path.startswith(root.rstrip("/") + "/"):
                raise outside
            return path
        base = os.path.realpath(os.path.expanduser(root))
        candidate = os.path.realpath(os.path.join(base, os.path.expanduser(path)))
        if os.path.commonpath([base, candidate]) != base:
            raise outside
        return candidate

    # ---- resolving specs to codes ---------------------------------------------------
    def cached(self, key: str) -> Optional[np.ndarray]:
        with self._lock:  # the callers of concurrent blocks share the cache
            return self.cache.get(key)

    def resolve(self, refs: list[RefSpec]) -> dict[str, Resolved]:
        """Each distinct key's codes or failure: cached ones as they are, the rest read (each
        within data.reference_timeout_s) and encoded together, then cached."""
        resolved: dict[str, Resolved] = {}
        waves: dict[str, np.ndarray] = {}
        for ref in {ref.key: ref for ref in refs}.values():
            cached = self.cached(ref.key)  # another block may have encoded it meanwhile
            if ref.codes is not None or cached is not None:
                resolved[ref.key] = Resolved(codes=ref.codes if ref.codes is not None else cached)
                continue
            try:
                waves[ref.key] = self.load_in_time(ref.source)
            except Exception as e:  # ReferenceAudioError, OSError, decoder errors: all per clip
                resolved[ref.key] = Resolved(failure=Failure(f"reference audio: {e}", is_transient(e)))
        if waves:
            resolved.update(self._encode(waves))
        return resolved

    def _encode(self, waves: dict[str, np.ndarray]) -> dict[str, Resolved]:
        started = time.perf_counter()
        rows = self.settings.engine.codec_batch_rows
        codes = each_alone(
            list(waves.values()),
            lambda batch: self.codec_runner.encode_batch(batch, max_batch_rows=rows),
            lambda wave, e: Failure(f"reference encode: {e!r}", retryable=True),
            note="reference encode failed; encoding each clip alone",
        )
        share_ms = (time.perf_counter() - started) * 1000.0 / len(waves)
        out = {}
        for key, key_codes in zip(waves, codes):
            if isinstance(key_codes, Failure):
                out[key] = Resolved(failure=key_codes)
                continue
            with self._lock:
                self.cache.put(key, key_codes)
            out[key] = Resolved(codes=key_codes, encode_ms=share_ms)
        return out

    def load_in_time(self, source: Any) -> np.ndarray:
        """`load` with a deadline: a fetch from an unreachable store or a decoder that hangs
        fails its rows (retryable) instead of holding the actor and its block. The worker thread
        cannot be killed; it is a daemon and ends with the process."""
        outcome: dict = {}

        def work():
            try:
                outcome["wave"] = self.load(source)
            except BaseException as e:  # handed to the caller below
                outcome["error"] = e

        timeout = self.settings.data.reference_timeout_s
        worker = threading.Thread(target=work, name="chorus-reference", daemon=True)
        worker.start()
        worker.join(timeout)
        if worker.is_alive():
            raise TimeoutError(
                f"reading and decoding the clip took longer than {timeout:g} s (data.reference_timeout_s)"
            )
        if "error" in outcome:
            raise outcome["error"]
        return outcome["wave"]

    def load(self, source: Any) -> np.ndarray:
        """A clip (bytes, a confined path, a URI) as float32 samples at the codec's rate."""
        from actors import audio

        data = self.settings.data
        limit = data.max_reference_bytes
        if isinstance(source, str) and uri_scheme(source) is not None:  # s3://, gs://, ...: fetch the bytes
            from actors.storage import open_uri

            filesystem, path = open_uri(source)
            size = filesystem.get_file_info(path).size
            if size is not None and size > limit:
                raise ReferenceTooLarge(source, size, limit)
            with filesystem.open_input_file(path) as f:
                source = f.read(limit + 1)
            if len(source) > limit:
                raise ReferenceTooLarge(path, len(source), limit)
        if isinstance(source, str):  # a path confine() has placed inside the (local) root
            try:
                size = os.stat(source).st_size
            except OSError:
                size = 0  # missing or unreadable: the loader says which
            if size > limit:
                raise ReferenceTooLarge(source, size, limit)
        wave = audio.load_reference_audio(
            source,
            target_sample_rate=self.shape.sample_rate,
            max_seconds=data.max_reference_seconds,
            root=self.root if isinstance(source, str) else None,
        )
        return np.asarray(wave, dtype=np.float32)
