"""Fixtures of the codec tests: `one_thread` (the vectors were made with one thread; it also keeps
runs steady on a shared 2-core machine) and `codec`, the tiny upstream-made codec twice: torch's
layers alone, and its narrow layers through chorus's C++ kernel (actors/codec/kernels.py), as
the pipeline runs it on CPU."""

from __future__ import annotations

import pytest
import torch

from actors.codec import Codec, load_codec
from helpers import VECTORS

TINY = VECTORS / "codec-tiny"


@pytest.fixture(scope="module")
def one_thread():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="module", params=["torch", "kernels"])
def codec(request, one_thread) -> Codec:
    loaded = load_codec(TINY)
    if request.param == "kernels":
        assert loaded.use_native_layers() > 0, "the codec's C++ kernel did not build"
    return loaded
