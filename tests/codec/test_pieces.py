"""A row longer than one decode call may hold is decoded in pieces (actors/codec/pieces.py): the
decoder's reach, counted from its layers (the `codec` fixture: conftest.py), covers what a change really moves; the pieces' audio
is the whole row's; no decoder call holds more than the cap (or twice the reach, when the cap is
smaller than that)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from actors.codec import Codec
from actors.codec.pieces import receptive_steps
from helpers import VECTORS, random_codes

TINY = VECTORS / "codec-tiny"
SAME_MODEL_ATOL = 1e-5  # as test_codec.py: the same model run two ways, summation order aside

pytestmark = pytest.mark.skipif(not (TINY / "codec.pth").is_file(), reason=f"codec vectors not found at {TINY}")


@torch.inference_mode()
def measured_reach(codec: Codec, steps: int = 160, at: int = 60) -> int:
    """How many latent steps after a change at step `at` the decoder's output still moves."""
    latent = torch.randn(1, codec.config.latent_width, steps, generator=torch.Generator().manual_seed(0))
    changed = latent.clone()
    changed[..., at] += 1.0
    moved = torch.nonzero((codec.decoder(changed) - codec.decoder(latent)).abs().flatten() > 0).flatten()
    samples_per_step = codec.frame_length // 4  # the quantizer upsamples frames 4x
    assert int(moved[0]) // samples_per_step == at  # causal: nothing before the change moves
    return int(moved[-1]) // samples_per_step - at


def test_the_counted_reach_covers_what_a_change_moves(codec):
    measured = measured_reach(codec)
    assert 0 < measured <= codec.decoder_reach <= measured + 2, (measured, codec.decoder_reach)
    assert receptive_steps(codec.decoder) == codec.decoder_reach


@pytest.mark.parametrize("cap_frames", [3, 37])
def test_a_long_row_in_pieces_is_the_whole_rows_audio(codec, cap_frames, monkeypatch):
    rows = [random_codes(codec.codebook_sizes, frames, seed=seed) for frames, seed in ((90, 1), (2, 2), (41, 3))]
    whole = codec.decode_batch(rows, max_padding=None)  # the default cap holds each row at once
    widths = []
    decoder_forward = codec.decoder.forward
    monkeypatch.setattr(
        codec.decoder, "forward", lambda latent: widths.append(latent.shape[-1]) or decoder_forward(latent)
    )
    cap = cap_frames * codec.frame_length
    pieces = codec.decode_batch(rows, max_batch_samples=cap)
    for row, (a, b) in enumerate(zip(whole, pieces)):
        assert a.shape == b.shape == (rows[row].shape[1] * codec.frame_length,)
        assert np.max(np.abs(a - b)) <= SAME_MODEL_ATOL, f"row {row}"
    steps_cap = max(cap // (codec.frame_length // 4), 2 * codec.decoder_reach)
    assert max(widths) <= steps_cap and len(widths) > len(rows)  # some row really went in pieces
