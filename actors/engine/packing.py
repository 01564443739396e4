"""CPU linears with their weights pre-packed once for oneDNN, eager or inside a compiled frame.

Eager, a packed layer calls oneDNN's linear directly. A compiled frame cannot trace a packed
weight (a oneDNN tensor has no strides to fake), so for one the layer calls the same linear
through a custom op, `chorus::packed_linear(x, key, out_features)`, which finds the weight by
`key`: the graph holds ints instead of oneDNN tensors, inductor fuses the element-wise work
between the ops, and inductor's on-disk cache can keep the compiled graph (with inductor's own
weight packing, `freezing`, the graph holds oneDNN constants and inductor refuses to cache it:
"mkldnn tensors unpickleable", torch 2.13). Keys are handed out in packing order, so the same
model packed the same way in the next process gets the same keys and hits that cache.

The op has two implementations: Python, always there, and C++ (packed_linear.cpp), which a
compiled frame's C++ wrapper calls without entering Python (a `small` 32-row bf16 frame: ~5%
more frames/s, 3 interleaved rounds); `load_native_ops` builds the C++ one once per node, where
a compiler is.
"""

from __future__ import annotations

import functools
import itertools
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch
from torch import Tensor, nn

from .. import native

# the packed weights a compiled frame's ops can find, by key; an entry leaves with its model
_PACKED: weakref.WeakValueDictionary[int, PackedWeight] = weakref.WeakValueDictionary()
_KEYS = itertools.count()
NATIVE_SOURCE = Path(__file__).with_name("packed_linear.cpp")
_native: dict = {}  # "loaded": whether load_native_ops built and loaded the C++ op in this process
NATIVE_NAME = "chorus_native"


@dataclass
class PackedWeight:
    weight: Tensor  # oneDNN's packed layout
    bias: Optional[Tensor]
    key: int
    native: bool = False  # also in the C++ op's registry


# the most rows oneDNN computes as it computes each of them in a call of two: beyond it, on a
# CPU with AMX (Sapphire Rapids), its bfloat16 kernel sums differently (measured with packing
# hints 8..64 and inputs 512..3072 wide: some rows of a 33-row call differ in the last bit, more
# of longer calls, in ways that follow the call's row count; float32 agreed at every count to
# 600, as everything did on AMD Zen 4)
ROWS_PER_CALL = 32
# every engine packs for that many rows, whatever its max_rows: oneDNN picks its kernels by the
# packing too, so engines of any max_rows run the same ones (a 64-row call summed otherwise
# under the packings for 1 and for 32); the packing for 32 serves one row as fast as the
# packing for one (a pair of rows: 0.13-0.37 ms either way at the `small` shapes, Sapphire Rapids)


def _onednn(x: Tensor, weight: Tensor, bias: Optional[Tensor]) -> Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


def packed_linear(x: Tensor, weight: Tensor, bias: Optional[Tensor]) -> Tensor:
    """A pre-packed oneDNN linear whose rows never depend on what else shares the call.
    oneDNN runs a single row through another kernel whose sums differ in the last bit from the
    same row among others (measured on AMD Zen 4, AVX-512, float32 and bfloat16, for the
    2048- and 3072-wide inputs of wo and w2): one row goes in as two. A reduced-precision call
    of more than ROWS_PER_CALL rows goes in parts whose rows depend on nothing outside them: a
    [batch, columns, width] input of more columns than that (a prefill chunk) one batch row at
    a time, its columns in one call (their count is the row's own: as fast as the whole call,
    where pieces of ROWS_PER_CALL cost a 2,048-row call 2.2-2.6x), any other in pieces of
    ROWS_PER_CALL rows."""
    rows = x.numel() // x.shape[-1]
    if rows == 1:
        y = _onednn(x.reshape(1, -1).expand(2, -1).contiguous(), weight, bias)
        return y[:1].reshape(*x.shape[:-1], y.shape[-1])
    if rows <= ROWS_PER_CALL or x.dtype == torch.float32:
        return _onednn(x, weight, bias)
    if x.dim() == 3 and x.shape[1] > ROWS_PER_CALL:
        return torch.stack([_onednn(row, weight, bias) for row in x.unbind(0)])
    pieces = [packed_linear(piece, weight, bias) for piece in x.reshape(rows, -1).split(ROWS_PER_CALL)]
    return torch.cat(pieces).reshape(*x.shape[:-1], -1)


def _packed_linear_by_key(x: Tensor, key: int, out_features: int) -> Tensor:
    """`packed_linear` with the weight found by key: what a compiled frame calls."""
    packed = _PACKED[key]
    return packed_linear(x, packed.weight, packed.bias)


def _packed_linear_shape(x: Tensor, key: int, out_features: int) -> Tensor:
    return x.new_empty((*x.shape[:-1], out_features))


