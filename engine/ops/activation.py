"""Activations beyond the hot ones of engine/ops/unary.py (relu, gelu, silu, softplus, leaky_relu,
hardtanh live there): relu6, hardswish, hardsigmoid, elu / selu / celu, mish, logsigmoid, glu,
prelu, softsign and tanhshrink, with torch's signatures and `inplace` flags; and gumbel_softmax
(torch lists it with the activations; it is only in `F`, not in `engine.*`, as in torch).

Why they look the way they do:
  * None of these is on the hot path of the project's models, so each is either a composition of
    engine ops (softsign, tanhshrink, glu, prelu: what torch itself computes, so autograd gives
    torch's gradients) or one small kernel Op whose backward is written in engine ops (so double
    backward works) where a composition would get a kink wrong.
  * Kinks follow torch's kernels exactly, not the calculus: relu6' is 0 at 0 and 6 (it is
    hardtanh(0, 6)), hardswish' is 0 at -3 and 1 at 3, hardsigmoid' is 0 at +-3, elu' at 0 is
    alpha (the x <= 0 branch), prelu' at 0 is the weight.
  * hardsigmoid's slope is torch's float32 constant 1/6 in every dtype (torch's CPU kernel
    writes `1.0f / 6.0f`), so float64 gradients agree to the last bit rather than to 1e-8.
  * float16 / bfloat16 kernels run in float32 and round the result, as torch's CPU kernels do.
  * gumbel_softmax draws its Gumbel noise inside one Op's forward (not with an in-place fill), so
    a captured nn.Graph draws new noise on every replay, as dropout does.
"""
import warnings

import numpy as np

from ..backend import xp_of
from ..backend.random import default_generator
from . import inplace as _inplace
from ._core import reshape, shape_str
from ._kernels import ignore_fp_errors, work_array
from .comparison import eq, ge, gt, le, where
from .creation import zeros_like
from .op import Op
from .softmax import softmax
from .unary import abs as _abs, exp, hardtanh, log1p, sigmoid, tanh

__all__ = ["relu6", "hardswish", "hardsigmoid", "elu", "selu", "celu", "mish", "logsigmoid", "glu", "prelu",
           "softsign", "tanhshrink", "gumbel_softmax"]

# SELU's constants, as torch writes them
_SELU_ALPHA = 1.6732632423543772848170429916717
_SELU_SCALE = 1.0507009873554804934193349852946
_ONE_SIXTH_F32 = float(np.float32(1.0) / np.float32(6.0))


def _require_float(input, op):
    """torch's CPU kernels of these ops exist for floating dtypes only (NotImplementedError)."""
    if not input.is_floating_point():
        raise NotImplementedError(f"{op}: not implemented for {input.dtype.name} input (shape "
                                  f"{shape_str(input.shape)}); use a floating point tensor")
    return input


class _Kernel(Op):
    """y = kernel(xp, x, **params) elementwise; saves x; backward = grad(g, x, **params) in engine ops."""

    save_inputs = (0,)
    kernel = None
    grad = None

    @classmethod
    def forward(cls, ctx, x, **params):
        ctx.params = params
        xp = xp_of(x)
        w = work_array(x)
        with ignore_fp_errors(xp):
            # (numpy turns 0-d array arithmetic into scalars, which `out=` cannot write: 1 element)
            y = cls.kernel(xp, w.reshape(1), **params).reshape(()) if w.ndim == 0 else cls.kernel(xp, w, **params)
        return y.astype(x.dtype, copy=False)

    @classmethod
    def backward(cls, ctx, g):
        (x,) = ctx.saved_tensors
        return cls.grad(g, x, **ctx.params)


def _run(op_cls, input, inplace, name, **params):
    """op_cls on input, or stored into input under the engine's in-place rule."""
    if inplace:
        return _inplace.apply_inplace(input, lambda t: op_cls.apply(t, **params), name + "_")
    return op_cls.apply(input, **params)


# ---------------------------------------------------------------------- relu6
def relu6(input, inplace=False):
    """min(max(x, 0), 6): torch's relu6 is hardtanh(x, 0, 6), gradient 0 at both edges. Integer
    inputs keep their dtype (integer bounds)."""
    lo, hi = (0.0, 6.0) if input.is_floating_point() else (0, 6)
    return hardtanh(input, lo, hi, inplace=inplace)


# ---------------------------------------------------------------------- hardswish / hardsigmoid
def _k_hardsigmoid(xp, x):
    y = x + 3
    xp.clip(y, 0, 6, out=y)
    y /= 6
    return y


