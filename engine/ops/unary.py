"""Pointwise math (exp, log, sqrt, ..., clamp, isnan) and activations (relu, gelu, silu, ...).

Why the kernels look the way they do:
  * Hot activations (gelu, sigmoid, tanh, silu, softplus) and their fused grad ops run through
    `_apply`, which evaluates a kernel block by block (so temporaries stay in cache instead of
    streaming whole arrays through memory once per numpy call) and, for large arrays, on several
    threads (numpy releases the GIL inside ufuncs). On CuPy the same kernel runs once on the whole
    array.
  * Each hot op has one fused grad Op (`GeluGrad`, `SigmoidGrad`, ...) whose own backward is written
    in engine ops, so double backward still works.
  * GELU (exact and tanh) and its gradient run as one compiled loop per thread on float32 where
    numba is installed (engine/ops/_jit_activations.py: ~3x fewer ns per element than the
    numpy kernels, which stay the reference and the path for float64 and CuPy).
  * Exact gelu needs erf. scipy's erf is a scalar double-precision routine (~14 ns/element), far
    too slow for an activation, so float32/16 use MKL's CdfNorm or a minimax fit
    erf(u) ~ tanh(u * P(u^2)) on |u| <= 4 (max abs error 1.4e-7, about one float32 ulp; numpy's
    tanh is vectorised). float64 and `erf` itself use scipy.special / cupyx.scipy.special for
    full accuracy.
  * GELU saves only its input, as PyTorch does: the backward computes Phi(x) again, which costs
    less than writing it out in the forward and keeping it alive until the backward.
  * Kernels run under `errstate(all="ignore")`: inf/nan results are silent, as in PyTorch.
"""
import math

import ml_dtypes
import numpy as np

from .op import Op
from ..backend.parallel import parallel_for
from ._kernels import BLOCK_ELEMENTS, LOW_PRECISION, empty as _empty, ignore_fp_errors, rsqrt_array
from ..backend import dtypes, jit, mkl, xp_of
from ..tensor import Tensor, tensor_method
from . import inplace
from ._core import broadcast_shapes, cast, scalar_tensor, sum_to
from .comparison import eq, ge, gt, le, lt, where
from .creation import zeros_like
from .logical import logical_and, logical_or
from ..kernels import gelu as gelu_kernels

__all__ = [
    # math
    "exp", "log", "log1p", "log2", "expm1", "sqrt", "rsqrt", "sin", "cos", "tanh", "sigmoid", "abs",
    "sign", "floor", "ceil", "round", "trunc", "erf", "erfinv", "clamp", "clip", "clamp_min",
    "clamp_max", "isnan", "isinf", "isfinite", "nan_to_num", "is_complex", "is_floating_point",
    # activations
    "relu", "relu_", "gelu", "silu", "softplus", "leaky_relu", "hardtanh",
]

# ====================================================================== blocked kernel runner
_BLOCK = BLOCK_ELEMENTS  # temporaries of a fused chain stay in L2


def _blocks(kernel, out, ins, start, stop):
    with np.errstate(all="ignore"):
        for i in range(start, stop, _BLOCK):
            j = min(i + _BLOCK, stop)
            kernel(np, out[i:j], *(a[i:j] for a in ins))


def _apply(kernel, *arrays):
    """New array `out` with `kernel(xp, out, *arrays)` evaluated elementwise. All arrays have the
    same shape; float16/bfloat16 are computed in float32."""
    xp = xp_of(arrays[0])
    dt = arrays[0].dtype
    if arrays[0].ndim == 0:  # numpy turns 0-d temporaries into scalars, which `out=` refuses
        return _apply(kernel, *[a.reshape(1) for a in arrays]).reshape(())
    if dt in LOW_PRECISION:
        arrays = [a.astype(np.float32) for a in arrays]
    out = _empty(xp, arrays[0].shape, arrays[0].dtype)
    n = out.size
    if xp is not np or n <= _BLOCK:
        if xp is np:
            with np.errstate(all="ignore"):
                kernel(xp, out, *arrays)
        else:
            kernel(xp, out, *arrays)
    else:
        flat = [np.ascontiguousarray(a).reshape(-1) for a in arrays]
        o = out.reshape(-1)
        parallel_for(lambda s, e: _blocks(kernel, o, flat, s, e), n, grain=_BLOCK, per_thread=4)
    return out.astype(dt) if dt in LOW_PRECISION else out


_COMPILED = {name: jit.kernel(f"engine.ops._jit_activations:{name}", fastmath={"contract"})
             for name in ("gelu_loop", "gelu_grad_loop", "gelu_tanh_loop", "gelu_tanh_grad_loop")}


