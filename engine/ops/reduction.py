"""Reductions and scans: sum/mean/var/std/prod, max/min/amax/amin/argmax/argmin, median, logsumexp,
norm, all/any/count_nonzero, cumsum/cumprod/logcumsumexp, topk/sort/argsort, and the sorted-order
queries unique, searchsorted/bucketize and bincount.

Conventions shared by every reduction here (PyTorch's):
  * `dim` is an int, a tuple of ints, or None (= every dim); negative dims count from the end;
  * integer and bool inputs sum/prod/cumsum to int64 unless `dtype=` says otherwise;
  * float16/bfloat16 accumulate in float32 and round once at the end;
  * a backward broadcasts the (kept-dim) output gradient back to the input's shape.
Selections (max/min with dim, topk, sort) are an index computation (no gradient) followed by one
differentiable gather along a dim, whose backward is a scatter into the original positions.
"""
import math
from collections import namedtuple

import ml_dtypes
import numpy as np

from .op import Op
from ..backend import dtypes, host_checks, xp_of
from ..kernels import scatter_add as scatter_kernels
from .comparison import gt, lt, where
from .unary import exp, log
from ..tensor import Tensor, _check_dim, tensor_method
from ._core import (along_index, broadcast_to, cast, const_like, replicated, require_tensor, reshape, scalar_tensor,
                    shape_str)

__all__ = ["sum", "mean", "var", "std", "var_mean", "std_mean", "prod", "max", "min", "amax",
           "amin", "argmax", "argmin", "logsumexp", "norm", "all", "any", "count_nonzero", "cumsum",
           "cumprod", "topk", "sort", "argsort", "median", "kthvalue", "logcumsumexp", "unique", "searchsorted",
           "bucketize", "bincount"]

_builtin_sum, _builtin_max, _builtin_min, _builtin_all, _builtin_any = sum, max, min, all, any

# results that are both a namedtuple (.values/.indices) and a 2-tuple, like torch.return_types
_ret = {n: namedtuple(n, ["values", "indices"]) for n in ("max", "min", "topk", "sort", "median", "kthvalue")}


# ------------------------------------------------------------------ helpers
def _axes(dim, ndim):
    """Normalised reduction axes; None or () means every axis."""
    if ndim == 0:
        if dim is not None and not isinstance(dim, int):
            for d in dim:
                _check_dim(d, 0)
        elif dim is not None:
            _check_dim(dim, 0)
        return ()
    if dim is None:
        return tuple(range(ndim))
    if isinstance(dim, (int, np.integer)):
        return (_check_dim(int(dim), ndim),)
    dims = tuple(_check_dim(int(d), ndim) for d in dim)
    if not dims:
        return tuple(range(ndim))
    if len(set(dims)) != len(dims):
        raise RuntimeError(f"dim {list(dim)} appears multiple times in the list of dims")
    return dims


def _kept_shape(shape, axes):
    return tuple(1 if i in axes else s for i, s in enumerate(shape))


def _numel(shape, axes):
    n = 1
    for a in axes:
        n *= shape[a]
    return n


def _expand_back(g, in_shape, axes, keepdim):
    """The output gradient of a reduction, broadcast back to the input's shape."""
    if not keepdim and axes:
        g = reshape(g, _kept_shape(in_shape, axes))
    return broadcast_to(g, in_shape)


def _acc_dtype(np_dtype):
    """Accumulation dtype: float32 for the 16-bit floats."""
    if np_dtype == np.float16 or np_dtype == dtypes.bfloat16.np:
        return np.dtype(np.float32)
    return np_dtype


def _arr(xp, a, dtype=None):
    """numpy reductions return numpy scalars for 0-d results; the engine wants arrays."""
    if dtype is not None and a.dtype != dtype:
        return xp.asarray(a).astype(dtype)
    return xp.asarray(a)


def _is_float(np_dtype):
    return np_dtype.kind == "f" or np_dtype == dtypes.bfloat16.np


def _int_sum_dtype(t, dtype):
    if dtype is not None:
        return dtypes.as_dtype(dtype)
    if t.dtype._category < 2:
        return dtypes.int64
    return t.dtype


def _const(array, like):
    return Tensor._make(array, like._device)


# ------------------------------------------------------------------ sum / mean
class Sum(Op):
    name = "Sum"

    @staticmethod
    def forward(ctx, x, axes, keepdim, dtype):
        ctx.in_shape, ctx.axes, ctx.keepdim, ctx.in_dtype = x.shape, axes, keepdim, x.dtype
        xp = xp_of(x)
        out = dtype.np
        return _arr(xp, x.sum(axis=axes, keepdims=keepdim, dtype=_acc_dtype(out)), out)

    @staticmethod
    def backward(ctx, g):
        g = _expand_back(g, ctx.in_shape, ctx.axes, ctx.keepdim)
        return cast(g, dtypes.from_numpy_dtype(ctx.in_dtype))


def sum(input, dim=None, keepdim=False, *, dtype=None):
    axes = _axes(dim, input._data.ndim)
    return Sum.apply(input, axes=axes, keepdim=bool(keepdim), dtype=_int_sum_dtype(input, dtype))


class Mean(Op):
    name = "Mean"

    @staticmethod
    def forward(ctx, x, axes, keepdim):
        ctx.in_shape, ctx.axes, ctx.keepdim = x.shape, axes, keepdim
        xp = xp_of(x)
        n = _numel(x.shape, axes)
        s = x.sum(axis=axes, keepdims=keepdim, dtype=_acc_dtype(x.dtype))
        if n == 0:
            return xp.full(xp.shape(s), xp.nan, dtype=x.dtype)
        return _arr(xp, s / s.dtype.type(n), x.dtype)  # a scalar operand: nothing copied to a GPU

    @staticmethod
    def backward(ctx, g):
        n = _numel(ctx.in_shape, ctx.axes)
        return _expand_back(g, ctx.in_shape, ctx.axes, ctx.keepdim) * (1.0 / n if n else math.nan)