# a plain library op rather than torch.library.custom_op: ~3 us per call on top of the linear
# instead of ~12 (266 calls a `small` frame)
_LIBRARY = torch.library.Library("chorus", "FRAGMENT")  # attention.py adds another
_LIBRARY.define("packed_linear(Tensor x, int key, int out_features) -> Tensor")
_LIBRARY.impl("packed_linear", _packed_linear_by_key, "CPU")
torch.library.register_fake("chorus::packed_linear", _packed_linear_shape, lib=_LIBRARY)
packed_linear_op = torch.ops.chorus.packed_linear.default


def load_native_ops(build_root: Path) -> bool:
    """Build the C++ packed-linear op under build_root (actors/native.py: once per node, torch
    and CPU kind) and load it into this process. False, with a warning, where it cannot be
    built (no compiler): the Python op serves."""
    if "loaded" not in _native:
        _native["loaded"] = native.build(NATIVE_NAME, NATIVE_SOURCE, build_root)
        if _native["loaded"]:
            torch.library.register_fake(f"{NATIVE_NAME}::packed_linear", _packed_linear_shape)
    return _native["loaded"]


def traceable_op():
    """The op a compiled frame's packed linears call: C++ when loaded, else Python."""
    return torch.ops.chorus_native.packed_linear.default if _native.get("loaded") else packed_linear_op


def _keep_native(packed: PackedWeight) -> None:
    """Put a packed weight in the C++ op's registry, to leave it when the weight's model goes."""
    if not packed.native:
        ops = torch.ops.chorus_native
        ops.keep_packed(packed.key, packed.weight, packed.bias)
        weakref.finalize(packed, ops.drop_packed, packed.key)
        packed.native = True


def pack_cpu_linears(model: nn.Module, traceable: bool = False) -> int:
    """Route every nn.Linear of a CPU float32/bfloat16 model through oneDNN with its weight
    pre-packed once (what torch.compile's CPU freezing does). Measured here on the `small`
    shapes: about 2x faster matmuls at 1 and at 32 rows than the default path, and each row's
    result no longer depends on how many rows share the call. Keeps the dense weights (the
    state dict and the reference path stay plain). `traceable`: call through the custom op (C++
    once load_native_ops has loaded it), for a frame torch.compile will trace (same numbers,
    ~3 us more per call eager). A layer packed
    before keeps its packing and only switches how it is called. Returns how many layers are
    packed; 0 where oneDNN or the op is unavailable, or for float64."""
    ops = getattr(torch.ops, "mkldnn", None)
    if ops is None or not torch.backends.mkldnn.is_available() or not hasattr(ops, "_linear_pointwise"):
        return 0
    packed = 0
    op = traceable_op()
    for module in model.modules():
        if not isinstance(module, nn.Linear):
            continue
        weight = getattr(module, "_chorus_packed", None) or _pack(module)
        if weight is None:
            continue
        if traceable:
            if op is not packed_linear_op:
                _keep_native(weight)
            module.forward = functools.partial(op, key=weight.key, out_features=module.out_features)
        else:
            module.forward = functools.partial(packed_linear, weight=weight.weight, bias=weight.bias)
        packed += 1
    return packed


def _pack(module: nn.Linear) -> Optional[PackedWeight]:
    w = module.weight
    if w.device.type != "cpu" or w.dtype not in (torch.float32, torch.bfloat16):
        return None
    try:
        weight = torch.ops.mkldnn._reorder_linear_weight(w.detach(), ROWS_PER_CALL)
    except RuntimeError:
        return None
    bias = None if module.bias is None else module.bias.detach()
    packed = PackedWeight(weight, bias, next(_KEYS))
    module._chorus_packed = packed  # the module keeps it alive; the registry only finds it
    _PACKED[packed.key] = packed
    return packed


def unpack_cpu_linears(model: nn.Module) -> int:
    """Undo `pack_cpu_linears` (the dense weights were kept). Returns how many layers."""
    unpacked = 0
    for module in model.modules():
        if isinstance(module, nn.Linear) and "forward" in module.__dict__:
            del module.forward
            module.__dict__.pop("_chorus_packed", None)
            unpacked += 1
    return unpacked


def prepare_linears(model: nn.Module, head: nn.Module, fp8_weights: bool, cpu_packed: bool) -> int:
    """The model's linears as an engine runs them: W8A8 FP8 products (kernels/fp8.py: quantized
    in place, once) and, on CPU with `cpu_packed`, oneDNN-packed; returns how many were packed."""
    from .kernels.fp8 import quantize_slow_linears

    if fp8_weights:
        quantize_slow_linears(model)
    device = next(model.parameters()).device
    if cpu_packed and device.type == "cpu":
        return pack_cpu_linears(model) + pack_cpu_linears(head)
    unpack_cpu_linears(model)  # another engine on this model may have packed it
    return 0