def _apply_compiled(loop, *arrays):
    """The array `_apply` would return, computed by the compiled `loop(*flat_inputs, flat_out)`
    over contiguous ranges (four per thread, taken as threads come free); None where the loop
    does not apply (no numba, CuPy, float64: those take `_apply`). float16/bfloat16 are
    computed in float32."""
    dt = arrays[0].dtype
    if loop is None or not isinstance(arrays[0], np.ndarray) or (dt != np.float32 and dt not in LOW_PRECISION):
        return None
    flat = [np.ascontiguousarray(a, dtype=np.float32).reshape(-1) for a in arrays]
    out = _empty(np, arrays[0].shape, np.float32)
    o = out.reshape(-1)
    parallel_for(lambda s, e: loop(*(a[s:e] for a in flat), o[s:e]), o.size, grain=_BLOCK, per_thread=4)
    return out if dt == np.float32 else out.astype(dt)


def _special(xp):
    """scipy.special on the CPU, cupyx.scipy.special on CUDA (imported on first use)."""
    if xp is np:
        import scipy.special as sp
    else:
        import cupyx.scipy.special as sp
    return sp


# ====================================================================== kernels of the hot ops
_SQRT_HALF = 1 / math.sqrt(2)
_INV_SQRT_2PI = 1 / math.sqrt(2 * math.pi)
# erf(u) ~ tanh(u * sum(c_k u^2k)) for |u| <= 4 (erf(4) == 1 in float32). With u = x/sqrt(2) folded
# in, Phi(x) = 0.5 + 0.5 * tanh(x * sum(q_k x^2k)) for |x| <= 4 sqrt(2).
_ERF_FIT = (1.12837971e+00, 1.02765481e-01, -1.84383720e-04, -6.25719545e-04, 8.97125748e-05,
            -5.98568835e-06, 1.58960078e-07)
_CDF_FIT = tuple(c * _SQRT_HALF / 2.0 ** k for k, c in enumerate(_ERF_FIT))[::-1]  # highest first
_CDF_CLAMP = 4 * math.sqrt(2)
_TANH_K0 = math.sqrt(2 / math.pi)
_TANH_K1 = math.sqrt(2 / math.pi) * 0.044715


def _normal_cdf(xp, x, out):
    """out = Phi(x), the standard normal CDF: MKL's vector math in one pass where MKL is in use
    (engine.backend.mkl), else the numpy kernels below (the reference it is tested against)."""
    if xp is np and mkl.vml("CdfNorm", x, out):
        return out
    if x.dtype == np.float64:
        xp.multiply(x, _SQRT_HALF, out=out)
        _special(xp).erf(out, out=out)
    else:
        t = xp.minimum(x, _CDF_CLAMP)
        xp.maximum(t, -_CDF_CLAMP, out=t)
        s = t * t
        xp.multiply(s, _CDF_FIT[0], out=out)
        for c in _CDF_FIT[1:-1]:
            out += c
            out *= s
        out += _CDF_FIT[-1]
        out *= t
        xp.tanh(out, out=out)
    out *= 0.5
    out += 0.5
    return out


def _k_gelu(xp, out, x):
    _normal_cdf(xp, x, out)
    out *= x


def _k_gelu_grad(xp, out, g, x):
    # d/dx x Phi(x) = Phi(x) + x phi(x)
    e = x * x
    e *= -0.5
    xp.exp(e, out=e)
    e *= x
    e *= _INV_SQRT_2PI
    _normal_cdf(xp, x, out)
    out += e
    out *= g


def _tanh_inner(xp, x):
    u = x * x
    u *= _TANH_K1
    u += _TANH_K0
    u *= x  # k0 x + k1 x^3, written with x*x*x rather than a power
    return xp.tanh(u, out=u)


def _k_gelu_tanh(xp, out, x):
    t = _tanh_inner(xp, x)
    t += 1.0
    xp.multiply(x, 0.5, out=out)
    out *= t


def _k_gelu_tanh_grad(xp, out, g, x):
    # 0.5 (1 + T) + 0.5 x (1 - T^2) (k0 + 3 k1 x^2)
    t = _tanh_inner(xp, x)
    d = x * x
    d *= 3 * _TANH_K1
    d += _TANH_K0
    d *= x
    xp.multiply(t, t, out=out)
    xp.subtract(1.0, out, out=out)
    out *= d
    out += t
    out += 1.0
    out *= 0.5
    out *= g


def _sigmoid_into(xp, x, out):
    xp.negative(x, out=out)
    xp.exp(out, out=out)
    out += 1.0
    xp.reciprocal(out, out=out)
    return out


def _k_sigmoid(xp, out, x):
    _sigmoid_into(xp, x, out)


def _k_sigmoid_grad(xp, out, g, x):
    y = _sigmoid_into(xp, x, xp.empty_like(x))
    xp.subtract(1.0, y, out=out)
    out *= y
    out *= g