class Hardswish(_Kernel):
    """x * relu6(x + 3) / 6; gradient 0 for x <= -3, x / 3 + 1/2 for -3 < x < 3 (and NaN, as
    torch's), 1 for x >= 3."""

    name = "Hardswish"
    kernel = staticmethod(lambda xp, x: _k_hardsigmoid(xp, x) * x)
    grad = staticmethod(lambda g, x: where(le(x, -3.0), 0.0, where(ge(x, 3.0), g, g * (x / 3.0 + 0.5))))


class HardsigmoidGrad(Op):
    """g / 6 (float32's 1/6) strictly inside (-3, 3), else 0. An op of (g, x) rather than a
    `where` on a mask of x, so that its output depends on x in the graph and a second derivative
    is zeros (torch's), not an error."""

    name = "HardsigmoidGrad"
    save_inputs = (1,)

    @staticmethod
    def forward(ctx, g, x):
        inside = (x > -3) & (x < 3)
        return xp_of(g).multiply(g, inside * g.dtype.type(_ONE_SIXTH_F32))

    @staticmethod
    def backward(ctx, gg):
        (x,) = ctx.saved_tensors
        return HardsigmoidGrad.apply(gg, x), (zeros_like(x) if ctx.needs_input_grad[1] else None)


class Hardsigmoid(_Kernel):
    """relu6(x + 3) / 6; gradient 1/6 (float32's) strictly inside (-3, 3), else 0."""

    name = "Hardsigmoid"
    kernel = staticmethod(_k_hardsigmoid)
    grad = staticmethod(lambda g, x: HardsigmoidGrad.apply(g, x))


def hardswish(input, inplace=False):
    return _run(Hardswish, _require_float(input, "hardswish"), inplace, "hardswish")


def hardsigmoid(input, inplace=False):
    return _run(Hardsigmoid, _require_float(input, "hardsigmoid"), inplace, "hardsigmoid")


# ---------------------------------------------------------------------- elu family
def _k_elu(xp, x, neg, pos, in_scale):
    """torch's elu kernel: neg * (exp(x * in_scale) - 1) for x <= 0, else pos * x."""
    y = xp.expm1(x * x.dtype.type(in_scale))
    y *= x.dtype.type(neg)
    return xp.where(x <= 0, y, x * x.dtype.type(pos))


def _elu_grad(g, x, neg, pos, in_scale):
    """torch's elu_backward: x <= 0 takes the exponential branch, everything else (NaN included)
    gets g * pos; the branch's value at 0 is neg * in_scale, and torch's second derivative is taken
    on x < 0 only, so at 0 the branch is written as the constant it equals there."""
    neg_branch = where(eq(x, 0.0), g * (neg * in_scale), g * exp(x * in_scale) * (neg * in_scale))
    return where(le(x, 0.0), neg_branch, g * pos)


class Elu(_Kernel):
    """ELU (neg = alpha), SELU (neg = alpha * scale, pos = scale) and CELU (in_scale = 1 / alpha)."""

    name = "Elu"
    kernel = staticmethod(_k_elu)
    grad = staticmethod(_elu_grad)


def elu(input, alpha=1.0, inplace=False):
    """x for x > 0, alpha * (exp(x) - 1) otherwise."""
    return _run(Elu, _require_float(input, "elu"), inplace, "elu", neg=float(alpha), pos=1.0, in_scale=1.0)


def selu(input, inplace=False):
    """scale * elu(x, alpha) with SELU's fixed alpha and scale."""
    return _run(Elu, _require_float(input, "selu"), inplace, "selu", neg=_SELU_ALPHA * _SELU_SCALE,
                pos=_SELU_SCALE, in_scale=1.0)


def celu(input, alpha=1.0, inplace=False):
    """x for x > 0, alpha * (exp(x / alpha) - 1) otherwise."""
    if alpha == 0:
        raise RuntimeError("celu: ZeroDivisionError: alpha cannot be 0 for CELU")
    return _run(Elu, _require_float(input, "celu"), inplace, "celu", neg=float(alpha), pos=1.0,
                in_scale=1.0 / alpha)


# ---------------------------------------------------------------------- mish / logsigmoid
def _k_mish(xp, x):
    y = xp.exp(x)
    xp.log1p(y, out=y)  # softplus without a threshold, as torch's mish kernel
    xp.tanh(y, out=y)
    y *= x
    return y


def _mish_grad(g, x):
    t = tanh(log1p(exp(x)))
    return g * (t + x * sigmoid(x) * (1 - t * t))


class Mish(_Kernel):
    """x * tanh(softplus(x))."""

    name = "Mish"
    kernel = staticmethod(_k_mish)
    grad = staticmethod(_mish_grad)


