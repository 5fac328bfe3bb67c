"""Primitive ops every family builds on: dtype cast, copy, broadcast and its adjoint, reshape,
and the scalar/dtype plumbing shared by all elementwise ops."""
import numbers

import numpy as np

from ..backend import check_dtype_on, device_of, dtypes, parallel, xp_of
from ..kernels import cast as cast_kernel
from ..tensor import Tensor, _check_dim, tensor_method
from . import cast_cache
from .formats import check_memory_format
from .op import Op, foreign_tensor_error, set_autocast_cast


def shape_str(shape):
    return str(list(shape))


# ------------------------------------------------------------------ dtype cast
class Cast(Op):
    name = "ToCopy"

    @staticmethod
    def forward(ctx, x, dtype, copy=None):
        ctx.src = x.dtype
        if copy is not None and copy.src() is x:  # autocast's current copy of a parameter (cast_cache)
            return copy.buf
        if x.dtype == dtype.np:
            return x
        if not isinstance(x, np.ndarray):
            check_dtype_on(dtype.np, device_of(x))
            if cast_kernel.supported(x, dtype.np):  # float16 <-> float32: ~3x CuPy's astype
                return cast_kernel.cast_cuda(x, dtype.np)
        return x.astype(dtype.np, copy=False)

    @staticmethod
    def backward(ctx, g):
        return cast(g, dtypes.from_numpy_dtype(ctx.src))


def cast(t, dtype):
    dtype = dtypes.as_dtype(dtype)
    if t._data.dtype == dtype.np:
        return t
    return Cast.apply(t, dtype=dtype)


def autocast_cast(t, dtype):
    """Autocast's cast of an op input: a parameter's kept copy when it is current
    (engine/ops/cast_cache.py), else a cast; recorded either way, so that the gradient flows
    back to `t` in its own dtype."""
    copy = cast_cache.current_copy(t, dtype.np)
    if copy is None:
        return Cast.apply(t, dtype=dtype)
    return cast_cache.hand_out(Cast.apply(t, dtype=dtype, copy=copy), copy)


set_autocast_cast(autocast_cast)


class Clone(Op):
    name = "Clone"

    @staticmethod
    def forward(ctx, x):
        return parallel.copy(x) if isinstance(x, np.ndarray) else x.copy()

    @staticmethod
    def backward(ctx, g):
        return g


@tensor_method()
def clone(self, memory_format=None):
    check_memory_format("clone", memory_format)
    return Clone.apply(self)


@tensor_method()
def contiguous(self, memory_format=None):
    check_memory_format("contiguous", memory_format)
    a = self._data
    if a.flags.c_contiguous:
        return self
    return Clone.apply(self)


@tensor_method()
def is_contiguous(self, memory_format=None):
    check_memory_format("is_contiguous", memory_format)
    return bool(self._data.flags.c_contiguous)