def _k_tanh(xp, out, x):
    xp.tanh(x, out=out)


def _k_tanh_grad(xp, out, g, x):
    xp.tanh(x, out=out)
    out *= out
    xp.subtract(1.0, out, out=out)
    out *= g


def _k_exp_grad(xp, out, g, x):
    xp.exp(x, out=out)
    out *= g


def _k_silu(xp, out, x):
    _sigmoid_into(xp, x, out)
    out *= x


def _k_silu_grad(xp, out, g, x):
    # s (1 + x (1 - s))
    s = _sigmoid_into(xp, x, xp.empty_like(x))
    xp.subtract(1.0, s, out=out)
    out *= x
    out += 1.0
    out *= s
    out *= g


# ====================================================================== helpers
def _float(t):
    """Math ops compute int/bool inputs in the default float dtype, as PyTorch does."""
    return t if t.is_floating_point() else cast(t, dtypes.get_default_dtype())


def _require_float(t, op):
    if not t.is_floating_point():
        raise RuntimeError(f"{op}: expected a floating point tensor, got {t.dtype.name}")
    return t


def _fused(kernel):
    """forward(ctx, *arrays) of a fused pointwise Op."""
    return staticmethod(lambda ctx, *arrays: _apply(kernel, *arrays))


# ====================================================================== op base classes
class _SavesInput(Op):
    """A one-input op that saves its input x; its backward is `grad(g, x)`, in engine ops."""

    save_inputs = (0,)
    grad = None

    @classmethod
    def backward(cls, ctx, g):
        (x,) = ctx.saved_tensors
        return cls.grad(g, x)


class _FusedGrad(Op):
    """g * f'(x) of a pointwise op f as one fused kernel, inputs (g, x). Its own backward: the
    gradient to g is this op again (on gg), the one to x is `second(gg, g, x)` (= gg g f''(x))."""

    save_inputs = (0, 1)
    second = None

    @classmethod
    def backward(cls, ctx, gg):
        g, x = ctx.saved_tensors
        dg = cls.apply(gg, x) if ctx.needs_input_grad[0] else None
        dx = cls.second(gg, g, x) if ctx.needs_input_grad[1] else None
        return dg, dx


# ====================================================================== math ops
class _Pointwise(_SavesInput):
    """A unary op whose kernel is one array function `fn(xp, x)`."""

    fn = None

    @classmethod
    def forward(cls, ctx, x):
        xp = xp_of(x)
        with ignore_fp_errors(xp):
            return cls.fn(xp, x)


class ExpGrad(_FusedGrad):
    name = "ExpGrad"
    forward = _fused(_k_exp_grad)
    second = staticmethod(lambda gg, g, x: ExpGrad.apply(gg * g, x))


class Exp(_Pointwise):
    name = "Exp"
    fn = staticmethod(lambda xp, x: xp.exp(x))
    grad = staticmethod(lambda g, x: ExpGrad.apply(g, x))


class Log(_Pointwise):
    name = "Log"
    fn = staticmethod(lambda xp, x: xp.log(x))
    grad = staticmethod(lambda g, x: g / x)


class Log1p(_Pointwise):
    name = "Log1p"
    fn = staticmethod(lambda xp, x: xp.log1p(x))
    grad = staticmethod(lambda g, x: g / (x + 1))


class Log2(_Pointwise):
    """Its own kernel rather than log(x) / log(2): log2 of a power of two is exact (log2(8) == 3,
    where the quotient gives 2.9999999999999996 and floor() of it 2)."""

    name = "Log2"
    fn = staticmethod(lambda xp, x: xp.log2(x))
    grad = staticmethod(lambda g, x: g / (x * math.log(2)))


class Expm1(_Pointwise):
    name = "Expm1"
    fn = staticmethod(lambda xp, x: xp.expm1(x))
    grad = staticmethod(lambda g, x: ExpGrad.apply(g, x))


class Sqrt(_Pointwise):
    name = "Sqrt"
    fn = staticmethod(lambda xp, x: xp.sqrt(x))
    grad = staticmethod(lambda g, x: g * rsqrt(x) * 0.5)


class Rsqrt(_Pointwise):
    name = "Rsqrt"
    fn = staticmethod(rsqrt_array)
    grad = staticmethod(lambda g, x: g * rsqrt(x) / x * -0.5)


class Sin(_Pointwise):
    name = "Sin"
    fn = staticmethod(lambda xp, x: xp.sin(x))
    grad = staticmethod(lambda g, x: g * cos(x))


class Cos(_Pointwise):
    name = "Cos"
    fn = staticmethod(lambda xp, x: xp.cos(x))
    grad = staticmethod(lambda g, x: -(g * sin(x)))