def mish(input, inplace=False):
    return _run(Mish, _require_float(input, "mish"), inplace, "mish")


def _k_logsigmoid(xp, x):
    y = xp.abs(x)
    xp.negative(y, out=y)
    xp.exp(y, out=y)
    xp.log1p(y, out=y)
    return xp.minimum(x, 0) - y  # min(x, 0) - log1p(exp(-|x|)): never overflows


class LogSigmoid(_Kernel):
    """log(sigmoid(x)), gradient sigmoid(-x)."""

    name = "LogSigmoid"
    kernel = staticmethod(_k_logsigmoid)
    grad = staticmethod(lambda g, x: g * sigmoid(-x))


def logsigmoid(input):
    return LogSigmoid.apply(_require_float(input, "logsigmoid"))


# ---------------------------------------------------------------------- compositions
def softsign(input):
    """x / (1 + |x|), torch's own composition (integers compute in the default float dtype)."""
    return input / (_abs(input) + 1)


def tanhshrink(input):
    """x - tanh(x), torch's own composition."""
    return input - tanh(input)


def glu(input, dim=-1):
    """a * sigmoid(b) with a, b the two halves of `input` along `dim`."""
    if input.ndim == 0:
        raise RuntimeError("glu does not support scalars because halving size must be even")
    _require_float(input, "glu")
    d = dim + input.ndim if dim < 0 else dim
    if not 0 <= d < input.ndim:
        raise IndexError(f"Dimension out of range (expected to be in range of [{-input.ndim}, {input.ndim - 1}], "
                         f"but got {dim})")
    n = input.shape[d]
    if n % 2:
        raise RuntimeError(f"Halving dimension must be even, but dimension {d} is size {n}")
    a, b = input.split(n // 2, dim=d)
    return a * sigmoid(b)


def prelu(input, weight):
    """x for x > 0, weight * x otherwise; weight has 1 element or one per channel (dim 1; an input
    of fewer than 2 dims has 1 channel)."""
    if weight.ndim > 1:
        raise RuntimeError(f"prelu: Expected `weight` to be a scalar or 1D tensor, but got: ndim = {weight.ndim}")
    channels = input.shape[1] if input.ndim >= 2 else 1
    if weight.numel() != 1 and weight.numel() != channels:
        raise RuntimeError(f"Mismatch of parameter numbers and input channel size. Found parameter numbers = "
                           f"{weight.numel()} and channel size = {channels}.")
    _require_float(input, "prelu")
    if weight.dtype != input.dtype:
        raise RuntimeError(f"prelu: expected weight of dtype {input.dtype.name} (the input's), got {weight.dtype.name}")
    if weight.numel() == 1 or input.ndim < 2:
        w = reshape(weight, ())
    else:
        w = reshape(weight, (channels,) + (1,) * (input.ndim - 2))
    return where(gt(input, 0.0), input, input * w)



# ------------------------------------------------------------------ gumbel_softmax
class GumbelPerturb(Op):
    """(x + G) / tau with G = -log(E), E ~ Exp(1) drawn from `generator`: Gumbel(x, tau) samples.
    Linear in x, so the gradient is g / tau."""

    name = "GumbelPerturb"

    @staticmethod
    def forward(ctx, x, tau, generator):
        ctx.tau = tau
        xp = xp_of(x)
        wt = np.float64 if x.dtype == np.float64 else np.float32
        gumbel = -xp.log(generator.rng(xp).standard_exponential(x.shape, dtype=wt))
        return ((x.astype(wt, copy=False) + gumbel) / wt(tau)).astype(x.dtype, copy=False)

    @staticmethod
    def backward(ctx, g):
        return g / ctx.tau


def gumbel_softmax(logits, tau=1, hard=False, eps=1e-10, dim=-1):
    """softmax((logits + Gumbel noise) / tau): a differentiable sample from the categorical of
    `logits`. hard=True returns the one-hot of the argmax with the soft sample's gradient
    (straight-through: y_hard - y_soft.detach() + y_soft), as torch."""
    if eps != 1e-10:
        warnings.warn("`eps` parameter is deprecated and has no effect.", stacklevel=2)
    if not logits.is_floating_point():
        raise RuntimeError("Exponential distribution is a continuous probability distribution. dtype must be a "
                           f"floating point but you specified {logits.dtype.name}")
    y_soft = softmax(GumbelPerturb.apply(logits, tau=tau, generator=default_generator), dim)
    if not hard:
        return y_soft
    index = y_soft.max(dim, keepdim=True)[1]
    y_hard = zeros_like(logits).scatter_(dim, index, 1.0)
    return y_hard - y_soft.detach() + y_soft
