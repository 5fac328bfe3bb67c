"""Compiled float32 loops of the activations (GELU exact and tanh), through numba.

Imported only by engine.backend.jit when the first of these kernels is compiled: this module
needs numba to import (its helpers are compiled functions), the engine does not.

Why compiled: exact GELU is x * Phi(x). numpy evaluates it in about seven passes per block
(MKL's CdfNorm is one of them, the backward adds an exp and four products), ~2.1 ns per element
forward + backward against PyTorch's ~0.8 on two threads. One loop per thread that keeps every
intermediate in registers is memory-bound instead.

Why the helpers look the way they do: LLVM vectorises a loop only when everything it calls is
inlined, and numba's `math.exp` is a call to libm's scalar expf. `exp_f32` is Cephes' single
precision exp written out (the argument reduced by ln 2 in two parts, a degree-5 polynomial,
the power of two built in the exponent bits through an LLVM bit cast), so the loops run 16
floats at a time with AVX-512.

Phi(x) = 0.5 erfc(|x| / sqrt 2) for x <= 0 and 1 - that for x > 0, with erfc written as
erfc(z) = exp(-z^2) t R(t), t = 1 / (1 + z/2): R(t) = erfcx(z) / t is smooth on t in (0, 1] and
a degree-10 polynomial fits it to 1.1e-8 relative (a relative-weighted Chebyshev fit against
scipy's erfcx in float64; R(0) = 1/sqrt(pi)). Phi keeps its relative accuracy deep in the left
tail, where 0.5 (1 + erf(x / sqrt 2)) cancels to nothing (PyTorch's float32 and float64 GELU
compute it that way). Measured against float64: |error| < 1.8e-7 everywhere; relative error 3.7e-7 on
[-1, 0], 7.5e-7 down to x = -5, 4.1e-6 down to -13 (the float32 rounding of x^2 / 2 inside the
exponent), checked in tests/test_jit_kernels.py. Writing erfc with exp(-z^2) as a factor (rather
than Numerical Recipes' t exp(-z^2 + P(t)), used before) lets the gradient, Phi(x) + x phi(x),
share that one exp with phi(x) = exp(-x^2 / 2) / sqrt(2 pi): one exp per element instead of two.
The polynomial is evaluated in Estrin's scheme (pairs, then pairs of pairs): the same
multiply-adds as Horner's rule with a third of its dependency chain. On 3.1M floats, one thread
of this AVX2 machine: forward 5.6 -> 4.0 ms, gradient 9.0 -> 4.2 ms (PyTorch: 2.9 and 4.3).

tanh GELU is written as x * sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3), which equals
0.5 x (1 + tanh u) without the cancellation of 1 + tanh u for negative u.
"""
import math

import numpy as np

from ..backend.jit import import_numba

numba = import_numba()
from llvmlite import ir  # noqa: E402 (numba, imported above, brings llvmlite)
from numba.core import types  # noqa: E402
from numba.extending import intrinsic  # noqa: E402

_f32 = np.float32
_inline = numba.njit(inline="always", error_model="numpy", fastmath={"contract"})


@intrinsic
def _f32_from_bits(typingctx, bits):
    """The float32 whose IEEE bits are the low 32 bits of the integer `bits`."""
    if not isinstance(bits, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        word = args[0]
        if bits.bitwidth > 32:
            word = builder.trunc(word, ir.IntType(32))
        return builder.bitcast(word, ir.FloatType())

    return types.float32(bits), codegen


@intrinsic
def _bits_of_f32(typingctx, value):
    """The IEEE bits of a float32, as an int32."""
    if value != types.float32:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(32))

    return types.int32(value), codegen


_LOG2E = _f32(1 / math.log(2))
_LN2_HI, _LN2_LO = _f32(0.693359375), _f32(-2.12194440e-4)  # ln 2 = hi + lo, hi exact in 9 bits
_EXP_LO = _f32(-125 * math.log(2))  # below it the result is < 2^-125 and is returned as 0
_EXP_HI = _f32(88.72283)  # above it float32 overflows
_INF = _f32(np.inf)