class Abs(_Pointwise):
    name = "Abs"
    fn = staticmethod(lambda xp, x: xp.abs(x))
    grad = staticmethod(lambda g, x: g * sign(x))


def _k_special(name):
    """x -> scipy.special.<name>(x) (cupyx.scipy.special on CUDA); 16-bit floats in float32."""

    def kernel(xp, x):
        fn = getattr(_special(xp), name)
        if x.dtype in LOW_PRECISION:
            return fn(x.astype(np.float32)).astype(x.dtype)
        return fn(x)

    return staticmethod(kernel)


class Erf(_Pointwise):
    name = "Erf"
    fn = _k_special("erf")
    grad = staticmethod(lambda g, x: g * exp(x * x * -1.0) * (2 / math.sqrt(math.pi)))


class Erfinv(_Pointwise):
    """The inverse of erf on (-1, 1) (+-inf at +-1, NaN outside); d/dx = sqrt(pi)/2 exp(erfinv(x)^2),
    recomputed from the saved input so that it stays differentiable."""

    name = "Erfinv"
    fn = _k_special("erfinv")
    grad = staticmethod(lambda g, x: g * exp(erfinv(x) ** 2) * (math.sqrt(math.pi) / 2))


class _Piecewise(_Pointwise):
    """Piecewise-constant ops (sign, floor, ...): zero gradient, as in PyTorch; nothing saved."""

    save_inputs = ()

    @staticmethod
    def backward(ctx, g):
        return zeros_like(g)


def _k_sign(xp, x):
    out = xp.sign(x)
    if out.dtype.kind == "f":  # torch: sign(nan) = 0, so abs's gradient g * sign(x) is 0 there too
        out = xp.where(xp.isnan(x), out.dtype.type(0), out)
    return out


class Sign(_Piecewise):
    name = "Sign"
    fn = staticmethod(_k_sign)


class Floor(_Piecewise):
    name = "Floor"
    fn = staticmethod(lambda xp, x: xp.floor(x) if x.dtype.kind == "f" else x.copy())


class Ceil(_Piecewise):
    name = "Ceil"
    fn = staticmethod(lambda xp, x: xp.ceil(x) if x.dtype.kind == "f" else x.copy())


class Trunc(_Piecewise):
    name = "Trunc"
    fn = staticmethod(lambda xp, x: xp.trunc(x) if x.dtype.kind == "f" else x.copy())


class Round(_Piecewise):
    name = "Round"

    @staticmethod
    def forward(ctx, x, decimals=0):
        return xp_of(x).round(x, decimals)


def exp(input):
    return Exp.apply(_float(input))


def log(input):
    return Log.apply(_float(input))


def log1p(input):
    return Log1p.apply(_float(input))


def log2(input):
    return Log2.apply(_float(input))


def expm1(input):
    return Expm1.apply(_float(input))


def sqrt(input):
    return Sqrt.apply(_float(input))


def rsqrt(input):
    return Rsqrt.apply(_float(input))


def sin(input):
    return Sin.apply(_float(input))


def cos(input):
    return Cos.apply(_float(input))


def erf(input):
    return Erf.apply(_float(input))


def erfinv(input):
    return Erfinv.apply(_float(input))


def abs(input):
    if input.dtype is dtypes.bool_:
        raise RuntimeError("abs: not supported for bool tensors")
    return Abs.apply(input)


def sign(input):
    if input.dtype is dtypes.bool_:  # the sign of a boolean is itself, as torch's
        return input.clone()
    return Sign.apply(input)


def floor(input):
    return Floor.apply(input)


def ceil(input):
    return Ceil.apply(input)


def trunc(input):
    return Trunc.apply(input)


def round(input, *, decimals=0):
    if decimals and not input.is_floating_point():
        raise RuntimeError("round: decimals is only supported for floating point tensors")
    return Round.apply(input, decimals=decimals)


# ---------------------------------------------------------------------- tanh / sigmoid
class TanhGrad(_FusedGrad):
    name = "TanhGrad"
    forward = _fused(_k_tanh_grad)
    second = staticmethod(lambda gg, g, x: TanhGrad.apply(gg * g, x) * tanh(x) * -2.0)


class Tanh(_SavesInput):
    """Saves its input, not its output: the fused grad recomputes tanh (one vectorised call), and
    the saved value stays differentiable for double backward (saved outputs are detached)."""

    name = "Tanh"
    forward = _fused(_k_tanh)
    grad = staticmethod(lambda g, x: TanhGrad.apply(g, x))


class SigmoidGrad(_FusedGrad):
    name = "SigmoidGrad"
    forward = _fused(_k_sigmoid_grad)
    second = staticmethod(lambda gg, g, x: SigmoidGrad.apply(gg * g, x) * (1 - sigmoid(x) * 2))


