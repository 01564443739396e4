"""The Triton code of triton_conv.py (which says what it computes and launches it). Imported
on first use, so `TRITON_INTERPRET` is read then: triton decides at decoration whether a kernel
runs compiled or in its interpreter."""

import os

import triton
import triton.language as tl

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


# 2 pi in two parts for the fast sine's range reduction: n * TWO_PI_HIGH is exact for |n| < 2**16
TWO_PI_HIGH = tl.constexpr(6.28125)
TWO_PI_LOW = tl.constexpr(1.9353071795864769e-3)
INVERSE_TWO_PI = tl.constexpr(0.15915494309189535)


@triton.jit
def _sin(y, FAST_SIN: tl.constexpr):
    """sin(y) in float32. FAST_SIN: the GPU's sin.approx on y reduced to [-pi, pi] (absolute
    error ~1e-6, far below bfloat16's step; libdevice's exact sine inlines a slow path per
    value, which made the kernel 4x the code and its compile 8x the time); else tl.sin."""
    if FAST_SIN:
        turns = tl.floor(y * INVERSE_TWO_PI + 0.5)
        reduced = (y - turns * TWO_PI_HIGH) - turns * TWO_PI_LOW
        return tl.inline_asm_elementwise(
            "sin.approx.f32 $0, $1;", "=f,f", [reduced], dtype=tl.float32, is_pure=True, pack=1
        )
    else:
        return tl.sin(y)


@triton.jit
def _snake(x, alpha, inverse, FAST_SIN: tl.constexpr):
    """x + sin(alpha x)^2 / (alpha + 1e-9) on a [channels, time] float32 tile."""
    wave = _sin(x * alpha[:, None], FAST_SIN)
    return x + wave * wave * inverse[:, None]


@triton.jit
def _rounded(x, dtype: tl.constexpr, ROUND_BF16: tl.constexpr):
    """x (float32) in `dtype`, rounded to nearest even (by hand where ROUND_BF16)."""
    if ROUND_BF16:
        bits = x.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        x = bits.to(tl.float32, bitcast=True)
    return x.to(dtype)


@triton.jit
def _tap_sum(acc, x_row, w_ptr, in_alpha, in_inverse, t, co, length,
             IN_CHANNELS: tl.constexpr, OUT_CHANNELS: tl.constexpr, SHIFT: tl.constexpr, TAP: tl.constexpr, IN_SNAKE: tl.constexpr, DOT_F32: tl.constexpr,
             ROUND_BF16: tl.constexpr, FAST_SIN: tl.constexpr, BLOCK_CI: tl.constexpr):  # fmt: skip
    """acc += W[TAP] @ x[:, t - SHIFT] over every input channel block (zeros before 0)."""
    source = t - SHIFT
    t_ok = (source >= 0) & (source < length)
    co_ok = co < OUT_CHANNELS
    for first in range(0, IN_CHANNELS, BLOCK_CI):
        ci = first + tl.arange(0, BLOCK_CI)
        ci_ok = ci < IN_CHANNELS
        x_ok = ci_ok[:, None] & t_ok[None, :]
        xs = tl.load(x_row + ci[:, None].to(tl.int64) * length + source[None, :], mask=x_ok, other=0.0)
        if IN_SNAKE:  # masked values stay 0: Snake(0) = 0, so the causal padding commutes with it
            alpha = tl.load(in_alpha + ci, mask=ci_ok, other=1.0)
            inverse = tl.load(in_inverse + ci, mask=ci_ok, other=0.0)
            xs = _rounded(_snake(xs.to(tl.float32), alpha, inverse, FAST_SIN), x_row.dtype.element_ty, ROUND_BF16)
        w_offsets = (TAP * OUT_CHANNELS + co[:, None]) * IN_CHANNELS + ci[None, :]
        w = tl.load(w_ptr + w_offsets, mask=co_ok[:, None] & ci_ok[None, :], other=0.0)
        if DOT_F32:
            acc += tl.dot(w.to(tl.float32), xs.to(tl.float32), input_precision="ieee")
        else:
            acc = tl.dot(w, xs, acc)
    return acc


# `length` is specialised (a multiple of 16 or not): known-aligned rows let loads and stores
# go 16 bytes at a time, and the actor's frame buckets (16 frames) keep every stage's length a
# multiple of 64, so a layer compiles once (warm_up's 16 frames are such a length)
@triton.jit
def causal_conv_kernel(
    x_ptr, w_ptr, bias_ptr, in_alpha, in_inverse, residual_ptr, out_alpha, out_inverse, y_ptr, s_ptr, length,
    IN_CHANNELS: tl.constexpr, OUT_CHANNELS: tl.constexpr, TAPS: tl.constexpr, DILATION: tl.constexpr, UPSAMPLE: tl.constexpr, IN_SNAKE: tl.constexpr,
    RESIDUAL: tl.constexpr, WRITE_Y: tl.constexpr, OUT_SNAKE: tl.constexpr, TANH: tl.constexpr,
    DOT_F32: tl.constexpr, ROUND_BF16: tl.constexpr, FAST_SIN: tl.constexpr,
    BLOCK_CO: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_CI: tl.constexpr,
):  # fmt: skip
    """One [BLOCK_CO, BLOCK_T] tile of one row; OUT_CHANNELS counts packed rows (co * s + r
    for a transposed conv), `length` input frames."""
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    co = tl.program_id(1) * BLOCK_CO + tl.arange(0, BLOCK_CO)
    row = tl.program_id(2).to(tl.int64)
    x_row = x_ptr + row * IN_CHANNELS * length
    acc = tl.full((BLOCK_CO, BLOCK_T), 0.0, tl.float32)  # a builtin (tl.zeros is a jit function of its own)
    for tap in tl.static_range(TAPS):
        acc = _tap_sum(acc, x_row, w_ptr, in_alpha, in_inverse, t, co, length, IN_CHANNELS, OUT_CHANNELS,
                       (TAPS - 1 - tap) * DILATION, tap, IN_SNAKE, DOT_F32, ROUND_BF16, FAST_SIN, BLOCK_CI)  # fmt: skip
    co_ok = co < OUT_CHANNELS
    acc += tl.load(bias_ptr + co, mask=co_ok, other=0.0)[:, None]
    if TANH:  # 1 - 2 / (e^2x + 1): exact limits +-1 where e^2x over- or underflows
        acc = 1.0 - 2.0 / (tl.exp(2.0 * acc) + 1.0)
    channel = (co // UPSAMPLE).to(tl.int64)
    offsets = row * OUT_CHANNELS * length + channel[:, None] * (length * UPSAMPLE)
    offsets += t[None, :] * UPSAMPLE + (co % UPSAMPLE)[:, None]
    ok = co_ok[:, None] & (t < length)[None, :]
    if RESIDUAL:
        acc += tl.load(residual_ptr + offsets, mask=ok, other=0.0).to(tl.float32)
    if WRITE_Y:
        tl.store(y_ptr + offsets, _rounded(acc, y_ptr.dtype.element_ty, ROUND_BF16), mask=ok)
    if OUT_SNAKE:
        alpha = tl.load(out_alpha + channel, mask=co_ok, other=1.0)
        inverse = tl.load(out_inverse + channel, mask=co_ok, other=0.0)
        snaked = _rounded(_snake(acc, alpha, inverse, FAST_SIN), s_ptr.dtype.element_ty, ROUND_BF16)
        tl.store(s_ptr + offsets, snaked, mask=ok)