@_inline
def exp_f32(x):
    """e^x in float32 (within 2 ulp of the rounded result on [-86.6, 88.7]), 0 below -86.64
    (true value < 2.4e-38), inf above 88.72, nan for nan."""
    xc = _EXP_LO if x < _EXP_LO else x  # (nan compares false and stays nan)
    xc = _EXP_HI if xc > _EXP_HI else xc
    n = np.floor(xc * _LOG2E + _f32(0.5))
    r = xc - n * _LN2_HI
    r = r - n * _LN2_LO
    p = _f32(1.9875691500e-4)
    p = p * r + _f32(1.3981999507e-3)
    p = p * r + _f32(8.3334519073e-3)
    p = p * r + _f32(4.1665795894e-2)
    p = p * r + _f32(1.6666665459e-1)
    p = p * r + _f32(5.0000001201e-1)
    y = p * r * r + r + _f32(1.0)
    # y * 2^n as (2 y) * 2^(n - 1): 2^n itself overflows the exponent bits at n = 128
    y = (y + y) * _f32_from_bits((np.int32(n) + 126) << 23)
    y = _f32(0.0) if x < _EXP_LO else y
    return _INF if x > _EXP_HI else y


# a copy that LLVM inlines after numba compiled it on its own: its instructions keep their
# `contract`-only flags inside a caller compiled with `reassoc` (a vectorised sum), which could
# otherwise fold the two-part range reduction x - n hi - n lo into x - n (hi + lo)
exp_f32_own_flags = numba.njit(error_model="numpy", fastmath={"contract"})(exp_f32.py_func)

_SQRT_HALF = _f32(1 / math.sqrt(2))
_INV_SQRT_2PI = _f32(1 / math.sqrt(2 * math.pi))


# R(t) = erfcx(z) / t with t = 1 / (1 + z/2), lowest power first (see the module docstring)
_R = tuple(_f32(c) for c in (
    0.282094795, 0.282093851, 0.246880655, 0.17537571, 0.093009715, -0.05727454, 0.127205563, -0.4471728,
    0.486374708, -0.230964951, 0.042377286))


@_inline
def _erfcx_over_t(t):
    """R(t), the degree-10 polynomial, in Estrin's scheme."""
    t2 = t * t
    t4 = t2 * t2
    p01 = _R[0] + _R[1] * t
    p23 = _R[2] + _R[3] * t
    p45 = _R[4] + _R[5] * t
    p67 = _R[6] + _R[7] * t
    p89 = _R[8] + _R[9] * t
    p03 = p01 + p23 * t2
    p47 = p45 + p67 * t2
    p8a = p89 + _R[10] * t2
    return p03 + (p47 + p8a * t4) * t4


@_inline
def _cdf_from_gauss(x, gauss):
    """Phi(x), given gauss = exp(-x^2 / 2): 0.5 erfc(|x| / sqrt 2) = 0.5 gauss t R(t) for x <= 0,
    1 - that for x > 0."""
    z = abs(x) * _SQRT_HALF
    t = _f32(1.0) / (_f32(1.0) + _f32(0.5) * z)
    h = _f32(0.5) * t * _erfcx_over_t(t) * gauss
    return _f32(1.0) - h if x > _f32(0.0) else h


@_inline
def normal_cdf(x):
    """Phi(x), the standard normal CDF."""
    return _cdf_from_gauss(x, exp_f32(_f32(-0.5) * x * x))


@_inline
def _sigmoid_and_complement(s):
    """(sigmoid(s), 1 - sigmoid(s)), the second without the cancellation of 1 - sigmoid(s) for
    large s: with e = exp(-s), 1 - sigmoid(s) = e sigmoid(s)."""
    e = exp_f32(-s)
    p = _f32(1.0) / (_f32(1.0) + e)
    return p, (e * p if e < _f32(1.0) else _f32(1.0) - p)  # (e = inf: e p would be nan)


_TANH_K0 = _f32(math.sqrt(2 / math.pi))
_TANH_K1 = _f32(math.sqrt(2 / math.pi) * 0.044715)


