"""Pre-packed CPU linears called eagerly and through the op a compiled frame traces."""

import gc

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from actors.engine import packing
from actors.engine.packing import pack_cpu_linears, unpack_cpu_linears
from actors.native import default_cache_dir


def _layer(dtype=torch.bfloat16):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(256, 96, bias=True), nn.Linear(96, 40, bias=False)).to(dtype).eval()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_traceable_op_gives_the_eager_packed_numbers_and_shapes(dtype):
    model = _layer(dtype)
    x = torch.randn(5, 1, 256).to(dtype)
    with torch.inference_mode():
        plain = model(x)
        if pack_cpu_linears(model) != 2:
            pytest.skip("no oneDNN packed linears on this build")
        eager = model(x)
        keys = [m._chorus_packed.key for m in model]
        assert pack_cpu_linears(model, traceable=True) == 2
        assert [m._chorus_packed.key for m in model] == keys  # packed once, only the call changes
        traced = model(x)
        assert torch.equal(traced, eager)
        torch.testing.assert_close(traced, plain, rtol=2e-2 if dtype == torch.bfloat16 else 1e-5, atol=1e-2)
        # the op's schema, its shape function against the real kernel, and what dynamo needs of it
        torch.library.opcheck(packing.packed_linear_op, (x, keys[0], 96), test_utils=["test_schema", "test_faketensor"])


def test_a_packed_weight_leaves_the_registry_with_its_model_and_unpacking_restores_the_layer():
    model, kept = _layer(), _layer()
    if not pack_cpu_linears(model, traceable=True) or not pack_cpu_linears(kept, traceable=True):
        pytest.skip("no oneDNN packed linears on this build")
    key, kept_key = model[0]._chorus_packed.key, kept[0]._chorus_packed.key
    assert packing._PACKED[key] is model[0]._chorus_packed and key != kept_key
    del model
    gc.collect()
    assert key not in packing._PACKED and kept_key in packing._PACKED
    assert unpack_cpu_linears(kept) == 2 and "forward" not in kept[0].__dict__
    gc.collect()
    assert kept_key not in packing._PACKED
    x = torch.randn(3, 256).bfloat16()
    with torch.inference_mode():
        assert torch.equal(kept(x), F.linear(F.linear(x, kept[0].weight, kept[0].bias), kept[1].weight))


def test_the_cpp_op_gives_the_python_ops_numbers_and_forgets_a_freed_models_weights():
    """packed_linear.cpp, built the way a compiled engine builds it (once, into the compile
    cache): bit for bit the Python op at 1 row (the two-row rule), at 5 and, in bfloat16, at
    70 (in pieces of 32), the same schema and shape function, and a freed model's weights leave
    the C++ registry too."""
    if not packing.load_native_ops(default_cache_dir()):
        pytest.skip("no C++ compiler here: the Python op serves")
    native = torch.ops.chorus_native.packed_linear.default
    model = _layer(torch.float32)
    assert pack_cpu_linears(model, traceable=True) == 2
    assert model[0].forward.func is native and model[0]._chorus_packed.native
    key = model[0]._chorus_packed.key
    with torch.inference_mode():
        for rows in (1, 5):
            x = torch.randn(rows, 1, 256)
            assert torch.equal(native(x, key, 96), packing.packed_linear_op(x, key, 96))
        half = _layer(torch.bfloat16)
        assert pack_cpu_linears(half, traceable=True) == 2
        half_key = half[0]._chorus_packed.key
        for shape in ((70, 256), (2, 35, 256), (33, 256)):
            y = torch.randn(shape).bfloat16()
            assert torch.equal(native(y, half_key, 96), packing.packed_linear_op(y, half_key, 96)), shape
    torch.library.opcheck(native, (x, key, 96), test_utils=["test_schema", "test_faketensor"])
    del model
    gc.collect()
    with pytest.raises(RuntimeError, match=f"no packed weight under key {key}"):
        native(x, key, 96)