class Sigmoid(_SavesInput):
    """Saves its input (like Tanh) so that double backward works."""

    name = "Sigmoid"
    forward = _fused(_k_sigmoid)
    grad = staticmethod(lambda g, x: SigmoidGrad.apply(g, x))


def tanh(input):
    return Tanh.apply(_float(input))


def sigmoid(input):
    return Sigmoid.apply(_float(input))


# ---------------------------------------------------------------------- clamp, where, max/min
class ClampScalar(Op):
    name = "Clamp"
    save_inputs = (0,)

    @staticmethod
    def forward(ctx, x, lo, hi, strict=False):
        ctx.bounds = (lo, hi, strict)
        xp = xp_of(x)
        if lo is None:
            return xp.minimum(x, hi)
        if hi is None:
            return xp.maximum(x, lo)
        return xp.clip(x, lo, hi)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        lo, hi, strict = ctx.bounds
        if strict:  # hardtanh, as torch: zero at and beyond the edges, so a NaN input passes g
            blocked = le(x, lo)
            blocked = logical_or(blocked, ge(x, hi))
            return where(blocked, 0.0, g)
        mask = None  # clamp, as torch: g inside the closed interval, zero elsewhere and at NaN
        if lo is not None:
            mask = ge(x, lo)
        if hi is not None:
            m = le(x, hi)
            mask = m if mask is None else logical_and(mask, m)
        return where(mask, g, 0.0)


def clamp(input, min=None, max=None):
    if min is None and max is None:
        raise RuntimeError("clamp: At least one of 'min' or 'max' must not be None")
    if not isinstance(min, Tensor) and not isinstance(max, Tensor):
        res = dtypes.result_type([input.dtype], scalars=[b for b in (min, max) if b is not None])
        return ClampScalar.apply(cast(input, res), lo=min, hi=max)
    return _clamp_tensor(input, min, max)


def _clamp_tensor(input, lo, hi):
    """clamp with tensor bounds: promote, broadcast, and route the gradient as torch does."""
    operands = [input] + [b for b in (lo, hi) if b is not None]
    res = dtypes.result_type([t.dtype for t in operands if isinstance(t, Tensor)],
                             scalars=[t for t in operands if not isinstance(t, Tensor)])
    operands = [cast(t, res) if isinstance(t, Tensor) else scalar_tensor(t, res, input) for t in operands]
    broadcast_shapes(*(t.shape for t in operands))
    x = operands[0]
    lo_t = operands[1] if lo is not None else None
    hi_t = operands[-1] if hi is not None else None
    return ClampTensor.apply(x, lo_t, hi_t)


class ClampTensor(Op):
    """min(max(x, lo), hi) with torch's gradients: x gets g inside [lo, hi], lo gets g where
    x < lo (and lo < hi), hi gets g where x > hi (or hi < lo). NaNs propagate."""

    name = "Clamp"
    save_inputs = (0, 1, 2)

    @staticmethod
    def forward(ctx, x, lo, hi):
        xp = xp_of(x)
        out = x if lo is None else xp.maximum(x, lo)
        return out if hi is None else xp.minimum(out, hi)

    @staticmethod
    def backward(ctx, g):
        x, lo, hi = ctx.saved_tensors
        keep = None
        if lo is not None:
            keep = ge(x, lo)
        if hi is not None:
            keep = le(x, hi) if keep is None else logical_and(keep, le(x, hi))
        gx = sum_to(where(keep, g, 0.0), x.shape) if ctx.needs_input_grad[0] else None
        glo = ghi = None
        if lo is not None and ctx.needs_input_grad[1]:
            below = lt(x, lo) if hi is None else logical_and(lt(x, lo), lt(lo, hi))
            glo = sum_to(where(below, g, 0.0), lo.shape)
        if hi is not None and ctx.needs_input_grad[2]:
            above = gt(x, hi) if lo is None else logical_or(gt(x, hi), lt(hi, lo))
            ghi = sum_to(where(above, g, 0.0), hi.shape)
        return gx, glo, ghi


clip = clamp


def clamp_min(input, min):
    return clamp(input, min=min)


def clamp_max(input, max):
    return clamp(input, max=max)


def _dtype_predicate(name):
    def predicate(input):
        if not isinstance(input, Tensor):
            raise TypeError(f"{name}(): argument 'input' (position 1) must be Tensor, not {type(input).__name__}")
        return getattr(input, name)()

    predicate.__name__ = predicate.__qualname__ = name
    predicate.__doc__ = f"torch.{name}: Tensor.{name}() of a tensor (engine/tensor.py; no engine dtype is complex)."
    return predicate


is_complex = _dtype_predicate("is_complex")
is_floating_point = _dtype_predicate("is_floating_point")


# ---------------------------------------------------------------------- isnan & co
class _Predicate(Op):
    differentiable = False
    fn = None

    @classmethod
    def forward(cls, ctx, x):
        return cls.fn(xp_of(x), x)


