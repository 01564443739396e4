"""The pieces that live once and serve several places: the model building blocks shared by the
dual-AR model and the codec, the S2 key names shared by the tiny writer and the loader, files
written whole, and the duration format."""

from __future__ import annotations

import os
import stat

import pytest
import torch

from actors.engine.checkpoint import S2_FAST_PREFIX, S2_SLOW_PREFIX, _canonical_names, s2_stored_name
from actors.files import atomic_open, write_atomically
from actors.modules import RMSNorm, apply_rope, rope_rotation, rope_table
from pipeline.report.markup import format_duration


def test_rope_table_is_upstreams_bfloat16_table():
    table = rope_table(300, 16, 10000.0)
    assert table.shape == (300, 8, 2) and table.dtype == torch.bfloat16
    angles = torch.arange(300, dtype=torch.float64)[:, None] / 10000.0 ** (torch.arange(0, 16, 2) / 16)
    exact = torch.stack([angles.cos(), angles.sin()], dim=-1)
    assert torch.allclose(table.double(), exact, atol=4e-3)  # bfloat16 holds ~3 digits
    with torch.inference_mode():
        built = rope_table(4, 16, 10000.0)
    assert not built.is_inference()  # cacheable across inference and ordinary calls


def test_rope_rotation_holds_the_tables_values_per_element():
    table = rope_table(7, 8, 10000.0).float()
    rotation = rope_rotation(7, 8, 10000.0)
    assert rotation.shape == (7, 2, 8) and rotation.dtype == torch.float32
    assert torch.equal(rotation[:, 0, 0::2], table[..., 0]) and torch.equal(rotation[:, 0, 1::2], table[..., 0])
    assert torch.equal(rotation[:, 1, 0::2], -table[..., 1]) and torch.equal(rotation[:, 1, 1::2], table[..., 1])


def test_apply_rope_rotates_adjacent_pairs_per_row_or_shared():
    x = torch.randn(2, 5, 3, 8)
    rotation = rope_rotation(5, 8, 10000.0)
    shared = apply_rope(x, rotation)
    per_row = apply_rope(x, rotation.unsqueeze(0).expand(2, -1, -1, -1))
    assert torch.equal(shared, per_row)
    # upstream's formula on the bf16 table, bit for bit: (even*cos - odd*sin, odd*cos + even*sin)
    table = rope_table(5, 8, 10000.0).float()[None, :, None]  # [1, T, 1, D/2, 2]
    pairs = x.reshape(2, 5, 3, 4, 2)
    even, odd, cos, sin = pairs[..., 0], pairs[..., 1], table[..., 0], table[..., 1]
    upstream = torch.stack([even * cos - odd * sin, odd * cos + even * sin], dim=-1).flatten(3)
    assert torch.equal(shared, upstream)
    # position 0 is the identity; a pair keeps its length
    assert torch.allclose(shared[:, 0], x[:, 0])
    rotated = shared.reshape(2, 5, 3, 4, 2)
    assert torch.allclose(pairs.norm(dim=-1), rotated.norm(dim=-1), atol=1e-2)  # bf16 cos/sin
    assert apply_rope(x.to(torch.bfloat16), rotation).dtype == torch.bfloat16


def test_rms_norm_normalises_in_float32_then_weights():
    norm = RMSNorm(4, eps=1e-6)
    with torch.no_grad():
        norm.weight.copy_(torch.tensor([1.0, 2.0, 3.0, 4.0]))
    x = torch.tensor([[3.0, -3.0, 3.0, -3.0]], dtype=torch.bfloat16)
    out = norm(x)
    assert out.dtype == torch.float32  # bf16 normalised value times the float32 weight
    assert torch.allclose(out, torch.tensor([[1.0, -2.0, 3.0, -4.0]]), atol=1e-2)


def test_s2_key_names_round_trip():
    names = ["layers.0.attention.wqkv.weight", "fast_layers.1.feed_forward.w1.weight", "codebook_embeddings.weight"]
    stored = [s2_stored_name(n) for n in names]
    assert stored == [
        S2_SLOW_PREFIX + names[0],
        S2_FAST_PREFIX + "layers.1.feed_forward.w1.weight",
        S2_FAST_PREFIX + names[2],
    ]
    assert [_canonical_names(stored)[s] for s in stored] == names


def test_files_are_written_whole_or_not_at_all(tmp_path):
    target = tmp_path / "summary.json"
    write_atomically(target, "old")
    with pytest.raises(RuntimeError):
        with atomic_open(target, "w") as f:
            f.write("half of the new")
            raise RuntimeError("the writer died")
    assert target.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["summary.json"]
    write_atomically(target, b"new")
    assert target.read_bytes() == b"new"
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(target.stat().st_mode) == 0o666 & ~umask  # a shareable file, not a private temp
    with pytest.raises(ValueError, match="whole files"):
        with atomic_open(target, "a"):
            pass


@pytest.mark.parametrize(
    "seconds, text",
    [(None, "–"), (float("nan"), "–"), (4.254, "4.25 s"), (12.34, "12.3 s"), (185, "3m 05s"), (3723, "1h 02m 03s")],
)
def test_one_duration_format(seconds, text):
    assert format_duration(seconds) == text
