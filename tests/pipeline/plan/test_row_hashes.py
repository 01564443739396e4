"""A row's content hash, what an honest resume compares (issue 14, findings 3 and 4): the
value outputs were written with, and every part of the input, the clip, the settings and
the model's weights that the audio depends on changing it."""

from __future__ import annotations

import json
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from actors.synth.settings import ModelSettings
from pipeline.config import compose_typed
from tests.helpers import hashes

PINNED_HASH = "a1f9b881d0134741b62ab6f37f6b236c"  # inputs.scan_rows of commit 87c655c, for the row below


def test_row_hashes_keep_their_values(tmp_path):
    # outputs written before planning moved to Ray Data resume: a row's hash is the digest it
    # always was (this value was computed by the driver-side scan of the starting commit)
    pq.write_table(pa.table({"id": ["a"], "text": ["hello"], "speaker": ["ada"]}), tmp_path / "in.parquet")
    assert hashes(tmp_path / "in.parquet", "settings-1") == {"a": PINNED_HASH}


def test_row_hashes_follow_text_reference_and_settings(tmp_path):
    clip = tmp_path / "clip.flac"
    clip.write_bytes(b"one clip")
    table = pa.table(
        {
            "id": ["a", "b", "c"],
            "text": ["first", "second", "third"],
            "ref_audio_path": [None, "clip.flac", None],
            "ref_audio": [None, None, b"bytes"],
        }
    )
    path = tmp_path / "in.parquet"
    pq.write_table(table, path)
    before = hashes(path, "settings-1")
    assert len(set(before.values())) == 3
    pq.write_table(table.set_column(1, "text", pa.array(["first", "second", "third, edited"])), path)
    clip.write_bytes(b"another clip, longer")  # same name, other content
    after = hashes(path, "settings-1")
    assert after["a"] == before["a"] and after["b"] != before["b"] and after["c"] != before["c"]
    other_settings = hashes(path, "settings-2")
    assert not set(other_settings.values()) & set(after.values())


@pytest.mark.parametrize(
    "override",
    [
        "sampling.temperature=0.5",
        "sampling.seed=3",
        "model.budget.max_frames=100",
        "engine.stop_on_eos=false",
        "data.max_text_chars=100",
        "data.allow_special_tokens=true",
        "long_form.segment_bytes=120",
        "long_form.max_turns=2",
        "long_form.history_fraction=0.25",
        "model.dtype=bfloat16",
        "model.codec_dtype=bfloat16",
        "output.keep_codes=false",
    ],
)
def test_every_setting_the_audio_depends_on_changes_the_row_hashes(override):
    # a rerun with any of these changed must redo its rows (their audio would differ)
    from pipeline.plan.identity import settings_digest

    base = settings_digest(compose_typed([]), "fingerprint")
    assert settings_digest(compose_typed([override]), "fingerprint") != base
    # ... and settings that leave a row's audio as it is do not
    for same in ("engine.max_rows=4", "cluster.num_actors=3", "engine.codec_batch_rows=2", "output.progress_bar=off"):
        assert settings_digest(compose_typed([same]), "fingerprint") == base, same


def test_model_fingerprint_sees_new_weights_under_the_same_name(tmp_path, monkeypatch):
    from pipeline.plan.identity import FILE_HASH_CACHE, model_fingerprint

    monkeypatch.setenv("CHORUS_CACHE", str(tmp_path / "cache"))
    cache_file = tmp_path / "cache" / FILE_HASH_CACHE
    ckpt = tmp_path / "my-model"
    ckpt.mkdir()
    (ckpt / "config.json").write_text('{"dim": 8}')
    weights = bytearray(os.urandom(3 << 20))
    (ckpt / "model.pth").write_bytes(bytes(weights))
    model = ModelSettings(checkpoint=str(ckpt))
    first = model_fingerprint(model)
    assert model_fingerprint(model) == first
    seen = {first}
    # fine-tuned: same size, other numbers -- near the start, in the middle, at the end
    for at in (10, len(weights) // 2 + 12345, len(weights) - 1):
        weights[at] ^= 0xFF
        (ckpt / "model.pth").write_bytes(bytes(weights))
        os.utime(ckpt / "model.pth", ns=(at, at))  # its own modification time: not a cached hash
        now = model_fingerprint(model)
        assert now not in seen, at
        seen.add(now)
    # the hashes are cached by path, size and modification time: a second look reads the
    # cache, not the file (a doctored entry shows through)
    cached = json.loads(cache_file.read_text())
    assert len(cached) == 2 + 3  # config.json + the first weights, then each edit's weights
    assert model_fingerprint(model) == now
    (latest,) = [key for key in cached if "model.pth" in key and key.endswith(f"|{len(weights) - 1}")]
    cache_file.write_text(json.dumps({**cached, latest: "doctored"}))
    assert model_fingerprint(model) != now
    assert model_fingerprint(ModelSettings(checkpoint=None)) == model_fingerprint(ModelSettings(checkpoint=None))
