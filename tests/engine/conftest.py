"""The engine tests' fixtures."""

from __future__ import annotations

import pytest

from helpers import TEST_DEVICE


# The engine tests' tiny S2 checkpoint (4 codebooks of 64), in float64 and float32, on the
# device the engine tests run on (CHORUS_TEST_DEVICE; scripts/gpu_check.sh sets cuda).
@pytest.fixture(scope="session")
def ckpt(tmp_path_factory):
    from actors.engine.tiny import make_tiny

    return make_tiny(
        tmp_path_factory.mktemp("engine") / "s2", fmt="s2", seed=11, num_codebooks=4, codebook_size=64, max_seq_len=512
    )


@pytest.fixture(scope="session")
def lm64(ckpt):
    from actors.engine import load_model

    return load_model(ckpt, device=TEST_DEVICE, dtype="float64")


@pytest.fixture(scope="session")
def lm32(ckpt):
    from actors.engine import load_model

    return load_model(ckpt, device=TEST_DEVICE, dtype="float32")