class IsNan(_Predicate):
    name = "IsNan"
    fn = staticmethod(lambda xp, x: xp.isnan(x))


class IsInf(_Predicate):
    name = "IsInf"
    fn = staticmethod(lambda xp, x: xp.isinf(x))


class IsFinite(_Predicate):
    name = "IsFinite"
    fn = staticmethod(lambda xp, x: xp.isfinite(x))


def isnan(input):
    return IsNan.apply(input)


def isinf(input):
    return IsInf.apply(input)


def isfinite(input):
    return IsFinite.apply(input)


def nan_to_num(input, nan=0.0, posinf=None, neginf=None):
    """NaN, +inf and -inf replaced by `nan`, `posinf` and `neginf` (by default the dtype's largest
    and lowest finite values); integer and bool tensors are copied unchanged. The gradient passes
    where the input is finite and is zero elsewhere, as torch's."""
    if not input.is_floating_point():
        return input.clone()
    dt = input._data.dtype
    info = ml_dtypes.finfo(dt)  # numpy's finfo, and bfloat16's
    fills = []
    for v in (nan, info.max if posinf is None else posinf, info.min if neginf is None else neginf):
        with np.errstate(over="ignore"):  # a replacement beyond the dtype's range rounds to +-inf
            fills.append(scalar_tensor(np.asarray(v, dtype=np.float64).astype(dt)[()], input.dtype, input))
    nan_v, hi, lo = fills
    neg_inf = eq(input, -math.inf)  # (an equality test: quiet on NaN, where < warns)
    return where(isfinite(input), input, where(isnan(input), nan_v, where(neg_inf, lo, hi)))


# ====================================================================== activations
class ReluGrad(Op):
    """g * (x > 0): one bool mask and one multiply, nothing else allocated."""

    name = "ReluGrad"
    save_inputs = (1,)

    @staticmethod
    def forward(ctx, g, x):
        return xp_of(g).multiply(g, ~(x <= 0))  # torch passes g where x is NaN (its test is x <= 0)

    @staticmethod
    def backward(ctx, gg):
        (x,) = ctx.saved_tensors
        dx = zeros_like(x) if ctx.needs_input_grad[1] else None  # relu'' = 0, but x is used
        return ReluGrad.apply(gg, x), dx


class Relu(_SavesInput):
    """Saves its input (x > 0 and y > 0 are the same mask) so that double backward sees x."""

    name = "Relu"
    grad = staticmethod(lambda g, x: ReluGrad.apply(g, x))

    @staticmethod
    def forward(ctx, x):
        return xp_of(x).maximum(x, 0)


def relu(input, inplace=False):
    if inplace:
        return relu_(input)
    return Relu.apply(input)


def relu_(input):
    inplace.check_inplace_allowed(input, "relu_")
    if inplace.records(input):
        return inplace.rebind(input, Relu.apply(input), "relu_")
    xp_of(input._data).maximum(input._data, 0, out=input._data)
    input._bump_version()
    return input


class GeluGrad(Op):
    """dx of gelu, from g and x (Phi(x) computed again rather than kept from the forward)."""

    name = "GeluGrad"
    save_inputs = (0, 1)

    @staticmethod
    def forward(ctx, g, x, approximate):
        ctx.approximate = approximate
        if xp_of(x) is not np:
            return gelu_kernels.gelu_grad(g, x, None, approximate)  # one fused launch
        if approximate == "tanh":
            return _run(_COMPILED["gelu_tanh_grad_loop"], _k_gelu_tanh_grad, g, x)
        return _run(_COMPILED["gelu_grad_loop"], _k_gelu_grad, g, x)

    @staticmethod
    def backward(ctx, gg):
        g, x = ctx.saved_tensors
        return _gelu_grad_backward(ctx.approximate, gg, g, x, *ctx.needs_input_grad)


def _gelu_grad_backward(approximate, gg, g, x, need_g, need_x):
    """The gradients of GeluGrad(g, x) = g gelu'(x): to g, GeluGrad(gg, x); to x, gg g gelu''(x)."""
    dg = GeluGrad.apply(gg, x, approximate=approximate) if need_g else None
    dx = None
    if need_x:
        if approximate == "tanh":
            # with u = k0 x + k1 x^3, T = tanh u: gelu'' = (1 - T^2) (u' - x T u'^2 + 3 k1 x^2)
            x2 = x * x
            t = tanh(x * (x2 * _TANH_K1 + _TANH_K0))
            du = x2 * (3 * _TANH_K1) + _TANH_K0
            second = (1 - t * t) * (du - x * t * du * du + x2 * (3 * _TANH_K1))
        else:
            second = exp(x * x * -0.5) * _INV_SQRT_2PI * (2 - x * x)  # phi(x) (2 - x^2)
        dx = gg * g * second
    return dg, dx


