"""Triton, where it is installed, for the kernels of this package.

CUDA builds of torch ship Triton; the CPU build does not. Without it the kernels' modules still
import (their eager references serve) and a call to a Triton kernel raises `KernelUnavailable`.
With `TRITON_INTERPRET=1` in the environment before the first import, Triton runs its kernels on
CPU tensors in its interpreter (numpy): the tests check every kernel against its eager
reference that way, and inside `triton_on_cpu()` the engine's fused ops run their Triton code on
the CPU too (slowly: for tests, never for speed; elsewhere the CPU runs their references).

The kernel modules do not use `from __future__ import annotations`: Triton reads the
`tl.constexpr` annotations of a kernel's parameters as objects.
"""

import contextlib
import os


class KernelUnavailable(RuntimeError):
    """A Triton kernel was asked for where Triton cannot run it."""


try:  # the CPU wheel of torch has no Triton; CUDA wheels do
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the environment
    triton = None

    class _NoLanguage:
        constexpr = object  # kernel signatures still parse

    tl = _NoLanguage()

    def _jit(fn=None, **_):
        def missing(*args, **kwargs):
            raise KernelUnavailable("Triton is not installed: the fused kernels need a CUDA build of torch")

        return missing if fn is None else _Missing(fn)

    class _Missing:
        def __init__(self, fn):
            self.fn = fn

        def __getitem__(self, grid):
            raise KernelUnavailable(f"Triton is not installed: cannot launch {self.fn.__name__}")

    class _NoTriton:
        jit = staticmethod(_jit)

        @staticmethod
        def next_power_of_2(n: int) -> int:
            return 1 << max(0, int(n) - 1).bit_length()

        @staticmethod
        def cdiv(a: int, b: int) -> int:
            return -(-a // b)

    triton = _NoTriton()  # type: ignore[assignment]
    HAVE_TRITON = False
else:
    HAVE_TRITON = True


def interpreting() -> bool:
    """Whether Triton runs its kernels in its interpreter (on CPU tensors)."""
    return HAVE_TRITON and os.environ.get("TRITON_INTERPRET") == "1"


_ON_CPU = [False]  # set inside triton_on_cpu()


@contextlib.contextmanager
def triton_on_cpu():
    """Within this, the fused ops run their Triton kernels on CPU tensors (Triton's interpreter:
    TRITON_INTERPRET=1 must have been set before Triton was imported)."""
    if not interpreting():
        raise KernelUnavailable("Triton kernels run on the CPU only in its interpreter: set TRITON_INTERPRET=1")
    _ON_CPU[0] = True
    try:
        yield
    finally:
        _ON_CPU[0] = False


def runs_on(device_type: str) -> bool:
    """Whether the fused ops run their Triton kernels (else their references) on this device."""
    if not HAVE_TRITON:
        return False
    return _ON_CPU[0] and device_type == "cpu" if interpreting() else device_type == "cuda"


def launch_options() -> dict:
    """Keyword arguments of every launch: no fused multiply-adds where the eager reference
    rounds a product before a sum (RMSNorm's scale, RoPE's x*cos + swap(x)*sin), so a kernel's
    float32 numbers are the reference's op for op. The interpreter takes no compiler options."""
    return {} if interpreting() else {"enable_fp_fusion": False}


@triton.jit
def cast(x, dtype: tl.constexpr):
    """float32 -> `dtype`, rounded to nearest even (FP8: saturated). To bfloat16 through the bits: Triton's
    interpreter truncates that cast (GPUs round it), and the eager ops round, so the kernels
    round the same way everywhere."""
    if dtype == tl.bfloat16:
        bits = x.to(tl.uint32, bitcast=True)
        bits = (bits + (((bits >> 16) & 1) + 0x7FFF)) & 0xFFFF0000
        return bits.to(tl.float32, bitcast=True).to(tl.bfloat16)
    elif dtype == tl.float8e4nv:  # an FP8 K/V cache (kernels/fp8.py): rounded here, saturated, as to_fp8
        bits = x.to(tl.uint32, bitcast=True)  # normal range: 3 mantissa bits, to nearest even
        normal = ((bits + (((bits >> 20) & 1) + 0x7FFFF)) & 0xFFF00000).to(tl.float32, bitcast=True)
        steps = x * 512.0  # below 2^-6: multiples of 2^-9 (ties away from zero: exact ties are rare)
        tiny = tl.where(steps < 0, -tl.floor(-steps + 0.5), tl.floor(steps + 0.5)) / 512.0
        rounded = tl.where(tl.abs(x) < 0.015625, tiny, normal)
        return tl.minimum(tl.maximum(rounded, -448.0), 448.0).to(dtype)
    else:
        return x.to(dtype)