@tensor_method()
def stride(self, dim=None):
    """Strides in elements, as torch's: a contiguous tensor (and a global one, whose logical
    layout is contiguous) has the row-major strides of its shape, size-0 and size-1 dims counted
    as 1; a view has its array's strides (0 along broadcast dims)."""
    shape = tuple(self.shape)
    a = self._data
    if self._global is not None or a.flags.c_contiguous:
        strides, step = [], 1
        for s in reversed(shape):
            strides.append(step)
            step *= max(s, 1)
        strides = tuple(reversed(strides))
    else:
        strides = tuple(s // a.itemsize for s in a.strides)
    return strides if dim is None else strides[_check_dim(dim, len(shape))]


# ------------------------------------------------------------------ broadcast and its adjoint
class SumTo(Op):
    """Reduce a broadcast gradient back to `shape` (sum over the broadcast axes)."""

    name = "SumTo"

    @staticmethod
    def forward(ctx, x, shape, dtype=None):
        ctx.in_shape, ctx.in_dtype = x.shape, (x.dtype if dtype is not None else None)
        return sum_to_array(x, shape, dtype)

    @staticmethod
    def backward(ctx, g):
        if ctx.in_dtype is not None:
            g = cast(g, dtypes.from_numpy_dtype(ctx.in_dtype))
        return broadcast_to(g, ctx.in_shape)


_SUM_DTYPES = (np.float32, np.float64)


def as_shape(a, shape):
    """`a` itself when it already has `shape`, else a view of that shape. A parameter's gradient
    goes through here: a reshaped view does not own its memory, and the leaf would copy it instead
    of adopting it (engine.autograd.graph._sole_owner)."""
    return a if a.shape == tuple(shape) else a.reshape(shape)


def sum_to_array(x, shape, dtype=None):
    """x summed down to `shape`, in x's dtype or in `dtype` (float32 for a half-precision x: the
    bias gradient of a float32 master weight, accumulated and returned in float32)."""
    shape = tuple(shape)
    if dtype is not None and np.dtype(dtype) == x.dtype:
        dtype = None
    if x.shape == shape:
        return x if dtype is None else x.astype(dtype)
    n = shape[-1] if shape else 0
    summable = (x.dtype in _SUM_DTYPES or dtype is not None
                or (x.dtype == np.float16 and not isinstance(x, np.ndarray)))  # GPU: cuBLAS
    if (x.ndim >= 2 and shape and x.shape[-1] == n and all(s == 1 for s in shape[:-1]) and summable
            and x.flags.c_contiguous and x.size):
        # every axis but the last summed away (a bias gradient): one column sum
        from ._kernels import column_sum

        return as_shape(column_sum(x.reshape(-1, n), dtype), shape)
    lead = x.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(i + lead for i, s in enumerate(shape) if s == 1 and x.shape[i + lead] != 1)
    xp = xp_of(x)
    if not axes and dtype is not None:
        x = x.astype(dtype)
    out = x.sum(axis=axes, keepdims=True, dtype=x.dtype if dtype is None else dtype) if axes else x
    if lead:
        out = out.reshape(out.shape[lead:])
    if out.shape != shape:
        return out.reshape(shape)
    # (not ascontiguousarray: it returns a 0-d array as 1-d, and a 0-d gradient must stay 0-d)
    return out if out.flags.c_contiguous else xp.ascontiguousarray(out)


def sum_to(t, shape, dtype=None):
    """Gradient reduction for broadcasting: a no-op when shapes already match. `dtype` (a numpy
    float32 for a half-precision t): the sum accumulated and returned in that dtype."""
    shape = tuple(shape)
    if dtype is not None and np.dtype(dtype) != t._data.dtype:
        return SumTo.apply(t, shape=shape, dtype=np.dtype(dtype))
    if tuple(t.shape) == shape:
        return t
    return SumTo.apply(t, shape=shape)


class BroadcastTo(Op):
    name = "Expand"

    @staticmethod
    def forward(ctx, x, shape):
        ctx.in_shape = x.shape
        return xp_of(x).broadcast_to(x, shape)

    @staticmethod
    def backward(ctx, g):
        return sum_to(g, ctx.in_shape)


def broadcast_shapes(*shapes):
    """Broadcast shapes with PyTorch's error message on mismatch."""
    ndim = max(len(s) for s in shapes)
    out = [1] * ndim
    for s in shapes:
        for i, d in enumerate(s):
            j = ndim - len(s) + i
            if out[j] == 1:
                out[j] = d
            elif d != 1 and d != out[j]:
                raise RuntimeError(
                    f"The size of tensor a ({out[j]}) must match the size of tensor b ({d}) at "
                    f"non-singleton dimension {i}: shapes {', '.join(shape_str(x) for x in shapes)} "
                    "cannot be broadcast together"
                )
    return tuple(out)


def broadcast_to(t, shape):
    shape = tuple(shape)
    if tuple(t.shape) == shape:
        return t
    broadcast_shapes(tuple(t.shape), shape)
    return BroadcastTo.apply(t, shape=shape)


def along_index(index, dim):
    """A full advanced-index tuple that picks `index` along `dim` and every position along the
    other dims (index has the indexed array's shape except along dim): gather/scatter along a dim."""
    xp = xp_of(index)
    nd = index.ndim
    out = []
    for d in range(nd):
        if d == dim:
            out.append(index)
        else:
            shp = [1] * nd
            shp[d] = index.shape[d]
            out.append(xp.arange(index.shape[d]).reshape(shp))
    return tuple(out)


# ------------------------------------------------------------------ reshape
class Reshape(Op):
    name = "View"

    @staticmethod
    def forward(ctx, x, shape):
        ctx.in_shape = x.shape
        return parallel.reshape(x, shape)  # a view, or a copy on the engine's threads

    @staticmethod
    def backward(ctx, g):
        return reshape(g, ctx.in_shape)


def infer_shape(shape, numel, op="view"):
    shape = list(shape)
    neg = [i for i, s in enumerate(shape) if s == -1]
    if len(neg) > 1:
        raise RuntimeError(f"{op}: only one dimension can be inferred, got shape {shape}")
    known = 1
    for s in shape:
        if s != -1:
            if s < 0:
                raise RuntimeError(f"{op}: invalid shape dimension {s} in {shape}")
            known *= s
    if neg:
        if known == 0 or numel % known:
            raise RuntimeError(f"{op}: shape {shape} is invalid for input of size {numel}")
        shape[neg[0]] = numel // known
    elif known != numel:
        raise RuntimeError(f"{op}: shape {shape} is invalid for input of size {numel}")
    return tuple(shape)


def _shape_args(shape):
    if len(shape) == 1 and isinstance(shape[0], (tuple, list, Size_)):
        return tuple(shape[0])
    return tuple(shape)


from ..tensor import Size as Size_  # noqa: E402


def reshape(t, *shape):
    shape = infer_shape(_shape_args(shape), t.numel(), "reshape")
    if shape == tuple(t.shape):
        return t
    return Reshape.apply(t, shape=shape)


# ------------------------------------------------------------------ scalars and promotion
def is_scalar(x):
    return isinstance(x, (numbers.Number, np.generic)) and not isinstance(x, Tensor)


def scalar_tensor(value, dtype, like):
    """A constant 0-d tensor on `like`'s device, used for Python scalars in binary ops."""
    xp = xp_of(like._data)
    # on a GPU a fill kernel rather than a host copy: nothing is queued from host memory (a CUDA
    # graph capture holds it)
    value = xp.asarray(value, dtype=dtype.np) if xp is np else xp.full((), value, dtype=dtype.np)
    t = Tensor._make(value, like._device)
    if like._global is not None:  # a constant beside a global tensor is broadcast on its placement
        t._global = like._global.constant(t._data.shape)
    return t


def promote_operands(a, b):
    """Turn (Tensor|scalar, Tensor|scalar) into two Tensors of PyTorch's result dtype."""
    a_t, b_t = isinstance(a, Tensor), isinstance(b, Tensor)
    if a_t and b_t:
        da, db = a._data.dtype, b._data.dtype
        if da == db:
            return a, b
        ta, tb = dtypes.from_numpy_dtype(da), dtypes.from_numpy_dtype(db)
        a0, b0 = a._data.ndim == 0, b._data.ndim == 0
        if a0 == b0:
            res = dtypes.result_type([ta, tb])
        elif a0:
            res = dtypes.result_type([tb], [ta])
        else:
            res = dtypes.result_type([ta], [tb])
        return cast(a, res), cast(b, res)
    if a_t:
        if not is_scalar(b):
            raise foreign_tensor_error(b, "a Tensor op") or TypeError(
                f"unsupported operand type {type(b).__name__} for a Tensor op")
        res = dtypes.result_type([a.dtype], scalars=[b])
        return cast(a, res), scalar_tensor(b, res, a)
    if b_t:
        if not is_scalar(a):
            raise foreign_tensor_error(a, "a Tensor op") or TypeError(
                f"unsupported operand type {type(a).__name__} for a Tensor op")
        res = dtypes.result_type([b.dtype], scalars=[a])
        return scalar_tensor(a, res, b), cast(b, res)
    raise TypeError("at least one operand must be a Tensor")


def check_float(t, op, what="input"):
    if not t.is_floating_point():
        raise RuntimeError(f"{op}: expected a floating point {what}, got {t.dtype.name} of shape {shape_str(t.shape)}")


class NoDoubleBackward:
    """Mixin for fused grad ops whose own derivative is not implemented."""

    @staticmethod
    def backward(ctx, *grads):
        raise RuntimeError(f"double backward (create_graph=True) through {ctx.op_name} is not supported")


def binary_op(op_cls, a, b, **attrs):
    """The common path of a broadcasting binary op: PyTorch's type promotion of the operands
    (Tensors or scalars), a clear error for shapes that do not broadcast, then the op."""
    a, b = promote_operands(a, b)
    ga, gb = a._global, b._global
    if (a._data.shape != b._data.shape if ga is None else gb is None or ga.shape != gb.shape):
        broadcast_shapes(a.shape, b.shape)  # clear error before numpy's (global: on the logical shapes)
    return op_cls.apply(a, b, **attrs)


def require_tensor(value, op, arg="input", position=1):
    """torch's argument check for functions without a Scalar overload (`torch.eq(2, t)`)."""
    if not isinstance(value, Tensor):
        raise TypeError(f"{op}(): argument '{arg}' (position {position}) must be Tensor, not {type(value).__name__}")


def reflected(fn):
    """`other <op> tensor` for a Python scalar `other` (e.g. `2 ** t`, `1 | t`); other operand
    types are left to Python (NotImplemented)."""

    def method(self, other):
        if not is_scalar(other):
            return NotImplemented
        return fn(other, self)

    return method


def float_dtype_for(t):
    """The floating dtype an int/bool input is computed in (PyTorch: the default dtype)."""
    return t.dtype if t.is_floating_point() else dtypes.get_default_dtype()


# ------------------------------------------------------------------ global tensors in wrappers
def replicated(t):
    """`t` itself when local or already broadcast on every mesh axis; otherwise the global
    tensor boxed to all-broadcast (a recorded conversion), so that its `_data` is the whole
    logical value. For wrappers that compute from values (sort indices, argmax positions)."""
    g = t._global
    if g is None or all(s.is_broadcast for s in g.sbp):
        return t
    return t.to_global(sbp=g.constant(g.shape).sbp)  # every mesh axis broadcast


def constant_like(array, like):
    """A constant tensor computed whole on every rank (an index vector, a mask) on `like`'s device;
    beside a global `like` it is broadcast on like's placement."""
    t = Tensor._make(array, like._device)
    if like._global is not None:
        t._global = like._global.constant(array.shape)
    return t


def const_like(array, like, shape=None):
    """A constant tensor on `like`'s device. Beside a global `like` it is a global tensor with
    `like`'s placement and SBP and logical `shape` (default: the array's own, right when `like`
    is all-broadcast); the array must be this rank's shard of it, e.g. computed from the
    all-broadcast `like`, or elementwise from `like`'s shard."""
    t = Tensor._make(array, like._device)
    g = like._global
    if g is not None:
        t._global = g.with_shape(array.shape if shape is None else shape)
    return t