def _run(loop, kernel, *arrays):
    """The compiled loop where it applies, else the numpy kernel."""
    out = _apply_compiled(loop, *arrays)
    return out if out is not None else _apply(kernel, *arrays)


class Gelu(_SavesInput):
    """x Phi(x), or with approximate="tanh" 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""

    name = "Gelu"

    @staticmethod
    def forward(ctx, x, approximate):
        ctx.approximate = approximate
        if xp_of(x) is not np:
            return gelu_kernels.gelu(x, None, approximate)  # one fused launch
        if approximate == "tanh":
            return _run(_COMPILED["gelu_tanh_loop"], _k_gelu_tanh, x)
        return _run(_COMPILED["gelu_loop"], _k_gelu, x)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return GeluGrad.apply(g, x, approximate=ctx.approximate)


def gelu(input, approximate="none"):
    if approximate not in ("none", "tanh"):
        raise RuntimeError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    x = _require_float(input, "gelu")
    return Gelu.apply(x, approximate=approximate)


class BiasGelu(Op):
    """gelu(x + bias), bias over the last dim. It saves x and bias, not x + bias: on CUDA one
    kernel forward and one backward, x + bias never written out (LiBai's bias_gelu_fusion); on
    the CPU x + bias, then Gelu's kernel."""

    name = "BiasGelu"
    save_inputs = (0, 1)

    @staticmethod
    def forward(ctx, x, bias, approximate):
        if xp_of(x) is not np:
            ctx.approximate = approximate
            return gelu_kernels.gelu(x, bias, approximate)
        return Gelu.forward(ctx, x + bias, approximate)

    @staticmethod
    def backward(ctx, g):
        x, bias = ctx.saved_tensors
        dv = BiasGeluGrad.apply(g, x, bias, approximate=ctx.approximate)
        return (dv if ctx.needs_input_grad[0] else None,
                sum_to(dv, bias.shape) if ctx.needs_input_grad[1] else None)


class BiasGeluGrad(Op):
    """g * gelu'(x + bias): one kernel on CUDA, x + bias then GeluGrad's kernel on the CPU."""

    name = "BiasGeluGrad"
    save_inputs = (0, 1, 2)

    @staticmethod
    def forward(ctx, g, x, bias, approximate):
        if xp_of(x) is not np:
            ctx.approximate = approximate
            return gelu_kernels.gelu_grad(g, x, bias, approximate)
        return GeluGrad.forward(ctx, g, x + bias, approximate)

    @staticmethod
    def backward(ctx, gg):
        g, x, bias = ctx.saved_tensors
        need_g, need_x, need_b = ctx.needs_input_grad
        dg, dv = _gelu_grad_backward(ctx.approximate, gg, g, x + bias, need_g, need_x or need_b)
        return dg, (dv if need_x else None), (sum_to(dv, bias.shape) if need_b else None)


def bias_gelu(input, bias, approximate="none"):
    """gelu(input + bias) with `bias` [d] over the last dim, fused on CUDA (see BiasGelu). Not in
    __all__: libai's MLP calls it for bias_gelu_fusion."""
    if approximate not in ("none", "tanh"):
        raise ValueError(f"bias_gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    x = _require_float(input, "bias_gelu")
    if tuple(bias.shape) != tuple(x.shape[-1:]) or bias.dtype != x.dtype:
        raise ValueError(f"bias_gelu: bias must be [{x.shape[-1] if x.ndim else ''}] {x.dtype.name} as the "
                         f"input's last dim, got {list(bias.shape)} {bias.dtype.name}")
    return BiasGelu.apply(x, bias, approximate=approximate)


def _silu_second(gg, g, x):
    s = sigmoid(x)
    return gg * g * s * (1 - s) * (x * (1 - s * 2) + 2)  # silu''


class SiluGrad(_FusedGrad):
    name = "SiluGrad"
    forward = _fused(_k_silu_grad)
    second = staticmethod(_silu_second)


class Silu(_SavesInput):
    name = "Silu"
    forward = _fused(_k_silu)
    grad = staticmethod(lambda g, x: SiluGrad.apply(g, x))


def silu(input, inplace=False):
    if inplace:
        return _inplace_apply(input, silu, "silu_")
    return Silu.apply(_require_float(input, "silu"))


def _softplus_kernels(beta, threshold):
    def fwd(xp, out, x):
        z = x * beta
        xp.exp(z, out=out)
        xp.log1p(out, out=out)
        if beta != 1:
            out /= beta
        xp.copyto(out, x, where=z > threshold)

    def grad(xp, out, g, x):
        z = x * beta
        _sigmoid_into(xp, z, out)
        xp.copyto(out, 1.0, where=z > threshold)
        out *= g

    return fwd, grad


class SoftplusGrad(Op):
    name = "SoftplusGrad"
    save_inputs = (0, 1)

    @staticmethod
    def forward(ctx, g, x, beta, threshold):
        ctx.params = (beta, threshold)
        return _apply(_softplus_kernels(beta, threshold)[1], g, x)

    @staticmethod
    def backward(ctx, gg):
        g, x = ctx.saved_tensors
        beta, threshold = ctx.params
        dg = SoftplusGrad.apply(gg, x, beta=beta, threshold=threshold) if ctx.needs_input_grad[0] else None
        dx = None
        if ctx.needs_input_grad[1]:
            s = sigmoid(x * beta)
            dx = where(x * beta > threshold, 0.0, gg * g * s * (1 - s) * beta)
        return dg, dx


class Softplus(Op):
    name = "Softplus"
    save_inputs = (0,)

    @staticmethod
    def forward(ctx, x, beta, threshold):
        ctx.params = (beta, threshold)
        return _apply(_softplus_kernels(beta, threshold)[0], x)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        beta, threshold = ctx.params
        return SoftplusGrad.apply(g, x, beta=beta, threshold=threshold)


def softplus(input, beta=1.0, threshold=20.0):
    return Softplus.apply(_require_float(input, "softplus"), beta=beta, threshold=threshold)


class LeakyRelu(Op):
    name = "LeakyRelu"
    save_inputs = (0,)

    @staticmethod
    def forward(ctx, x, slope):
        ctx.slope = slope
        return xp_of(x).where(x > 0, x, x * slope)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return where(gt(x, 0), g, g * ctx.slope)


def leaky_relu(input, negative_slope=0.01, inplace=False):
    if inplace:
        return _inplace_apply(input, leaky_relu, "leaky_relu_", negative_slope)
    return LeakyRelu.apply(_require_float(input, "leaky_relu"), slope=negative_slope)


def hardtanh(input, min_val=-1.0, max_val=1.0, inplace=False):
    if min_val > max_val:
        raise ValueError(f"hardtanh: min_val ({min_val}) cannot be greater than max_val ({max_val})")
    if inplace:
        return _inplace_apply(input, hardtanh, "hardtanh_", min_val, max_val)
    if not input.is_floating_point():  # integer bounds (truncated) keep an integer input's dtype, as torch's
        min_val, max_val = int(min_val), int(max_val)
    return ClampScalar.apply(input, lo=min_val, hi=max_val, strict=True)


_inplace_apply = inplace.apply_inplace


# ====================================================================== Tensor methods
for _name in ("exp", "log", "log1p", "log2", "expm1", "sqrt", "rsqrt", "sin", "cos", "tanh", "sigmoid",
              "sign", "floor", "ceil", "trunc", "erf", "erfinv", "isnan", "isinf", "isfinite", "relu",
              "clamp_min", "clamp_max", "nan_to_num"):
    setattr(Tensor, _name, globals()[_name])
tensor_method("abs", "__abs__", "absolute")(abs)
tensor_method("round", "__round__")(round)
tensor_method("clamp", "clip")(clamp)


# ---------------------------------------------------------------------- in-place methods
for _name in ("exp", "log", "log1p", "log2", "expm1", "sqrt", "rsqrt", "sin", "cos", "tanh", "sigmoid",
              "abs", "sign", "floor", "ceil", "trunc", "round", "erf", "erfinv", "nan_to_num"):
    setattr(Tensor, _name + "_", inplace.inplace_method(_name + "_", globals()[_name]))


@tensor_method("clamp_", "clip_")
def clamp_(self, min=None, max=None):
    return _clamp_inplace(self, min, max, "clamp_")


@tensor_method()
def clamp_min_(self, min):
    return _clamp_inplace(self, min, None, "clamp_min_")


@tensor_method()
def clamp_max_(self, max):
    return _clamp_inplace(self, None, max, "clamp_max_")


def _clamp_inplace(self, min, max, op):
    inplace.check_inplace_allowed(self, op)
    if inplace.records(self, min, max) or isinstance(min, Tensor) or isinstance(max, Tensor):
        return _inplace_apply(self, clamp, op, min, max)
    if not self.is_floating_point() and (isinstance(min, float) or isinstance(max, float)):
        raise RuntimeError(f"{op}: result type Float can't be cast to the desired output type {self.dtype.name}")
    if min is None and max is None:
        raise RuntimeError(f"{op}: At least one of 'min' or 'max' must not be None")
    a = self._data
    xp = xp_of(a)
    if min is not None:
        xp.maximum(a, min, out=a)
    if max is not None:
        xp.minimum(a, max, out=a)
    self._bump_version()
    return self


tensor_method("relu_")(relu_)