def _require_float(t, op, dtype=None):
    if dtype is not None:
        t = cast(t, dtypes.as_dtype(dtype))
    if not t.is_floating_point():
        raise RuntimeError(
            f"{op}(): could not infer output dtype. Input dtype must be either a floating point or "
            f"complex dtype. Got: {t.dtype.name}"
        )
    return t


def mean(input, dim=None, keepdim=False, *, dtype=None):
    input = _require_float(input, "mean", dtype)
    return Mean.apply(input, axes=_axes(dim, input._data.ndim), keepdim=bool(keepdim))


# ------------------------------------------------------------------ var / std
def _var_kernel(x, axes, correction, keepdim):
    xp = xp_of(x)
    acc = _acc_dtype(x.dtype)
    n = _numel(x.shape, axes)
    if n == 0:
        shape = _kept_shape(x.shape, axes) if keepdim else tuple(s for i, s in enumerate(x.shape) if i not in axes)
        return xp.full(shape, xp.nan, dtype=acc)
    m = x.mean(axis=axes, keepdims=True, dtype=acc)
    d = x.astype(acc, copy=False) - m
    d *= d
    s = d.sum(axis=axes, keepdims=keepdim)
    with np.errstate(divide="ignore", invalid="ignore"):
        return _arr(xp, s / np.dtype(acc).type(_builtin_max(n - correction, 0)))


class Var(Op):
    name = "Var"
    save_inputs = (0,)

    @staticmethod
    def forward(ctx, x, axes, correction, keepdim):
        ctx.axes, ctx.correction, ctx.keepdim = axes, correction, keepdim
        return _var_kernel(x, axes, correction, keepdim).astype(x.dtype, copy=False)

    @staticmethod
    def backward(ctx, g):
        x, = ctx.saved_tensors
        return _var_backward(g, x, ctx.axes, ctx.correction, ctx.keepdim)


def _var_backward(g, x, axes, correction, keepdim):
    n = _numel(tuple(x.shape), axes)
    centered = x - Mean.apply(x, axes=axes, keepdim=True)
    scale = 2.0 / (n - correction) if n - correction > 0 else math.inf
    return _expand_back(g, tuple(x.shape), axes, keepdim) * centered * scale


class Std(Op):
    name = "Std"
    save_inputs = (0,)
    save_outputs = (0,)

    @staticmethod
    def forward(ctx, x, axes, correction, keepdim):
        ctx.axes, ctx.correction, ctx.keepdim = axes, correction, keepdim
        v = _var_kernel(x, axes, correction, keepdim)
        return xp_of(x).sqrt(v).astype(x.dtype, copy=False)

    @staticmethod
    def backward(ctx, g):
        x, out = ctx.saved_tensors
        # d std = d var / (2 std); PyTorch gives 0 (not nan) where std == 0
        return _var_backward(g * SafeReciprocal.apply(out) * 0.5, x, ctx.axes, ctx.correction, ctx.keepdim)


class SafeReciprocal(Op):
    """1/x, with 0 where x == 0 (the convention of PyTorch's std and norm backward)."""

    name = "SafeReciprocal"
    save_inputs = (0,)
    save_outputs = (0,)

    @staticmethod
    def forward(ctx, x):
        xp = xp_of(x)
        zero = x == 0
        out = xp.asarray(xp.divide(1, xp.where(zero, 1, x)), dtype=x.dtype)
        out[zero] = 0
        return out

    @staticmethod
    def backward(ctx, g):
        x, r = ctx.saved_tensors
        return -g * r * r


def _correction(unbiased, correction):
    if correction is not None:
        if unbiased is not None:
            raise RuntimeError("var/std: pass either `unbiased` or `correction`, not both")
        return correction
    return 1 if unbiased is None or unbiased else 0


def _var_args(input, dim, unbiased, keepdim, correction, op):
    if isinstance(dim, bool):  # torch.var(x, False): the second positional is `unbiased`
        dim, unbiased = None, dim
    input = _require_float(input, op)
    return input, dict(axes=_axes(dim, input._data.ndim), correction=_correction(unbiased, correction),
                       keepdim=bool(keepdim))


def var(input, dim=None, unbiased=None, keepdim=False, *, correction=None):
    input, attrs = _var_args(input, dim, unbiased, keepdim, correction, "var")
    return Var.apply(input, **attrs)


def std(input, dim=None, unbiased=None, keepdim=False, *, correction=None):
    input, attrs = _var_args(input, dim, unbiased, keepdim, correction, "std")
    return Std.apply(input, **attrs)


def var_mean(input, dim=None, unbiased=None, keepdim=False, *, correction=None):
    input, attrs = _var_args(input, dim, unbiased, keepdim, correction, "var_mean")
    return Var.apply(input, **attrs), Mean.apply(input, axes=attrs["axes"], keepdim=attrs["keepdim"])


def std_mean(input, dim=None, unbiased=None, keepdim=False, *, correction=None):
    input, attrs = _var_args(input, dim, unbiased, keepdim, correction, "std_mean")
    return Std.apply(input, **attrs), Mean.apply(input, axes=attrs["axes"], keepdim=attrs["keepdim"])


# ------------------------------------------------------------------ prod
class Prod(Op):
    name = "Prod"
    save_inputs = (0,)
    save_outputs = (0,)

    @staticmethod
    def forward(ctx, x, axes, keepdim, dtype):
        ctx.axes, ctx.keepdim = axes, keepdim
        return _arr(xp_of(x), x.prod(axis=axes, keepdims=keepdim, dtype=_acc_dtype(dtype.np)), dtype.np)

    @staticmethod
    def backward(ctx, g):
        x, out = ctx.saved_tensors
        shape, axes, keepdim = tuple(x.shape), ctx.axes, ctx.keepdim
        gb = _expand_back(g, shape, axes, keepdim)
        xa = x._data
        if not (xa == 0).any():
            return gb * _expand_back(out, shape, axes, keepdim) / x
        # with zeros: d out / d x_i = product of the other elements, computed directly
        return gb * _const(_prod_of_others(xa, axes), x)


