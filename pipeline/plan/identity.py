"""What a run's output is bound to: the model's fingerprint (its files' hashes, cached per
machine), the digest of the settings a row's audio depends on, and the identity record that
ties an output to one model (pipeline/output/layout.py claim)."""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import asdict

import pyarrow.fs as pafs

from actors.demo import cache_root
from actors.files import write_atomically
from actors.synth.budget import ACCEPT
from actors.synth.settings import ModelSettings

from ..config import REPO_ROOT, ChorusConfig
from ..location import open_location
from .inputs import InputScan

log = logging.getLogger("chorus")

# the built-in demo is built from these sources (actors/synth/demo_models.py), so they are its weights
_DEMO_SOURCES = ("actors/synth/demo_models.py", "actors/engine/tiny.py", "actors/codec/tiny.py")
# the settings a row's audio depends on (the rest -- batching, threads -- leave the codes of a
# row unchanged, which the determinism tests check). compile is one: a compiled frame's fused
# kernels keep bfloat16 intermediates in float32 where the eager frame rounds them
_ROW_SETTINGS = {
    "engine": ("max_tokens", "stop_on_eos", "compile"),
    "data": (
        "audio_root",
        "max_reference_seconds",
        "max_reference_bytes",
        "max_text_chars",
        "max_text_bytes",
        "allow_special_tokens",
    ),
    "long_form": ("segment_bytes", "max_turns", "history_fraction"),
}
# the model's frame budget (model.budget), hashed where engine.* held it before it was the
# model's, under those keys (frames_per_byte as frames_per_char): the demo's rows, whose
# budgets these values still are, keep their hashes. `on_cut` counts only when it may regenerate
BUDGET_AS_HASHED = {"max_frames": "max_frames", "frames_per_char": "frames_per_byte", "min_frames": "min_frames"}
# whole-file hashes of model files, keyed by path, size and modification time: a multi-GB
# checkpoint is read once per machine, not at every run start
FILE_HASH_CACHE = "file-hashes.json"  # in the cache directory (actors/demo.py cache_root: $CHORUS_CACHE)
_FILE_HASH_CACHE_ENTRIES = 4096


def _file_hashes(fs, files: list) -> list[str]:
    """Each file's content hash (blake2b of every byte), from the cache when its path, size
    and modification time are unchanged."""
    cache_file = cache_root() / FILE_HASH_CACHE
    try:
        cache = json.loads(cache_file.read_text())
        cache = cache if isinstance(cache, dict) else {}
    except (OSError, ValueError):
        cache = {}
    hashes, fresh = [], False
    for f in files:
        key = f"{fs.type_name}:{f.path}|{f.size}|{f.mtime_ns}"
        if key not in cache:
            digest = hashlib.blake2b(digest_size=16)
            with fs.open_input_stream(f.path) as handle:
                while chunk := handle.read(8 << 20):
                    digest.update(chunk)
            cache[key], fresh = digest.hexdigest(), True
        hashes.append(cache[key])
    if fresh:
        try:
            cache_file.parent.mkdir(parents=True, exist_ok=True)
            kept = dict(list(cache.items())[-_FILE_HASH_CACHE_ENTRIES:])
            write_atomically(str(cache_file), json.dumps(kept))
        except OSError as e:  # a read-only home: hash again next time
            log.warning("could not save file hashes to %s: %r", cache_file, e)
    return hashes


def _fingerprint_location(digest, location: str) -> None:
    fs, path = open_location(location)
    info = fs.get_file_info(path)
    if info.type == pafs.FileType.Directory:
        entries = [f for f in fs.get_file_info(pafs.FileSelector(path, recursive=True)) if f.type == pafs.FileType.File]
    elif info.type == pafs.FileType.File:
        entries = [info]
    else:
        digest.update(f"missing:{location}".encode())
        return
    entries.sort(key=lambda e: e.path)
    for f, content in zip(entries, _file_hashes(fs, entries)):
        digest.update(f"{f.path[len(path) :]}|{f.size}|{content}|".encode())


def model_fingerprint(model: ModelSettings) -> str:
    """What the model's weights are, not what its folder is called: the content of every
    file of the checkpoint and codec (hashed whole; see _file_hashes for the cache)."""
    digest = hashlib.blake2b(digest_size=16)
    if model.checkpoint is None:
        digest.update(f"demo:{model.demo_family}\x00".encode())
        for source in _DEMO_SOURCES:
            digest.update(source.encode() + b"\x00" + (REPO_ROOT / source).read_bytes())
    else:
        _fingerprint_location(digest, model.checkpoint)
        codec = model.codec or model.checkpoint.rstrip("/") + "/codec.pth"
        _fingerprint_location(digest, codec)
    return digest.hexdigest()


def settings_digest(config: ChorusConfig, fingerprint: str) -> str:
    """One digest of every setting a row's audio depends on, the model's fingerprint included.
    The JSON hashed is what it was when the driver read the config as plain dicts (outputs
    written then keep their rows' hashes): a group's fields by name, `asdict`
    (tests/pipeline/test_typed_config.py compares the two)."""
    model = config.model
    relevant = {
        "model": {
            "name": model.name,
            "fingerprint": fingerprint,
            "dtype": model.dtype,
            "codec_dtype": model.codec_dtype,
        },
        "sampling": asdict(config.sampling),
        "keep_codes": config.output.keep_codes,
        **{group: {k: getattr(getattr(config, group), k) for k in keys} for group, keys in _ROW_SETTINGS.items()},
    }
    budget = config.model.budget
    relevant["engine"].update({hashed: getattr(budget, name) for hashed, name in BUDGET_AS_HASHED.items()})
    if budget.on_cut != ACCEPT:
        relevant["engine"]["on_budget_cut"] = budget.on_cut
    return hashlib.blake2b(json.dumps(relevant, sort_keys=True).encode(), digest_size=16).hexdigest()


def identity(model: ModelSettings, scan: InputScan) -> dict:
    """What an output belongs to: its model (`BOUND_KEYS`: a different model's rows cannot mix
    in), not its input's rows -- a dataset that grows, shrinks or moves keeps its output, each
    row decided by its id and content hash (pipeline/plan/rules.py). The input's location is
    recorded beside them for the messages only (a Ray Job reads its copy of the table from a
    new temporary directory each time)."""
    checkpoint = model.checkpoint
    return {
        "model": model.name,
        "checkpoint": os.path.basename(os.path.normpath(checkpoint)) if checkpoint else None,
        "input": scan.source,
    }