def normal_cdf_loop(x, out):
    """out = Phi(x) over flat float32 arrays (what the tests check the helpers with)."""
    for i in range(x.size):
        out[i] = normal_cdf(x[i])


def gelu_loop(x, out):
    """out = x Phi(x)."""
    for i in range(x.size):
        v = x[i]
        out[i] = v * normal_cdf(v)


def gelu_grad_loop(g, x, out):
    """out = g (Phi(x) + x phi(x)), the gradient of x Phi(x): one exp, shared."""
    for i in range(x.size):
        v = x[i]
        gauss = exp_f32(_f32(-0.5) * v * v)
        out[i] = g[i] * (_cdf_from_gauss(v, gauss) + v * _INV_SQRT_2PI * gauss)


def gelu_tanh_loop(x, out):
    """out = x sigmoid(2u) = 0.5 x (1 + tanh u), u = k0 x + k1 x^3."""
    for i in range(x.size):
        v = x[i]
        u = v * (_TANH_K0 + _TANH_K1 * v * v)
        out[i] = v * _sigmoid_and_complement(u + u)[0]


def gelu_tanh_grad_loop(g, x, out):
    """out = g (s + 2 x s (1 - s) u'), s = sigmoid(2u), u' = k0 + 3 k1 x^2."""
    for i in range(x.size):
        v = x[i]
        v2 = v * v
        u = v * (_TANH_K0 + _TANH_K1 * v2)
        s, c = _sigmoid_and_complement(u + u)
        du = _TANH_K0 + _f32(3.0) * _TANH_K1 * v2
        out[i] = g[i] * (s + _f32(2.0) * v * s * c * du)


@numba.njit(inline="always", error_model="numpy")
def _softmax_row(row, out):
    top = np.int32(-2147483648)
    for j in range(row.size):
        b = _bits_of_f32(row[j])
        top = max(top, b ^ ((b >> 31) & np.int32(0x7FFFFFFF)))
    mx = _f32_from_bits(top ^ ((top >> 31) & np.int32(0x7FFFFFFF)))
    total = _f32(0.0)
    for j in range(row.size):
        e = exp_f32_own_flags(row[j] - mx)
        out[j] = e
        total += e
    inv = _f32(1.0) / total
    for j in range(row.size):
        out[j] *= inv


@numba.njit(inline="always", error_model="numpy")
def _softmax_grad_row(g_row, y_row, out, scale):
    dot = _f32(0.0)
    for j in range(g_row.size):
        dot += g_row[j] * y_row[j]
    for j in range(g_row.size):
        out[j] = (g_row[j] - dot) * y_row[j] * scale


# The row kernels below are compiled with `reassoc` (the row sums vectorise) and come in pairs:
# when input and output are one array, LLVM's run-time overlap check sees them overlap and takes
# its scalar loop (5x slower), so the in-place kernels are handed the array once.

def softmax_rows_loop(x, z):
    """z = softmax(x) along the rows of the 2-D float32 arrays x and z.

    The row maximum is taken over integer keys (the float bits with the magnitude bits flipped
    for negatives, which orders them as the floats): an integer max vectorises where a float one
    with nan semantics does not. A nan in a row makes the whole row nan through the sum, as in
    the numpy kernel."""
    for i in range(x.shape[0]):
        _softmax_row(x[i], z[i])


def softmax_rows_inplace_loop(z):
    """softmax_rows_loop(z, z)."""
    for i in range(z.shape[0]):
        row = z[i]
        _softmax_row(row, row)


def softmax_grad_rows_loop(g, y, dx, scale):
    """dx = scale * y * (g - sum(g * y)) along the rows of 2-D float32 arrays."""
    for i in range(g.shape[0]):
        _softmax_grad_row(g[i], y[i], dx[i], scale)


def softmax_grad_rows_inplace_loop(g, y, scale):
    """softmax_grad_rows_loop(g, y, g, scale)."""
    for i in range(g.shape[0]):
        row = g[i]
        _softmax_grad_row(row, y[i], row, scale)