def _prod_of_others(x, axes):
    xp = xp_of(x)
    zero = x == 0
    nz = xp.where(zero, xp.ones((), dtype=x.dtype), x)
    p_nz = nz.prod(axis=axes, keepdims=True)
    n_zero = zero.sum(axis=axes, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        others = xp.where(n_zero == 0, p_nz / nz, 0)
    return xp.where(zero & (n_zero == 1), p_nz, others).astype(x.dtype, copy=False)


def prod(input, dim=None, keepdim=False, *, dtype=None):
    axes = _axes(dim, input._data.ndim)
    out_dtype = _int_sum_dtype(input, dtype)
    if out_dtype is not input.dtype and out_dtype.is_floating_point:
        input = cast(input, out_dtype)
    return Prod.apply(input, axes=axes, keepdim=bool(keepdim), dtype=out_dtype)


# ------------------------------------------------------------------ max / min family
class Amax(Op):
    """max/min over `axes`; the gradient is shared evenly among tied maxima (as PyTorch)."""

    name = "Amax"
    save_inputs = (0,)
    save_outputs = (0,)

    @staticmethod
    def forward(ctx, x, axes, keepdim, is_min):
        ctx.axes, ctx.keepdim = axes, keepdim
        xp = xp_of(x)
        f = xp.min if is_min else xp.max
        return _arr(xp, f(x, axis=axes, keepdims=keepdim))

    @staticmethod
    def backward(ctx, g):
        x, out = ctx.saved_tensors
        xa, oa = x._data, out._data
        if not ctx.keepdim:
            oa = oa.reshape(_kept_shape(xa.shape, ctx.axes))
        hit = (xa == oa).astype(xa.dtype)
        hit /= hit.sum(axis=ctx.axes, keepdims=True)
        return _expand_back(g, xa.shape, ctx.axes, ctx.keepdim) * _const(hit, x)


def _check_nonempty(input, axes, op, error=IndexError):
    """`error`: torch raises RuntimeError from max/min/amax/amin without a dim, IndexError otherwise."""
    shape = input._data.shape
    if input._data.size == 0 and (not axes and not shape or _builtin_any(shape[a] == 0 for a in axes)):
        raise error(
            f"{op}(): Expected reduction dim to be specified for input.numel() == 0. Specify the "
            f"reduction dim with the 'dim' argument (input shape {shape_str(shape)})"
        )


def _amax(input, dim, keepdim, is_min, op):
    axes = _axes(dim, input._data.ndim)
    every = dim is None or dim == ()  # amax's default () means every dim
    _check_nonempty(input, tuple(range(input._data.ndim)) if every else axes, op,
                    RuntimeError if every else IndexError)
    return Amax.apply(input, axes=axes, keepdim=bool(keepdim), is_min=is_min)


def amax(input, dim=(), keepdim=False):
    return _amax(input, dim, keepdim, False, "amax")


def amin(input, dim=(), keepdim=False):
    return _amax(input, dim, keepdim, True, "amin")


class ArgMax(Op):
    name = "ArgMax"
    differentiable = False

    @staticmethod
    def forward(ctx, x, dim, keepdim, is_min):
        xp = xp_of(x)
        f = xp.argmin if is_min else xp.argmax
        if dim is None:
            out = f(x.reshape(-1))
            return xp.asarray(out, dtype=np.int64).reshape((1,) * x.ndim if keepdim else ())
        return _arr(xp, f(x, axis=dim, keepdims=keepdim), np.int64)


def _argmax(input, dim, keepdim, is_min, op):
    if input._data.ndim == 0:
        if dim is not None:
            _check_dim(dim, 0)
        return ArgMax.apply(input, dim=None, keepdim=False, is_min=is_min)
    d = None if dim is None else _check_dim(dim, input._data.ndim)
    _check_nonempty(input, (d,) if d is not None else tuple(range(input._data.ndim)), op)
    return ArgMax.apply(input, dim=d, keepdim=bool(keepdim), is_min=is_min)


def argmax(input, dim=None, keepdim=False):
    return _argmax(input, dim, keepdim, False, "argmax")


def argmin(input, dim=None, keepdim=False):
    return _argmax(input, dim, keepdim, True, "argmin")


class GatherAlong(Op):
    """`x` picked at `index` along `dim` (index has x's shape except along dim); `squeeze`
    drops that dim afterwards. The backward scatters into the original positions."""

    name = "GatherAlong"

    @staticmethod
    def forward(ctx, x, index, dim, squeeze):
        ctx.index, ctx.dim, ctx.squeeze, ctx.shape = index, dim, squeeze, x.shape
        out = x[along_index(index, dim)]
        return out.reshape(out.shape[:dim] + out.shape[dim + 1:]) if squeeze else out

    @staticmethod
    def backward(ctx, g):
        return ScatterAlong.apply(g, index=ctx.index, dim=ctx.dim, squeeze=ctx.squeeze, shape=ctx.shape)


class ScatterAlong(Op):
    """Zeros of `shape` with `g` written at `index` along `dim` (indices are distinct along dim:
    they come from max/sort/topk)."""

    name = "ScatterAlong"

    @staticmethod
    def forward(ctx, g, index, dim, squeeze, shape):
        ctx.index, ctx.dim, ctx.squeeze = index, dim, squeeze
        xp = xp_of(g)
        if squeeze:
            g = xp.expand_dims(g, dim)
        out = xp.zeros(shape, dtype=g.dtype)
        out[along_index(index, dim)] = g
        return out

    @staticmethod
    def backward(ctx, gg):
        return GatherAlong.apply(gg, index=ctx.index, dim=ctx.dim, squeeze=ctx.squeeze)


def _max_dim(input, dim, keepdim, is_min, op):
    input = replicated(input)  # the positions are computed here from the values
    n = input._data.ndim
    d = _check_dim(dim, n)
    if n == 0:
        return _ret[op](input, const_like(xp_of(input._data).zeros((), dtype=np.int64), input))
    if input._data.shape[d] == 0:
        raise IndexError(f"{op}(): Expected reduction dim {d} to have non-zero size (input shape {shape_str(input.shape)})")
    xp = xp_of(input._data)
    f = xp.argmin if is_min else xp.argmax
    idx = f(input._data, axis=d, keepdims=True).astype(np.int64, copy=False)
    values = GatherAlong.apply(input, index=idx, dim=d, squeeze=not keepdim)
    indices = const_like(idx if keepdim else idx.reshape(values._data.shape), input)
    return _ret[op](values, indices)


def _max_min(input, dim, keepdim, other, is_min):
    op = "min" if is_min else "max"
    require_tensor(input, op)
    if isinstance(dim, Tensor):
        dim, other = None, dim
    if other is not None:
        from . import comparison  # imported late to avoid a cycle

        return (comparison.minimum if is_min else comparison.maximum)(input, other)
    if dim is None:
        if keepdim:
            raise TypeError(f"{op}(): keepdim=True needs a dim")
        return _amax(input, None, False, is_min, op)
    return _max_dim(input, dim, keepdim, is_min, op)


def max(input, dim=None, keepdim=False, *, other=None):
    """max(x) -> max over all; max(x, dim, keepdim) -> (values, indices); max(x, y) -> maximum."""
    return _max_min(input, dim, keepdim, other, False)


def min(input, dim=None, keepdim=False, *, other=None):
    return _max_min(input, dim, keepdim, other, True)


# ------------------------------------------------------------------ logsumexp
class LogSumExp(Op):
    name = "LogSumExp"
    save_inputs = (0,)
    save_outputs = (0,)

    @staticmethod
    def forward(ctx, x, axes, keepdim):
        ctx.axes, ctx.keepdim = axes, keepdim
        xp = xp_of(x)
        if x.size == 0:
            shape = _kept_shape(x.shape, axes) if keepdim else tuple(s for i, s in enumerate(x.shape) if i not in axes)
            return xp.full(shape, -xp.inf, dtype=x.dtype)
        acc = _acc_dtype(x.dtype)
        m = x.max(axis=axes, keepdims=True).astype(acc)
        m[~xp.isfinite(m)] = 0
        e = x - m
        xp.exp(e, out=e)
        out = xp.log(e.sum(axis=axes, keepdims=True))
        out += m
        if not keepdim:
            out = out.reshape(tuple(s for i, s in enumerate(x.shape) if i not in axes))
        return out.astype(x.dtype, copy=False)

    @staticmethod
    def backward(ctx, g):
        x, out = ctx.saved_tensors
        shape = tuple(x.shape)
        w = exp(x - _expand_back(out, shape, ctx.axes, ctx.keepdim))  # softmax weights
        return _expand_back(g, shape, ctx.axes, ctx.keepdim) * w


def logsumexp(input, dim, keepdim=False):
    if not input.is_floating_point():
        input = cast(input, dtypes.get_default_dtype())
    if input.dim() == 0:  # dims 0 / -1 name the scalar itself, as in torch
        _axes(dim, 0)
        return logsumexp(input.reshape(1), 0, keepdim=False)
    return LogSumExp.apply(input, axes=_axes(dim, input._data.ndim), keepdim=bool(keepdim))


# ------------------------------------------------------------------ norm
class Norm(Op):
    name = "Norm"
    save_inputs = (0,)
    save_outputs = (0,)

    @staticmethod
    def forward(ctx, x, p, axes, keepdim):
        ctx.p, ctx.axes, ctx.keepdim = p, axes, keepdim
        xp = xp_of(x)
        acc = _acc_dtype(x.dtype)
        xa = x.astype(acc, copy=False)
        if p == 2:
            out = xp.sqrt((xa * xa).sum(axis=axes, keepdims=keepdim))
        elif p == 1:
            out = xp.abs(xa).sum(axis=axes, keepdims=keepdim)
        elif p == math.inf:
            out = xp.abs(xa).max(axis=axes, keepdims=keepdim)
        elif p == -math.inf:
            out = xp.abs(xa).min(axis=axes, keepdims=keepdim)
        elif p == 0:
            out = (xa != 0).sum(axis=axes, keepdims=keepdim, dtype=acc)
        else:
            out = (xp.abs(xa) ** p).sum(axis=axes, keepdims=keepdim) ** (1.0 / p)
        return _arr(xp, out, x.dtype)

    @staticmethod
    def backward(ctx, g):
        x, out = ctx.saved_tensors
        p, axes, keepdim = ctx.p, ctx.axes, ctx.keepdim
        shape = tuple(x.shape)
        if p == 2:
            return x * _expand_back(g * SafeReciprocal.apply(out), shape, axes, keepdim)
        gb = _expand_back(g, shape, axes, keepdim)
        return gb * _const(_norm_grad_factor(x._data, out._data, p, axes, keepdim), x)


def _norm_grad_factor(x, out, p, axes, keepdim):
    """d norm / d x for p != 2, as a constant array (exact first derivative)."""
    xp = xp_of(x)
    if not keepdim:
        out = out.reshape(_kept_shape(x.shape, axes))
    sign = xp.sign(x)
    if p == 1:
        return sign
    if p == 0:
        return xp.zeros_like(x)
    if p in (math.inf, -math.inf):
        hit = (xp.abs(x) == out).astype(x.dtype)
        return sign * hit / hit.sum(axis=axes, keepdims=True)
    a = xp.abs(x)
    with np.errstate(divide="ignore", invalid="ignore"):
        f = sign * a ** (p - 1) / out ** (p - 1)
    f = xp.where(xp.isfinite(f) & (out != 0), f, 0)
    return f.astype(x.dtype, copy=False)


class NuclearNorm(Op):
    """Sum of the singular values of the matrices over `axes` (a pair); d/dx = U V^H."""

    name = "NuclearNorm"
    save_inputs = ()

    @staticmethod
    def forward(ctx, x, axes, keepdim):
        xp = xp_of(x)
        moved = xp.moveaxis(x, axes, (-2, -1))
        u, sv, vh = xp.linalg.svd(moved, full_matrices=False)
        ctx.axes, ctx.keepdim, ctx.uvh = axes, keepdim, u @ vh
        out = sv.sum(axis=-1)
        if keepdim:
            out = xp.expand_dims(out, tuple(sorted(axes)))
        return _arr(xp, out, x.dtype)

    @staticmethod
    def backward(ctx, g):
        gk = g if ctx.keepdim else g.reshape(tuple(ctx.uvh.shape[:-2]) + (1, 1))
        if ctx.keepdim:  # move the kept unit dims to the end, where uvh keeps its matrix dims
            gk = gk.movedim(tuple(sorted(ctx.axes)), (-2, -1))
        grad = gk * _const(ctx.uvh, g)
        return grad.movedim((-2, -1), ctx.axes)


def _nuclear_norm(input, dim, keepdim):
    if dim is None:
        if input.dim() != 2:
            raise RuntimeError(f"norm: p='nuc' needs a 2-D input or a pair of dims, got input of shape "
                               f"{shape_str(input.shape)}")
        dim = (0, 1)
    if isinstance(dim, int) or len(dim) != 2:
        raise RuntimeError(f"norm: p='nuc' needs dim to be a pair of dims, got {dim}")
    axes = tuple(_check_dim(int(d), input.dim()) for d in dim)
    if axes[0] == axes[1]:
        raise RuntimeError(f"norm: p='nuc' needs two different dims, got {dim}")
    return NuclearNorm.apply(input, axes=axes, keepdim=bool(keepdim))


def norm(input, p="fro", dim=None, keepdim=False, dtype=None):
    if dtype is not None:
        input = cast(input, dtypes.as_dtype(dtype))
    if not input.is_floating_point():
        raise RuntimeError(f"norm(): input dtype should be either floating point or complex. Got {input.dtype.name} instead.")
    if p is None or p == "fro":
        p = 2
    elif p == "nuc":
        return _nuclear_norm(input, dim, keepdim)
    elif isinstance(p, str):
        raise RuntimeError(f"norm: p={p!r} is not supported (use 'fro', 'nuc' or a number)")
    p = float(p)
    return Norm.apply(input, p=p, axes=_axes(dim, input._data.ndim), keepdim=bool(keepdim))


# ------------------------------------------------------------------ logical reductions
class _Logical(Op):
    name = "Logical"
    differentiable = False

    @staticmethod
    def forward(ctx, x, axes, keepdim, is_any):
        xp = xp_of(x)
        f = xp.any if is_any else xp.all
        return _arr(xp, f(x, axis=axes, keepdims=keepdim))


def all(input, dim=None, keepdim=False):
    return _Logical.apply(input, axes=_axes(dim, input._data.ndim), keepdim=bool(keepdim), is_any=False)


def any(input, dim=None, keepdim=False):
    return _Logical.apply(input, axes=_axes(dim, input._data.ndim), keepdim=bool(keepdim), is_any=True)


class _CountNonzero(Op):
    name = "CountNonzero"
    differentiable = False

    @staticmethod
    def forward(ctx, x, axes):
        xp = xp_of(x)
        return _arr(xp, (x != 0).sum(axis=axes, dtype=np.int64))


def count_nonzero(input, dim=None):
    return _CountNonzero.apply(input, axes=_axes(dim, input._data.ndim))


# ------------------------------------------------------------------ scans
class Cumsum(Op):
    """Cumulative sum along `dim` (`reverse`: from the end); each is the other's backward."""

    name = "Cumsum"

    @staticmethod
    def forward(ctx, x, dim, reverse, dtype):
        ctx.dim, ctx.reverse, ctx.in_dtype = dim, reverse, x.dtype
        xp = xp_of(x)
        if x.ndim == 0:
            return x.astype(dtype.np)
        if reverse:
            x = xp.flip(x, dim)
        out = xp.cumsum(x, axis=dim, dtype=_acc_dtype(dtype.np))
        if reverse:
            out = xp.flip(out, dim)
        return out.astype(dtype.np, copy=False)

    @staticmethod
    def backward(ctx, g):
        g = Cumsum.apply(g, dim=ctx.dim, reverse=not ctx.reverse, dtype=g.dtype)
        return cast(g, dtypes.from_numpy_dtype(ctx.in_dtype))


def cumsum(input, dim, *, dtype=None):
    d = _check_dim(dim, input._data.ndim)
    return Cumsum.apply(input, dim=d, reverse=False, dtype=_int_sum_dtype(input, dtype))


class Cumprod(Op):
    name = "Cumprod"
    save_inputs = (0,)
    save_outputs = (0,)

    @staticmethod
    def forward(ctx, x, dim, dtype):
        ctx.dim = dim
        xp = xp_of(x)
        if x.ndim == 0:
            return x.astype(dtype.np)
        return xp.cumprod(x, axis=dim, dtype=_acc_dtype(dtype.np)).astype(dtype.np, copy=False)

    @staticmethod
    def backward(ctx, g):
        x, out = ctx.saved_tensors
        d = ctx.dim
        if x.ndim == 0:
            return g
        if not (x._data == 0).any():
            # d out_j / d x_i = out_j / x_i for j >= i: a reverse cumulative sum
            return Cumsum.apply(g * out, dim=d, reverse=True, dtype=g.dtype) / x
        return _const(_cumprod_grad_with_zeros(x._data, g._data, d), x)


def _cumprod_grad_with_zeros(x, g, dim):
    """Exact gradient when x has zeros: grad_i = sum_{j>=i} g_j prod_{k<=j, k!=i} x_k (O(n^2))."""
    xp = xp_of(x)
    xm = xp.moveaxis(x, dim, -1)
    gm = xp.moveaxis(g, dim, -1)
    n = xm.shape[-1]
    out = xp.empty_like(xm)
    for i in range(n):
        y = xm.copy()
        y[..., i] = 1
        c = xp.cumprod(y, axis=-1)
        out[..., i] = (gm[..., i:] * c[..., i:]).sum(axis=-1)
    return xp.ascontiguousarray(xp.moveaxis(out, -1, dim))


def cumprod(input, dim, *, dtype=None):
    d = _check_dim(dim, input._data.ndim)
    out_dtype = _int_sum_dtype(input, dtype)
    if out_dtype is not input.dtype and out_dtype.is_floating_point:
        input = cast(input, out_dtype)
    return Cumprod.apply(input, dim=d, dtype=out_dtype)


# ------------------------------------------------------------------ sort / topk
def _sort_index(x, dim, descending, stable=True):
    """Indices that sort `x` along `dim` (stable; NaN counts as the largest value, as in PyTorch)."""
    xp = xp_of(x)
    if x.dtype == np.bool_:
        x = x.astype(np.int8)
    if descending:
        if x.dtype.kind == "f" or x.dtype == dtypes.bfloat16.np:
            key = -x.astype(_acc_dtype(x.dtype), copy=False)
            key[xp.isnan(key)] = -xp.inf
        elif x.dtype.kind == "u":
            key = x.max() - x if x.size else x
        else:
            key = -x.astype(np.int64, copy=False)
    else:
        key = x.astype(_acc_dtype(x.dtype), copy=False)
    return xp.argsort(key, axis=dim, kind="stable").astype(np.int64, copy=False)


def sort(input, dim=-1, descending=False, stable=False):
    input = replicated(input)
    if input._data.ndim == 0:
        _check_dim(dim, 0)
        return _ret["sort"](input, const_like(xp_of(input._data).zeros((), dtype=np.int64), input))
    d = _check_dim(dim, input._data.ndim)
    idx = _sort_index(input._data, d, descending)
    values = GatherAlong.apply(input, index=idx, dim=d, squeeze=False)
    return _ret["sort"](values, const_like(idx, input))


def argsort(input, dim=-1, descending=False, stable=False):
    input = replicated(input)
    if input._data.ndim == 0:
        _check_dim(dim, 0)
        return const_like(xp_of(input._data).zeros((), dtype=np.int64), input)
    return const_like(_sort_index(input._data, _check_dim(dim, input._data.ndim), descending), input)


def topk(input, k, dim=-1, largest=True, sorted=True):
    input = replicated(input)
    n = input._data.ndim
    d = _check_dim(dim, n)
    size = input._data.shape[d] if n else 1
    if not 0 <= k <= size:
        raise RuntimeError(f"topk: k ({k}) is out of range for dimension {dim} of size {size}")
    if n == 0:
        return _ret["topk"](input, const_like(xp_of(input._data).zeros((), dtype=np.int64), input))
    idx = _sort_index(input._data, d, largest)
    sl = [slice(None)] * n
    sl[d] = slice(0, k)
    idx = xp_of(idx).ascontiguousarray(idx[tuple(sl)])
    values = GatherAlong.apply(input, index=idx, dim=d, squeeze=False)
    return _ret["topk"](values, const_like(idx, input))


# ------------------------------------------------------------------ median
class Median(Op):
    """The lower median of all elements (NaN if any is NaN). The gradient is shared evenly by the
    elements equal to it, as torch's (median along a dim picks one index instead)."""

    name = "Median"
    save_inputs, save_outputs = (0,), (0,)

    @staticmethod
    def forward(ctx, x):
        flat, floating, xp = x.reshape(-1), _is_float(x.dtype), xp_of(x)
        if not flat.size:
            return xp.full((), np.nan if floating else np.iinfo(x.dtype).min, dtype=x.dtype)
        k = (flat.size - 1) // 2
        out = xp.partition(flat, k)[k]
        if floating:
            out = xp.where(xp.isnan(flat).any(), xp.asarray(np.nan, dtype=x.dtype), out)
        return xp.asarray(out, dtype=x.dtype)

    @staticmethod
    def backward(ctx, g):
        x, out = ctx.saved_tensors
        xa, oa = x._data, out._data
        xp = xp_of(xa)
        hit = (xa == oa) | (xp.isnan(xa) & xp.isnan(oa))
        hit = hit.astype(xa.dtype)
        hit /= hit.sum()
        return broadcast_to(reshape(g, (1,) * xa.ndim), xa.shape) * _const(hit, x)


def median(input, dim=None, keepdim=False):
    """median(x): the lower median of all elements; median(x, dim, keepdim): (values, indices)
    along dim, the index being the median's position in a stable sort (a slice with a NaN gives
    NaN and the index of its first NaN), as torch's CPU kernel."""
    if dim is None:
        return Median.apply(input)
    input = replicated(input)
    n = input._data.ndim
    d = _check_dim(dim, n)
    xp = xp_of(input._data)
    if n == 0:
        return _ret["median"](input, const_like(xp.zeros((), dtype=np.int64), input))
    size = input._data.shape[d]
    if size == 0:
        raise IndexError(f"median(): Expected reduction dim {d} to have non-zero size.")
    a = input._data
    order = _sort_index(a, d, False)  # NaN sorts last
    k = xp.full(_kept_shape(a.shape, (d,)), (size - 1) // 2, dtype=np.int64)
    if _is_float(a.dtype):
        nans = xp.isnan(a).sum(axis=d, keepdims=True)
        k = xp.where(nans > 0, size - nans, k)  # the first NaN: a NaN anywhere makes the median NaN
    idx = xp.take_along_axis(order, k, axis=d)
    values = GatherAlong.apply(input, index=idx, dim=d, squeeze=not keepdim)
    return _ret["median"](values, const_like(idx if keepdim else idx.reshape(values._data.shape), input))


def kthvalue(input, k, dim=-1, keepdim=False):
    """(values, indices) of the k-th smallest element along `dim`, NaN sorting last (as torch's
    CPU kernel); the index is its position in a stable sort (with ties torch's may differ)."""
    input = replicated(input)
    n = input._data.ndim
    d = _check_dim(dim, n)
    xp = xp_of(input._data)
    size = input._data.shape[d] if n else 1
    if not 1 <= k <= size:
        raise RuntimeError(f"kthvalue(): selected number k out of range for dimension {d}")
    if n == 0:
        return _ret["kthvalue"](input.clone(), const_like(xp.zeros((), dtype=np.int64), input))
    a = input._data
    idx = xp.take_along_axis(_sort_index(a, d, False), xp.full(_kept_shape(a.shape, (d,)), k - 1, dtype=np.int64),
                             axis=d)
    values = GatherAlong.apply(input, index=idx, dim=d, squeeze=not keepdim)
    return _ret["kthvalue"](values, const_like(idx if keepdim else idx.reshape(values._data.shape), input))


# ------------------------------------------------------------------ logcumsumexp
class LogCumSumExp(Op):
    """log(cumsum(exp(x))) along `dim` (`reverse`: from the end), stably: each step is logaddexp
    of the running value and the next element (numpy's logaddexp.accumulate; on CUDA a log-depth
    scan of the same). The backward is torch's logcumsumexp_backward, written with this op."""

    name = "LogCumSumExp"
    save_inputs = (0,)
    save_outputs = (0,)

    @staticmethod
    def forward(ctx, x, dim, reverse=False):
        ctx.dim, ctx.reverse = dim, reverse
        xp = xp_of(x)
        if x.ndim == 0:
            return x.copy()
        a = x.astype(_acc_dtype(x.dtype))
        if reverse:
            a = xp.flip(a, dim)
        if xp is np:
            with np.errstate(all="ignore"):
                out = np.logaddexp.accumulate(a, axis=dim)
        else:  # Hillis-Steele: out[i] = logaddexp(out[i], out[i - step]) for step = 1, 2, 4, ...
            out, n, step = a, a.shape[dim], 1
            while step < n:
                head = [slice(None)] * a.ndim
                tail = list(head)
                head[dim], tail[dim] = slice(step, None), slice(0, n - step)
                nxt = out.copy()
                nxt[tuple(head)] = xp.logaddexp(out[tuple(head)], out[tuple(tail)])
                out, step = nxt, step * 2
        if reverse:
            out = xp.flip(out, dim)
        return xp.ascontiguousarray(out.astype(x.dtype, copy=False))

    @staticmethod
    def backward(ctx, g):
        x, out = ctx.saved_tensors
        if x.ndim == 0 or not x.numel():
            return g
        lowest = float(ml_dtypes.finfo(g._data.dtype).min)
        log_g = log(g.abs())
        back = dict(dim=ctx.dim, reverse=not ctx.reverse)
        pos = (LogCumSumExp.apply(where(gt(g, 0), log_g, lowest) - out, **back) + x).exp()
        neg = (LogCumSumExp.apply(where(lt(g, 0), log_g, lowest) - out, **back) + x).exp()
        return pos - neg


def logcumsumexp(input, dim):
    if not input.is_floating_point():
        raise NotImplementedError(f'"logcumsumexp" not implemented for \'{input.dtype.name}\'')
    return LogCumSumExp.apply(input, dim=_check_dim(dim, input._data.ndim))


# ------------------------------------------------------------------ unique, searchsorted, bincount
class Unique(Op):
    """The sorted distinct values (of the flattened input, or the distinct slices along `dim`),
    with the inverse indices and the counts; NaNs stay distinct, as in torch."""

    name = "Unique"
    differentiable = False

    @staticmethod
    def forward(ctx, x, dim):
        xp = xp_of(x)
        kw = dict(return_inverse=True, return_counts=True)
        if x.dtype.kind == "f":  # (numpy's own floats: bfloat16 has no NaN folding to turn off)
            kw["equal_nan"] = False
        if dim is None:
            values, inverse, counts = xp.unique(x.reshape(-1), **kw)
            inverse = inverse.reshape(x.shape)
        else:
            values, inverse, counts = _unique_slices(xp, x, dim)
        return values, inverse.astype(np.int64), counts.astype(np.int64)


def _unique_slices(xp, x, dim):
    """unique along `dim`: the distinct slices in lexicographic order, each slice's group and each
    group's size (a lexsort of the flattened slices: numpy's unique(axis=) needs structured
    dtypes, which CuPy has not)."""
    moved = xp.moveaxis(x, dim, 0)
    n = moved.shape[0]
    rows = moved.reshape(n, math.prod(moved.shape[1:]))  # (not -1: the selected dim may be empty)
    if rows.dtype == np.bool_:
        rows = rows.astype(np.int8)
    if rows.shape[1]:
        order = xp.lexsort(xp.ascontiguousarray(rows.T[::-1]))  # the first column is the primary key
    else:
        order = xp.arange(n)
    ordered = rows[order]
    first = xp.ones(n, dtype=np.bool_)
    if n:
        first[1:] = (ordered[1:] != ordered[:-1]).any(axis=1)
    group = xp.cumsum(first) - 1
    inverse = xp.empty(n, dtype=np.int64)
    inverse[order] = group
    starts = xp.flatnonzero(first)
    counts = xp.diff(xp.concatenate([starts, xp.asarray([n], dtype=starts.dtype)]))
    values = xp.moveaxis(moved[order[starts]], 0, dim)
    return xp.ascontiguousarray(values), inverse, counts


def _unique_dim(dim, shape):
    """`dim` normalised, with torch's errors for a 0-dim input and for empty inputs, which only
    the selected dim may make empty."""
    if not shape:
        raise IndexError(f"Dimension specified as {dim} but tensor has no dimensions")
    d = _check_dim(dim, len(shape))
    if 0 in shape:
        if shape[d] != 0:
            raise RuntimeError("There are 0 sized dimensions, and they aren't selected, so unique cannot be applied")
        if list(shape).count(0) > 1:
            raise RuntimeError("Number of zero sized dimensions is more than one, so unique cannot be applied ")
    return d


def unique(input, sorted=True, return_inverse=False, return_counts=False, dim=None):
    input = replicated(input)
    d = None if dim is None else _unique_dim(dim, input.shape)
    values, inverse, counts = Unique.apply(input, dim=d)
    extra = ((inverse,) if return_inverse else ()) + ((counts,) if return_counts else ())
    return (values,) + extra if extra else values


class SearchSorted(Op):
    """For each value, the index at which it would be inserted into the sorted last dim of `seq`
    (the leftmost, or with `right` the rightmost): one sequence for all values, or one row per
    row of values."""

    name = "SearchSorted"
    differentiable = False

    @staticmethod
    def forward(ctx, seq, values, right, out_dtype):
        xp = xp_of(seq)
        side = "right" if right else "left"
        if seq.ndim == 1:
            out = xp.searchsorted(seq, values, side=side)
        else:
            n = math.prod(seq.shape[:-1])  # (not -1: any dim may be empty)
            rows = seq.reshape(n, seq.shape[-1])
            vals = values.reshape(n, values.shape[-1])
            out = xp.empty(vals.shape, dtype=np.int64)
            for i in range(rows.shape[0]):
                out[i] = xp.searchsorted(rows[i], vals[i], side=side)
        return xp.asarray(out).reshape(values.shape).astype(out_dtype.np)


def searchsorted(sorted_sequence, input, *, out_int32=False, right=False, side=None, sorter=None):
    if side is not None:
        if side not in ("left", "right"):
            raise RuntimeError(f"torch.searchsorted(): side can only be 'left' or 'right' but got {side}")
        if right and side == "left":
            raise RuntimeError("torch.searchsorted(): side and right can't be set to opposites, got side of left "
                               "while right was True")
        right = side == "right"
    seq = sorted_sequence
    if seq.ndim == 0:
        raise RuntimeError("torch.searchsorted(): boundaries tensor should have positive dimension, but got 0 "
                           "dimension")
    if not isinstance(input, Tensor):
        if seq.ndim != 1:
            raise RuntimeError("torch.searchsorted(): input value can be a scalar only when boundaries tensor "
                               f"dimension is 1, but we got boundaries tensor dim({seq.ndim})")
        input = scalar_tensor(input, dtypes.result_type([seq.dtype], scalars=[input]), seq)
    if seq.ndim > 1 and tuple(seq.shape[:-1]) != tuple(input.shape[:-1]):
        raise RuntimeError("torch.searchsorted(): boundaries tensor should be 1 dimension or the first N-1 "
                           "dimensions of boundaries tensor and input value tensor must match, but we got "
                           f"boundaries tensor {shape_str(seq.shape)} and input value tensor {shape_str(input.shape)}")
    if sorter is not None:
        if tuple(sorter.shape) != tuple(seq.shape) or sorter._data.dtype.kind not in "iu":
            raise RuntimeError("torch.searchsorted(): sorter must be a long tensor of the boundaries' shape, got "
                               f"{sorter.dtype.name} {shape_str(sorter.shape)}")
        seq = GatherAlong.apply(replicated(seq), index=replicated(sorter)._data.astype(np.int64), dim=seq.ndim - 1,
                                squeeze=False)
    return SearchSorted.apply(seq, input, right=bool(right), out_dtype=dtypes.int32 if out_int32 else dtypes.int64)


def bucketize(input, boundaries, *, out_int32=False, right=False):
    """The bucket of each value: boundaries[i-1] < v <= boundaries[i] (with `right`, <= and <)."""
    if boundaries.ndim != 1:
        raise RuntimeError(f"boundaries tensor must be 1 dimension, but got dim({boundaries.ndim})")
    return searchsorted(boundaries, input, out_int32=out_int32, right=right)


class Bincount(Op):
    """Occurrences of each non-negative integer (summed `weights` where given), at least
    `minlength` bins."""

    name = "Bincount"
    differentiable = False

    @staticmethod
    def forward(ctx, x, weights, minlength, out_dtype):
        out = scatter_kernels.bincount(x, weights, minlength)
        return out.astype(out_dtype.np, copy=False)


def bincount(input, weights=None, minlength=0):
    if input._data.dtype.kind not in "iu":
        raise NotImplementedError(f'"bincount" not implemented for \'{input.dtype.name}\'')
    if minlength < 0:
        raise RuntimeError("minlength should be >= 0")
    ids = replicated(input)._data
    if input.ndim != 1 or (ids.size and host_checks(ids) and int(ids.min()) < 0):
        raise RuntimeError("bincount only supports 1-d non-negative integral inputs.")
    if weights is not None and (weights.ndim != 1 or weights.shape[0] != input.shape[0]):
        raise RuntimeError("weights should be 1-d and have the same length as input")
    if weights is None:
        out_dtype = dtypes.int64
    else:
        out_dtype = dtypes.float32 if weights.dtype is dtypes.float32 else dtypes.float64
        weights = replicated(weights)
    return Bincount.apply(replicated(input), weights, minlength=int(minlength), out_dtype=out_dtype)


# ------------------------------------------------------------------ Tensor methods
for _name in __all__:
    if _name not in ("searchsorted", "bucketize"):
        tensor_method(_name)(globals()[_name])
