"""Indexing, gather/scatter and in-place fills.

* `x[key]` follows numpy's rules, which are PyTorch's for ints, slices, None, Ellipsis, integer
  and bool arrays and their mixtures. Basic keys (ints/slices/None/Ellipsis) return a numpy view;
  the backward is one fused op that writes (basic key) or scatter-adds (advanced key, where
  duplicate indices must accumulate) the gradient into zeros of the input's shape.
* `x[key] = v`, `scatter_`, `masked_fill_`, `fill_`, `zero_`, `copy_` follow engine/ops/inplace.py:
  unrecorded writes go into the storage, recorded ones run out of place and rebind.
* `embedding` is on the hot path of a language model, so its backward is a dedicated kernel
  (`add_rows`: sort the ids, then add in rounds with unique indices): ~6x faster than `np.add.at`
  for vocab 50257 x 768 and 8x256 ids, and it adds repeated ids' rows in the same order add.at does.
  index_select's backward and `x[idx]`'s backward use the same kernel.
"""
import numbers
import operator

import numpy as np

from .op import Op
from ..autograd.grad_mode import _state as _grad_state
from ..backend import dtypes, host_checks, to_device, xp_of
from ..tensor import Tensor, _check_dim, tensor_method
from . import inplace
from ._kernels import blocked, can_fill_where, fill_where, rows_of, select_bits
from ..kernels import scatter_add as scatter_kernels
from ._core import (along_index, broadcast_shapes, const_like, broadcast_to, cast, constant_like, replicated, reshape,
                    scalar_tensor, shape_str, sum_to)

__all__ = ["gather", "scatter", "scatter_add", "scatter_reduce", "index_select", "index_add", "index_put",
           "masked_fill", "masked_select", "masked_scatter", "take_along_dim", "one_hot", "embedding", "nonzero",
           "index_fill", "select"]


# ------------------------------------------------------------------ key normalisation
def _key_item(k, xp, dev):
    """One element of a user key as something numpy/cupy indexing accepts."""
    if isinstance(k, Tensor):
        a = k._data if k._global is None else k._host()  # a global key: its whole logical value
        a = to_device(a, dev) if k._device != dev else a
        if a.dtype.kind not in "biu":
            raise IndexError(
                f"tensors used as indices must be long, int, byte or bool tensors, got {k.dtype.name}")
        return a
    if isinstance(k, slice):
        if k.step is not None and int(k.step) <= 0:
            raise ValueError("step must be greater than zero")
        return k
    if k is None or k is Ellipsis or isinstance(k, (bool, np.bool_)):
        return k
    if isinstance(k, numbers.Integral):
        return int(k)
    if isinstance(k, (list, tuple, np.ndarray)) or hasattr(k, "__cuda_array_interface__"):
        a = np.asarray(k) if not hasattr(k, "__cuda_array_interface__") else k
        if a.dtype.kind not in "biu":
            if a.size == 0:
                a = a.astype(np.int64)
            else:
                raise IndexError(f"indices must be integers or bools, got an array of {a.dtype}")
        return a  # host data stays on the host until its bounds are checked (_normalize_key)
    raise IndexError(f"unsupported index type {type(k).__name__}")


def _normalize_key(key, x):
    """The key as a tuple of ints/slices/None/Ellipsis/backend arrays, and whether it is basic
    (IndexError for indices out of bounds, with PyTorch's message)."""
    xp = xp_of(x._data)
    if not isinstance(key, tuple):
        key = (key,)
    items = tuple(_key_item(k, xp, x._device) for k in key)
    # bounds checked on what is on the host (ints, lists, numpy arrays); index tensors on a GPU
    # only in the debug mode (a read back: backend.host_checks), as CuPy would not raise
    _check_bounds(items, x.shape)
    if xp is not np:
        items = tuple(xp.asarray(k) if isinstance(k, np.ndarray) else k for k in items)
    basic = all(k is None or k is Ellipsis or isinstance(k, (int, slice)) for k in items)
    if basic and Ellipsis not in items:
        items = items + (Ellipsis,)  # all-int keys then give a 0-d view, not a numpy scalar
    if not basic:
        items = tuple(a.astype(np.int64) if hasattr(a, "dtype") and a.dtype.kind == "u" and a.dtype != np.uint8
                      else a for a in items)
    return items, basic


def _check_bounds(items, shape):
    """PyTorch's message for out-of-range integer indices (numpy's names an 'axis')."""
    dim = 0
    n_ell = len(shape) - sum(k.ndim if hasattr(k, "dtype") and k.dtype == np.bool_ else 1
                             for k in items if k is not None and k is not Ellipsis)  # a mask takes its ndim
    for k in items:
        if k is None:
            continue
        if k is Ellipsis:
            dim += max(n_ell, 0)
            continue
        is_mask = hasattr(k, "dtype") and k.dtype == np.bool_
        if dim + (k.ndim if is_mask else 1) > len(shape):  # a 0-dim mask takes no dimension
            raise IndexError(f"too many indices for tensor of dimension {len(shape)}")
        if is_mask:
            if tuple(k.shape) != tuple(shape[dim:dim + k.ndim]):
                raise IndexError(
                    f"The shape of the mask {list(k.shape)} at index {dim} does not match the shape "
                    f"of the indexed tensor {list(shape)}")
            dim += k.ndim
            continue
        size = shape[dim]
        if isinstance(k, int):
            if not -size <= k < size:
                raise IndexError(f"index {k} is out of bounds for dimension {dim} with size {size}")
        elif hasattr(k, "dtype") and k.size and host_checks(k):  # on a GPU only in the debug mode (a read)
            lo, hi = int(k.min()), int(k.max())
            bad = hi if hi >= size else lo
            if hi >= size or lo < -size:
                raise IndexError(f"index {bad} is out of bounds for dimension {dim} with size {size}")
        dim += 1


# ------------------------------------------------------------------ x[key]
class Index(Op):
    name = "Index"

    @staticmethod
    def forward(ctx, x, key, basic):
        ctx.shape, ctx.dtype, ctx.key, ctx.basic = x.shape, x.dtype, key, basic
        out = x[key]
        return out if basic else xp_of(x).asarray(out)

    @staticmethod
    def backward(ctx, g):
        res = IndexBackward.apply(g, shape=ctx.shape, key=ctx.key, basic=ctx.basic)
        if ctx.basic and res.grad_fn is None:
            res._zero_outside = ctx.key  # lets the autograd engine add it region-only
        return res


class IndexBackward(Op):
    """Zeros of the input shape with the gradient written (basic) or scatter-added (advanced)."""

    name = "IndexBackward"

    @staticmethod
    def forward(ctx, g, shape, key, basic):
        ctx.key, ctx.basic = key, basic
        xp = xp_of(g)
        out = xp.zeros(shape, dtype=g.dtype)
        if basic:
            out[key] = g
        elif _is_row_key(key) and len(shape) > 0:  # x[idx] with a 1-D integer idx: add rows
            idx = key[0]
            add_rows(out.reshape(shape[0], -1), idx, g.reshape(idx.shape[0], -1))
        else:
            scatter_kernels.add_at(out, key, g)
        return out

    @staticmethod
    def backward(ctx, gg):
        return Index.apply(gg, key=ctx.key, basic=ctx.basic)


def _is_row_key(key):
    k0 = key[0]
    return (hasattr(k0, "dtype") and k0.dtype.kind in "iu" and k0.ndim == 1
            and all(k is Ellipsis or (isinstance(k, slice) and k == slice(None)) for k in key[1:]))


def _getitem(self, key):
    items, basic = _normalize_key(key, self)
    return Index.apply(self, key=items, basic=basic)


Tensor.__getitem__ = _getitem


def select(input, dim, index):
    """input[:, ..., index] along `dim`: a view without that dim (torch's errors)."""
    if input.ndim == 0:
        raise IndexError("select() cannot be applied to a 0-dim tensor.")
    dim = _check_dim(dim, input.ndim)
    index, size = operator.index(index), input.shape[dim]
    if not -size <= index < size:
        raise IndexError(f"select(): index {index} out of range for tensor of size {list(input.shape)} "
                         f"at dimension {dim}")
    return _getitem(input, (slice(None),) * dim + (index,))


# ------------------------------------------------------------------ x[key] = v
class IndexPut(Op):
    """Out-of-place `x[key] = v` (the recorded path of __setitem__)."""

    name = "IndexPut"

    @staticmethod
    def forward(ctx, x, v, key, basic):
        ctx.key, ctx.basic, ctx.v_shape = key, basic, v.shape
        out = x.copy()
        scatter_kernels.store_at(out, key, v)
        return out

    @staticmethod
    def backward(ctx, g):
        gx = IndexZero.apply(g, key=ctx.key) if ctx.needs_input_grad[0] else None
        gv = None
        if ctx.needs_input_grad[1]:
            gv = _reduce_to(Index.apply(g, key=ctx.key, basic=ctx.basic), ctx.v_shape)
        return gx, gv


class IndexZero(Op):
    """`g` with `g[key] = 0`: the gradient of the overwritten input of index_put."""

    name = "IndexZero"

    @staticmethod
    def forward(ctx, g, key):
        ctx.key = key
        out = g.copy()
        out[key] = 0
        return out

    @staticmethod
    def backward(ctx, gg):
        return IndexZero.apply(gg, key=ctx.key)


def _reduce_to(g, shape):
    """Sum a gradient of a broadcast value back to `shape` (which may have extra leading 1s)."""
    shape = tuple(shape)
    if len(shape) > g.ndim:
        g = reshape(g, (1,) * (len(shape) - g.ndim) + tuple(g.shape))
    core = shape[len(shape) - g.ndim:] if len(shape) >= g.ndim else shape
    extra = len(shape) - len(core)
    g = sum_to(g, core)
    return reshape(g, shape) if extra or tuple(g.shape) != shape else g


def _as_value_tensor(value, like):
    if isinstance(value, Tensor):
        if value._device != like._device:
            value = value.to(like._device)
        return cast(value, like.dtype)
    xp = xp_of(like._data)
    arr = xp.asarray(value, dtype=like._data.dtype) if not isinstance(value, np.ndarray) \
        else xp.asarray(value.astype(like._data.dtype, copy=False))
    return Tensor._make(arr, like._device)


def _setitem(self, key, value):
    items, basic = _normalize_key(key, self)
    _put(self, items, basic, _as_value_tensor(value, self), False, "index_put_")


def _indexed_shape(x, items, basic):
    """The logical shape of x[items] (a global x's too)."""
    return tuple(Index.apply(x.detach(), key=items, basic=basic).shape)


def _shape_mismatch(v, x, items, basic):
    return RuntimeError(f"shape mismatch: value tensor of shape {shape_str(v.shape)} cannot be broadcast to "
                        f"indexing result of shape {shape_str(_indexed_shape(x, items, basic))}")


def _put(self, items, basic, v, accumulate, op):
    """`self[items] = v` (`+=` with `accumulate`, repeated indices adding up) under the in-place
    rule: written into the storage, or recorded out of place and rebound."""
    inplace.check_inplace_allowed(self, op)
    if inplace.records(self, v):
        return inplace.rebind(self, _index_put(self, items, basic, v, accumulate), op)
    write = scatter_kernels.add_at if accumulate else scatter_kernels.store_at
    try:
        write(self._data, items, v._data)
        if _grad_state.tracer is not None:  # nn.Graph is capturing this step
            _grad_state.tracer.call(write, (self._data, items, v._data), None, f"{op} (in place)")
    except ValueError:
        raise _shape_mismatch(v, self, items, basic) from None
    self._bump_version()
    return self


def _index_put(x, items, basic, v, accumulate):
    """Out of place `x[items] = v`, or with `accumulate` x plus v scatter-added at `items`."""
    if not accumulate:
        try:
            return IndexPut.apply(x, v, key=items, basic=basic)
        except ValueError:
            raise _shape_mismatch(v, x, items, basic) from None
    try:
        v = broadcast_to(v, _indexed_shape(x, items, basic))
    except RuntimeError:
        raise _shape_mismatch(v, x, items, basic) from None
    return x + IndexBackward.apply(v, shape=tuple(x.shape), key=items, basic=basic)


def _put_args(input, indices, values, op):
    """torch's argument checks of index_put: a tuple of index tensors, values of the same dtype."""
    if not isinstance(indices, (tuple, list)):
        raise TypeError(f"{op}(): argument 'indices' must be tuple of Tensors, not {type(indices).__name__}")
    for i, k in enumerate(indices):
        if not isinstance(k, Tensor):
            raise TypeError(f"expected Tensor as element {i} in argument 0, but got {type(k).__name__}")
    if not isinstance(values, Tensor):
        raise TypeError(f"{op}(): argument 'values' (position 2) must be Tensor, not {type(values).__name__}")
    if values.dtype != input.dtype:
        raise RuntimeError(f"Index put requires the source and destination dtypes match, got {input.dtype.name} "
                           f"for the destination and {values.dtype.name} for the source.")
    return _normalize_key(tuple(indices), input)


def index_put(input, indices, values, accumulate=False):
    """`input` with `input[indices] = values` (a new tensor); `accumulate=True` adds instead,
    repeated indices adding up."""
    items, basic = _put_args(input, indices, values, "index_put")
    return _index_put(input, items, basic, _as_value_tensor(values, input), accumulate)


@tensor_method()
def index_put_(self, indices, values, accumulate=False):
    items, basic = _put_args(self, indices, values, "index_put_")
    return _put(self, items, basic, _as_value_tensor(values, self), accumulate, "index_put_")


Tensor.__setitem__ = _setitem


# ------------------------------------------------------------------ gather / scatter
def _check_index(index, op):
    if not isinstance(index, Tensor) or index._data.dtype.kind not in "iu":
        got = index.dtype.name if isinstance(index, Tensor) else type(index).__name__
        raise RuntimeError(f"{op}(): Expected dtype int32/int64 for index, got {got}")


def _check_gather_shapes(x_shape, index, dim, op, other=None):
    """`index` is the index Tensor: its logical shape is checked, and the values this rank
    holds (all of them for a local tensor, the shard for a global one) are bounds-checked."""
    if index.ndim != len(x_shape) and not (index.ndim <= 1 and len(x_shape) <= 1):
        raise RuntimeError(f"{op}(): Index tensor must have the same number of dimensions as input tensor "
                           f"(index {shape_str(index.shape)}, input {shape_str(x_shape)})")
    for d in range(index.ndim):
        if d != dim and index.shape[d] > x_shape[d]:
            raise RuntimeError(f"{op}(): Size does not match at dimension {d}: index {shape_str(index.shape)} "
                               f"is larger than input {shape_str(x_shape)}")
        if other is not None and index.shape[d] > other[d]:
            raise RuntimeError(f"{op}(): Expected index {shape_str(index.shape)} to be smaller than src "
                               f"{shape_str(other)} apart from dimension {dim}")
    vals = index._data
    if vals.size:
        hi, lo = int(vals.max()), int(vals.min())
        n = x_shape[dim] if x_shape else 1
        if hi >= n or lo < 0:  # no negative indices, as torch's gather and scatter
            raise RuntimeError(f"{op}(): index {hi if hi >= n else lo} is out of bounds for dimension "
                               f"{dim} with size {n}")


def _crop(a, shape):
    if tuple(a.shape) == tuple(shape):
        return a
    return a[tuple(slice(0, s) for s in shape)]


class Gather(Op):
    name = "Gather"

    @staticmethod
    def forward(ctx, x, index, dim):
        ctx.shape, ctx.dim = x.shape, dim
        if x.ndim == 0:
            return x.reshape(index.shape) if index.size else x[()].reshape(index.shape)
        return x[along_index(index, dim)]

    @staticmethod
    def backward(ctx, g):
        index = ctx.saved_tensors[0]
        return GatherBackward.apply(g, index, shape=ctx.shape, dim=ctx.dim), None

    save_inputs = (1,)


class GatherBackward(Op):
    """Scatter-add of the gradient along `dim` into zeros of the input shape."""

    name = "GatherBackward"
    save_inputs = (1,)

    @staticmethod
    def forward(ctx, g, index, shape, dim):
        ctx.dim = dim
        xp = xp_of(g)
        out = xp.zeros(shape, dtype=g.dtype)
        if len(shape) == 0:
            out[...] = g.sum()
            return out
        scatter_kernels.add_at(out, along_index(index, dim), g)
        return out

    @staticmethod
    def backward(ctx, gg):
        index = ctx.saved_tensors[0]
        return Gather.apply(gg, index, dim=ctx.dim), None


def gather(input, dim, index, *, sparse_grad=False):
    dim = _check_dim(dim, max(input.ndim, 1))
    if isinstance(index, Tensor) and index.numel() == 0:  # torch checks nothing else for an empty index
        return input.reshape(-1)[:0].reshape(tuple(index.shape))
    _check_index(index, "gather")
    _check_gather_shapes(tuple(input.shape), index, dim, "gather")
    return Gather.apply(input, index, dim=dim)


class Scatter(Op):
    """out = input with out[index[i,j], j] = src[i,j] (dim 0); `add` accumulates instead."""

    name = "Scatter"
    save_inputs = (1,)

    @staticmethod
    def forward(ctx, x, index, src, dim, add):
        ctx.dim, ctx.add, ctx.src_shape = dim, add, src.shape
        out = x.copy()
        mesh = along_index(index, dim)
        s = _crop(src, index.shape) if src.ndim else src
        if add:
            scatter_kernels.add_at(out, mesh, s)
        else:
            scatter_kernels.store_at(out, mesh, s)
        return out

    @staticmethod
    def backward(ctx, g):
        index = ctx.saved_tensors[0]
        gx = gs = None
        if ctx.needs_input_grad[0]:
            gx = g if ctx.add else ScatterFill.apply(g, index, dim=ctx.dim)
        if ctx.needs_input_grad[2]:
            gs = Gather.apply(g, index, dim=ctx.dim)
            if tuple(gs.shape) != tuple(ctx.src_shape):
                gs = Pad.apply(gs, shape=ctx.src_shape)
        return gx, None, gs


class ScatterFill(Op):
    """`g` with the scattered positions set to zero (gradient of scatter's overwritten input)."""

    name = "ScatterFill"
    save_inputs = (1,)

    @staticmethod
    def forward(ctx, g, index, dim):
        ctx.dim = dim
        out = g.copy()
        out[along_index(index, dim)] = 0
        return out

    @staticmethod
    def backward(ctx, gg):
        return ScatterFill.apply(gg, ctx.saved_tensors[0], dim=ctx.dim), None


class Pad(Op):
    """Zero-pad a tensor at the end of each dim up to `shape` (src larger than index)."""

    name = "Pad"

    @staticmethod
    def forward(ctx, a, shape):
        ctx.in_shape = a.shape
        out = xp_of(a).zeros(shape, dtype=a.dtype)
        out[tuple(slice(0, s) for s in a.shape)] = a
        return out

    @staticmethod
    def backward(ctx, g):
        return g[tuple(slice(0, s) for s in ctx.in_shape)]


def _scatter_args(input, dim, index, src, value, op):
    _check_index(index, op)
    dim = _check_dim(dim, max(input.ndim, 1))
    if src is None:
        if value is None:
            raise TypeError(f"{op}() needs `src` or `value`")
        src = scalar_tensor(value, input.dtype, input)
    elif not isinstance(src, Tensor):
        src = scalar_tensor(src, input.dtype, input)
    elif src.dtype != input.dtype:
        raise RuntimeError(f"{op}(): Expected self.dtype to be equal to src.dtype "
                           f"({input.dtype.name} != {src.dtype.name})")
    _check_gather_shapes(tuple(input.shape), index, dim, op, tuple(src.shape) if src.ndim else None)
    return dim, src


def scatter(input, dim, index, src=None, value=None, *, reduce=None):
    """`reduce="add"`/`"multiply"` combines with the values in place (scatter_reduce's sum/prod)."""
    if reduce is not None:
        if reduce not in ("add", "multiply"):
            raise RuntimeError("reduce argument must be either add or multiply.")
        dim, src = _scatter_args(input, dim, index, src, value, "scatter")
        if src.ndim == 0 and index.ndim:
            src = broadcast_to(src, tuple(index.shape))
        return _scatter_reduce(input, dim, index, src, "sum" if reduce == "add" else "prod", True)
    dim, src = _scatter_args(input, dim, index, src, value, "scatter")
    return Scatter.apply(input, index, src, dim=dim, add=False)


def scatter_add(input, dim, index, src):
    dim, src = _scatter_args(input, dim, index, src, None, "scatter_add")
    return Scatter.apply(input, index, src, dim=dim, add=True)


def _inplace_scatter(self, dim, index, src, value, add, op):
    inplace.check_inplace_allowed(self, op)
    dim, src = _scatter_args(self, dim, index, src, value, op)
    if inplace.records(self, src):
        return inplace.rebind(self, Scatter.apply(self, index, src, dim=dim, add=add), op)
    mesh = along_index(index._data, dim)
    s = _crop(src._data, index.shape) if src.ndim else src._data
    write = scatter_kernels.add_at if add else scatter_kernels.store_at
    write(self._data, mesh, s)
    if _grad_state.tracer is not None:  # nn.Graph is capturing this step
        _grad_state.tracer.call(write, (self._data, mesh, s), None, f"{op} (in place)")
    self._bump_version()
    return self


@tensor_method()
def scatter_(self, dim, index, src=None, value=None, *, reduce=None):
    if reduce is not None:
        return inplace.apply_inplace(self, scatter, "scatter_", dim, index, src, value, reduce=reduce)
    return _inplace_scatter(self, dim, index, src, value, False, "scatter_")


@tensor_method()
def scatter_add_(self, dim, index, src):
    return _inplace_scatter(self, dim, index, src, None, True, "scatter_add_")


# ------------------------------------------------------------------ scatter_reduce
_REDUCTIONS = ("sum", "prod", "mean", "amax", "amin")
_AT = {"sum": "add", "mean": "add", "amax": "maximum", "amin": "minimum"}


def _identity(reduce, dtype):
    """The value a reduction starts from where `include_self=False` leaves the input out."""
    if reduce in ("sum", "mean"):
        return 0
    if reduce == "prod":
        return 1
    if dtype.kind == "f" or dtype == dtypes.bfloat16.np:
        return -np.inf if reduce == "amax" else np.inf
    info = np.iinfo(dtype) if dtype != np.bool_ else None
    return (info.min if reduce == "amax" else info.max) if info is not None else reduce == "amin"


def _extreme_at(xp, reduce, out, mesh, src):
    """out[mesh] = max (amax) or min (amin) of out[mesh] and src, repeated targets included
    (numpy's maximum.at / minimum.at; NaN wins, as there).

    Not CuPy's ufunc.at for floats: CuPy 14's atomicMax/atomicMin for double compare through
    fmaxf/fminf (cupy/atomics.cuh), rounding every value they write to float32 (found on an
    H200), and it has none for float16. There each target's extreme is the last of its run once
    the values are sorted by (target, value) (NaN sorts last; amin sorts the negated values), and
    every element of a run writes that same value: no boolean compaction, which would read a
    count back to the host. The sorts themselves wait for the stream (CuPy sorts with Thrust,
    CuPy issue #9126), so this still synchronises and cannot be captured in a CUDA graph."""
    if xp is np or out.dtype.kind != "f":
        getattr(xp, _AT[reduce]).at(out, mesh, src)
        return
    lin, vals = scatter_kernels.flat_targets(xp, out, mesh, src)
    if not lin.size:
        return
    key = vals if reduce == "amax" else -vals
    order = xp.argsort(key, kind="stable")
    order = order[xp.argsort(lin[order], kind="stable")]
    lin, key = lin[order], key[order]
    extreme = key[xp.searchsorted(lin, lin, side="right") - 1]  # the last of each element's run
    flat = out.reshape(-1)  # out is a fresh contiguous copy: a view
    flat[lin] = xp.maximum(flat[lin], extreme) if reduce == "amax" else xp.minimum(flat[lin], -extreme)


def _multiply_at(xp, out, mesh, src):
    """out[mesh] *= src with repeated targets multiplying in turn (numpy's multiply.at). CuPy has
    no multiply.at: the products go in rounds, each touching a target at most once."""
    if xp is np:
        np.multiply.at(out, mesh, src)
        return
    lin, vals = scatter_kernels.flat_targets(xp, out, mesh, src)
    if not lin.size:
        return
    order = xp.argsort(lin)
    lin, vals = lin[order], vals[order]
    rank = xp.arange(lin.size) - xp.searchsorted(lin, lin, side="left")  # position within its target's run
    flat = out.reshape(-1)
    for r in range(int(rank.max()) + 1):
        sel = rank == r
        flat[lin[sel]] *= vals[sel]


class ScatterReduce(Op):
    """`x` with `src` combined into the positions `index` names along `dim` by `reduce` (sum,
    prod, mean, amax, amin), x's own values included unless not `include_self` (integer means
    round down). The backward is torch's scatter_reduce_backward: tied maxima share the gradient
    evenly, a product's factors are divided out (zeros handled exactly)."""

    name = "ScatterReduce"
    save_inputs = (0, 1, 2)
    save_outputs = (0,)

    @staticmethod
    def forward(ctx, x, index, src, dim, reduce, include_self):
        ctx.dim, ctx.reduce, ctx.include_self, ctx.src_shape = dim, reduce, include_self, src.shape
        xp = xp_of(x)
        out = x.copy()
        mesh = along_index(index, dim)
        s = _crop(src, index.shape)
        if not include_self:
            out[mesh] = _identity(reduce, x.dtype)
        if reduce == "prod":
            _multiply_at(xp, out, mesh, s)
        elif reduce in ("amax", "amin"):
            _extreme_at(xp, reduce, out, mesh, s)
        else:  # sum, mean
            scatter_kernels.add_at(out, mesh, s)
        if reduce == "mean":
            count = xp.full(x.shape, int(include_self), dtype=np.int64)
            xp.add.at(count, mesh, 1)
            ctx.count = count = xp.maximum(count, 1)
            out = (out / count if out.dtype.kind == "f" else xp.floor_divide(out, count)).astype(x.dtype)
        return out

    @staticmethod
    def backward(ctx, g):
        x, index, src, out = ctx.saved_tensors
        dim, reduce = ctx.dim, ctx.reduce
        xp = xp_of(g._data)
        s = src if tuple(src.shape) == tuple(index.shape) else src[tuple(slice(0, n) for n in index.shape)]
        mesh = along_index(index._data, dim)

        def const(a):
            return Tensor._make(a, g._device)

        zero = const(xp.zeros((), dtype=g._data.dtype))
        if reduce == "sum":
            gx = g
            gs = Gather.apply(g, index, dim=dim)
        elif reduce == "mean":
            gx = g / const(ctx.count.astype(g._data.dtype))
            gs = Gather.apply(gx, index, dim=dim)
        elif reduce in ("amax", "amin"):
            x_is, s_is = x._data == out._data, s._data == out._data[mesh]
            n = x_is.astype(g._data.dtype)
            xp.add.at(n, mesh, s_is.astype(n.dtype))
            spread = g / const(n)
            gx = MaskedFill.apply(spread, const(~x_is), zero)
            gs = MaskedFill.apply(Gather.apply(spread, index, dim=dim), const(~s_is), zero)
        else:
            gx, gs = _prod_grads(g, x, index, s, out, dim, ctx.include_self, mesh, const, zero)
        if not ctx.include_self:
            gx = ScatterFill.apply(gx, index, dim=dim)
        if tuple(gs.shape) != tuple(ctx.src_shape):
            gs = Pad.apply(gs, shape=ctx.src_shape)
        return gx, None, gs


def _prod_grads(g, x, index, s, out, dim, include_self, mesh, const, zero):
    """The gradients of a scatter product (torch's formulas): each factor's is the product of the
    others, computed with the zeros masked out so that a single zero gets its exact gradient."""
    xp = xp_of(g._data)
    one = const(xp.ones((), dtype=g._data.dtype))
    attrs = dict(dim=dim, reduce="prod", include_self=include_self)
    x_zero, s_zero = x._data == 0, s._data == 0
    masked_x = MaskedFill.apply(x, const(x_zero), one)
    gx = g * ScatterReduce.apply(masked_x, index, s, **attrs) / masked_x
    zeros_at = xp.zeros(x.shape, dtype=np.int64)
    xp.add.at(zeros_at, mesh, s_zero.astype(np.int64))
    single = s_zero & (zeros_at[mesh] == 1)  # the only zero scattered to its target
    others = ScatterReduce.apply(x, index, MaskedFill.apply(s, const(single), one), **attrs)
    at_single = Gather.apply(g * others, index, dim=dim)
    elsewhere = Gather.apply(g * out, index, dim=dim) / MaskedFill.apply(s, const(s_zero), one)
    gs = MaskedFill.apply(at_single, const(~single), zero) + MaskedFill.apply(elsewhere, const(single), zero)
    return gx, gs


def _scatter_reduce(input, dim, index, src, reduce, include_self):
    if input.ndim == 0:  # a scalar is a one-element vector here, as in torch
        flat = [t.reshape(1) if t.ndim == 0 else t for t in (input, index, src)]
        return _scatter_reduce(*flat[:1], 0, *flat[1:], reduce, include_self).reshape(())
    return ScatterReduce.apply(input, index, src, dim=dim, reduce=reduce, include_self=bool(include_self))


def scatter_reduce(input, dim, index, src, reduce, *, include_self=True):
    reduce = {"max": "amax", "min": "amin"}.get(reduce, reduce)  # torch's older names, still accepted
    if reduce not in _REDUCTIONS:
        raise RuntimeError(f"reduce argument must be either sum, prod, mean, amax or amin, got {reduce}")
    if not isinstance(src, Tensor):
        raise TypeError(f"scatter_reduce(): argument 'src' (position 3) must be Tensor, not {type(src).__name__}")
    dim, src = _scatter_args(input, dim, index, src, None, "scatter_reduce")
    return _scatter_reduce(input, dim, index, src, reduce, include_self)


@tensor_method()
def scatter_reduce_(self, dim, index, src, reduce, *, include_self=True):
    return inplace.apply_inplace(self, scatter_reduce, "scatter_reduce_", dim, index, src, reduce,
                                 include_self=include_self)


def take_along_dim(input, indices, dim=None):
    _check_index(indices, "take_along_dim")
    if dim is None:
        return gather(reshape(input, -1), 0, reshape(indices, -1))
    dim = _check_dim(dim, input.ndim)
    shape_i, shape_x = list(indices.shape), list(input.shape)
    shape_i[dim] = shape_x[dim]
    bshape = broadcast_shapes(tuple(shape_i), tuple(shape_x))
    xs, is_ = list(bshape), list(bshape)
    is_[dim] = indices.shape[dim]
    if shape_x[dim]:  # negative indices count from the end here (modulo the size), as torch's
        negative = cast(indices < 0, indices.dtype)
        indices = indices + negative * (indices % shape_x[dim] - indices)
    return gather(broadcast_to(input, tuple(xs)), dim, broadcast_to(indices, tuple(is_)).contiguous())


# ------------------------------------------------------------------ index_select / index_add
def _index_1d(index, op):
    _check_index(index, op)
    if index.ndim > 1:
        raise IndexError(f"{op}(): Index is supposed to be a vector, got shape {shape_str(index.shape)}")
    return index._data.reshape(-1)


class IndexSelect(Op):
    name = "IndexSelect"
    save_inputs = (1,)

    @staticmethod
    def forward(ctx, x, index, dim):
        ctx.shape, ctx.dim = x.shape, dim
        return xp_of(x).take(x, index.reshape(-1), axis=dim)

    @staticmethod
    def backward(ctx, g):
        index = ctx.saved_tensors[0]
        return IndexAddTo.apply(g, index, shape=ctx.shape, dim=ctx.dim), None


class IndexAddTo(Op):
    """zeros(shape) with `g` added at `index` along `dim` (duplicates accumulate)."""

    name = "IndexSelectBackward"
    save_inputs = (1,)

    @staticmethod
    def forward(ctx, g, index, shape, dim):
        ctx.dim = dim
        out = xp_of(g).zeros(shape, dtype=g.dtype)
        _add_along(out, dim, index.reshape(-1), g)
        return out

    @staticmethod
    def backward(ctx, gg):
        return IndexSelect.apply(gg, ctx.saved_tensors[0], dim=ctx.dim), None


def _add_along(out, dim, index, src):
    if not index.size:  # nothing to add (and no row length to infer from an empty src)
        return
    if dim == 0 and out.flags.c_contiguous:
        add_rows(out.reshape(out.shape[0], -1), index, src.reshape(src.shape[0], -1))
    else:
        scatter_kernels.add_at(out, (slice(None),) * dim + (index,), src)


def index_select(input, dim, index):
    idx = _index_1d(index, "index_select")
    dim = _check_dim(dim, max(input.ndim, 1))
    n = input.shape[dim] if input.ndim else 1
    if idx.size and (int(idx.max()) >= n or int(idx.min()) < 0):  # no negative indices, as torch's
        raise IndexError(f"index_select(): index out of range in self (dimension {dim} has size {n})")
    if input.ndim == 0:  # as torch: one index, and the result stays 0-dim
        if idx.size != 1:
            raise RuntimeError(f"index_select(): Index to scalar can have only 1 value, got {idx.size} value(s)")
        return input.clone()  # a new tensor, as every index_select result
    return IndexSelect.apply(input, index, dim=dim)


class IndexAdd(Op):
    name = "IndexAdd"
    save_inputs = (1,)

    @staticmethod
    def forward(ctx, x, index, src, dim, alpha):
        ctx.dim, ctx.alpha = dim, alpha
        out = x.copy()
        _add_along(out, dim, index.reshape(-1), src if alpha == 1 else src * src.dtype.type(alpha))
        return out

    @staticmethod
    def backward(ctx, g):
        gs = None
        if ctx.needs_input_grad[2]:
            gs = IndexSelect.apply(g, ctx.saved_tensors[0], dim=ctx.dim)
            if ctx.alpha != 1:
                gs = gs * ctx.alpha
        return g, None, gs


def index_add(input, dim, index, source, *, alpha=1):
    _index_1d(index, "index_add")
    dim = _check_dim(dim, max(input.ndim, 1))
    if source.dtype != input.dtype:
        raise RuntimeError(f"index_add(): self ({input.dtype.name}) and source ({source.dtype.name}) "
                           "must have the same scalar type")
    expected = tuple(input.shape[:dim]) + (index.numel(),) + tuple(input.shape[dim + 1:])
    if input.dim() and tuple(source.shape) != expected and not (source.dim() == 0 and expected == (1,)):
        raise RuntimeError(f"index_add(): source tensor shape must match self tensor shape, excluding the "
                           f"specified dimension, with index.numel() along it. Got self.shape = "
                           f"{shape_str(input.shape)} source.shape = {shape_str(source.shape)}, expected "
                           f"{shape_str(expected)}")
    idx, n = index._data, input.shape[dim] if input.dim() else 1
    if idx.size and host_checks(idx) and (int(idx.max()) >= n or int(idx.min()) < 0):
        raise IndexError(f"index_add(): index out of range in self (dimension {dim} has size {n})")
    if input.dim() == 0:  # a scalar is a one-element vector here, as in torch
        return index_add(input.reshape(1), 0, index, source.reshape(-1), alpha=alpha).reshape(())
    return IndexAdd.apply(input, index, source, dim=dim, alpha=alpha)


@tensor_method()
def index_add_(self, dim, index, source, *, alpha=1):
    return inplace.apply_inplace(self, index_add, "index_add_", dim, index, source, alpha=alpha)


# ------------------------------------------------------------------ masks
def _check_mask(mask, op):
    if not isinstance(mask, Tensor) or mask.dtype is not dtypes.bool_:
        got = mask.dtype.name if isinstance(mask, Tensor) else type(mask).__name__
        raise RuntimeError(f"{op}: expected a bool mask tensor, got {got}")


def _bit_select(x, mask, value):
    """where(mask, value, x) on the CPU: bitwise select, split over threads along axis 0."""
    shape = np.broadcast_shapes(x.shape, mask.shape)
    out = np.empty(shape, dtype=x.dtype)
    keep, fill = select_bits(mask, value, x.dtype)
    xs, keeps, fills = rows_of(x, shape), rows_of(keep, shape), rows_of(fill, shape)

    def run(sel):
        fill_where(out[sel], xs[sel], keeps[sel], fills[sel])

    blocked(run, shape)
    return out


class MaskedFill(Op):
    name = "MaskedFill"
    save_inputs = (1,)

    @staticmethod
    def forward(ctx, x, mask, value):
        ctx.x_shape = x.shape
        if can_fill_where(x, value) and x.ndim and isinstance(mask, np.ndarray):
            return _bit_select(x, mask, value)
        return xp_of(x).where(mask, value, x)

    @staticmethod
    def backward(ctx, g):
        mask = ctx.saved_tensors[0]
        zero = Tensor._make(xp_of(g._data).zeros((), dtype=g._data.dtype), g._device)
        kept = MaskedFill.apply(g, mask, zero)
        gx = sum_to(kept, ctx.x_shape) if ctx.needs_input_grad[0] else None
        gv = sum_to(g - kept, ()) if ctx.needs_input_grad[2] else None
        return gx, None, gv


def _fill_value(value, input, op):
    if isinstance(value, Tensor):
        if value.ndim != 0:
            raise RuntimeError(f"{op} only supports a 0-dimensional value tensor, but got tensor with "
                               f"{value.ndim} dimension(s).")
        return cast(value, input.dtype)
    if isinstance(value, complex):
        raise RuntimeError(f"{op}: value cannot be converted to type {input.dtype.name} without overflow: {value}")
    return scalar_tensor(value, input.dtype, input)


def masked_fill(input, mask, value):
    _check_mask(mask, "masked_fill")
    broadcast_shapes(tuple(input.shape), tuple(mask.shape))
    return MaskedFill.apply(input, mask, _fill_value(value, input, "masked_fill"))


@tensor_method()
def masked_fill_(self, mask, value):
    inplace.check_inplace_allowed(self, "masked_fill_")
    _check_mask(mask, "masked_fill_")
    v = _fill_value(value, self, "masked_fill_")
    if inplace.records(self, v):
        return inplace.rebind(self, MaskedFill.apply(self, mask, v), "masked_fill_")
    if broadcast_shapes(tuple(self.shape), tuple(mask.shape)) != tuple(self.shape):
        raise RuntimeError(f"masked_fill_: mask of shape {shape_str(mask.shape)} cannot be broadcast to "
                           f"the tensor's shape {shape_str(self.shape)}")
    xp_of(self._data).copyto(self._data, v._data, where=mask._data)
    self._bump_version()
    return self


def index_fill(input, dim, index, value):
    """`value` at positions `index` along `dim` (a masked_fill with the mask along `dim`, so a
    0-dim tensor `value` gets the gradient summed over the filled positions, as torch's)."""
    dim = _check_dim(dim, input.ndim)
    if not isinstance(index, Tensor):
        raise TypeError(f"index_fill(): index must be a Tensor, got {type(index).__name__}")
    if index.dtype is not dtypes.int64:
        raise IndexError("index_fill_(): Expected dtype int64 for index.")
    if index.ndim > 1:
        raise RuntimeError("Index has to be a vector/scalar")
    if isinstance(value, Tensor) and value.ndim != 0:
        raise RuntimeError("index_fill_ only supports a 0-dimensional value tensor, but got tensor with "
                           f"{value.ndim} dimension(s).")
    idx = replicated(index)._data.reshape(-1)
    size = input.shape[dim] if input.ndim else 1
    if idx.size and host_checks(idx):  # on a GPU only in the debug mode (a read)
        lo, hi = int(idx.min()), int(idx.max())
        if hi >= size or lo < -size:
            raise IndexError(f"index {hi if hi >= size else lo} is out of bounds for dimension {dim} with size {size}")
    mask = xp_of(input._data).zeros(size, dtype=np.bool_)
    mask[to_device(idx, input._device) if index._device != input._device else idx] = True
    shape = [1] * input.ndim
    if input.ndim:
        shape[dim] = size
    return masked_fill(input, constant_like(mask.reshape(shape), input), value)


@tensor_method()
def index_fill_(self, dim, index, value):
    return inplace.apply_inplace(self, index_fill, "index_fill_", dim, index, value)


def masked_select(input, mask):
    _check_mask(mask, "masked_select")
    shape = broadcast_shapes(tuple(input.shape), tuple(mask.shape))
    x = broadcast_to(input, shape)
    if tuple(mask.shape) == shape:
        m = mask
    elif mask._global is None:
        m = Tensor._make(xp_of(mask._data).broadcast_to(mask._data, shape), mask._device)
    else:
        m = broadcast_to(mask, shape)
    if not shape:  # a 0-dim pair selects from a one-element vector, as torch
        x, m = x.reshape(1), m.reshape(1)
    return x[m]


def masked_scatter(input, mask, source):
    """`input` with the positions where `mask` is True (input and mask broadcast together) taken
    from the consecutive elements of `source`, in row-major order: `x[mask] = source[:k]`."""
    if not isinstance(mask, Tensor) or mask.dtype is not dtypes.bool_:
        got = mask.dtype.name if isinstance(mask, Tensor) else type(mask).__name__
        raise RuntimeError(f"masked_scatter_ only supports boolean masks, but got mask with dtype {got}")
    if source.dtype != input.dtype:
        raise RuntimeError(f"masked_scatter: expected self and source to have same dtypes but got "
                           f"{input.dtype.name} and {source.dtype.name}")
    shape = broadcast_shapes(tuple(input.shape), tuple(mask.shape))
    m = replicated(mask)._data
    m = xp_of(m).broadcast_to(m, shape)
    count = int(m.sum())  # a read back, as torch's
    if count > source.numel():
        raise RuntimeError("Number of elements of source < number of ones in mask")
    return IndexPut.apply(broadcast_to(input, shape), reshape(source, -1)[:count], key=(m,), basic=False)


@tensor_method()
def masked_scatter_(self, mask, source):
    if isinstance(mask, Tensor) and broadcast_shapes(tuple(self.shape), tuple(mask.shape)) != tuple(self.shape):
        raise RuntimeError(f"masked_scatter_: mask of shape {shape_str(mask.shape)} cannot be broadcast to the "
                           f"tensor's shape {shape_str(self.shape)}")
    return inplace.apply_inplace(self, masked_scatter, "masked_scatter_", mask, source)


class Nonzero(Op):
    name = "Nonzero"
    differentiable = False

    @staticmethod
    def forward(ctx, x):
        xp = xp_of(x)
        return xp.stack(xp.nonzero(x), axis=1).astype(np.int64) if x.ndim else \
            xp.zeros((int(bool(x)), 0), dtype=np.int64)


def nonzero(input, *, as_tuple=False):
    out = Nonzero.apply(input)
    if as_tuple:
        if input.ndim == 0:
            return (const_like(xp_of(out._data).zeros(out.shape[0], dtype=np.int64), out),)
        return tuple(out[:, i] for i in range(input.ndim))
    return out


# ------------------------------------------------------------------ one_hot / embedding
class OneHot(Op):
    name = "OneHot"
    differentiable = False

    @staticmethod
    def forward(ctx, ids, num_classes):
        xp = xp_of(ids)
        out = xp.zeros((ids.size, num_classes), dtype=np.int64)
        out[xp.arange(ids.size), ids.reshape(-1)] = 1
        return out.reshape(ids.shape + (num_classes,))


def one_hot(tensor, num_classes=-1):
    if tensor.dtype is not dtypes.int64:
        raise RuntimeError(f"one_hot is only applicable to index tensor of type int64, got {tensor.dtype.name}")
    ids = tensor._data if tensor._global is None else tensor._host()  # validation needs every id
    if num_classes == -1:
        if ids.size == 0:
            raise RuntimeError("one_hot: can not infer total number of classes from empty tensor")
        num_classes = int(ids.max()) + 1
    if ids.size and (int(ids.min()) < 0):
        raise RuntimeError("one_hot: Class values must be non-negative.")
    if ids.size and int(ids.max()) >= num_classes:
        raise RuntimeError(f"one_hot: Class values must be smaller than num_classes ({num_classes}), "
                           f"got {int(ids.max())}")
    return OneHot.apply(tensor, num_classes=num_classes)


class Embedding(Op):
    name = "Embedding"
    save_inputs = (0,)

    @staticmethod
    def forward(ctx, ids, weight, padding_idx):
        ctx.num, ctx.padding_idx = weight.shape[0], padding_idx
        return xp_of(weight).take(weight, ids, axis=0)

    @staticmethod
    def backward(ctx, g):
        ids = ctx.saved_tensors[0]
        return None, EmbeddingBackward.apply(g, ids, num=ctx.num, padding_idx=ctx.padding_idx)


class EmbeddingBackward(Op):
    """Dense weight gradient: rows of `g` summed per id (repeated ids accumulate)."""

    name = "EmbeddingBackward"
    save_inputs = (1,)

    @staticmethod
    def forward(ctx, g, ids, num, padding_idx):
        ctx.padding_idx = padding_idx
        return rows_gradient(num, ids.reshape(-1), g.reshape(-1, g.shape[-1]), padding_idx)

    @staticmethod
    def backward(ctx, gg):
        ids = ctx.saved_tensors[0]
        return Embedding.apply(ids, without_row(gg, ctx.padding_idx), padding_idx=None), None


def rows_gradient(num, ids, rows, padding_idx):
    """Dense [num, dim] gradient of a row lookup: `rows` summed per id (repeats accumulate), the
    padding row left at zero."""
    out = xp_of(rows).zeros((num, rows.shape[-1]), dtype=rows.dtype)
    add_rows(out, ids, rows)
    if padding_idx is not None:
        out[padding_idx] = 0
    return out


def without_row(t, row):
    """`t` with row `row` zeroed (a copy), or `t` itself when `row` is None."""
    if row is None:
        return t
    t = t.clone()
    t[row] = 0
    return t


_MAX_ROUNDS = 32


def add_rows(out, idx, rows):
    """out[idx[i]] += rows[i] for a 1-D index with repeats, fast on numpy.

    `np.add.at` costs ~10 us per row (23 ms for 8x256 ids x 768 on the 2-core CI box). Instead,
    sort the ids (stable, so each id's rows are added in their original order, as add.at does)
    and add in rounds: round r adds the r-th row of every id that has one, with a plain fancy
    `+=` whose indices are unique within the round. Rounds = the largest repeat count, which for
    token ids is small (3.6 ms uniform, 5.5 ms Zipf-distributed text); when one id repeats more
    than _MAX_ROUNDS times, `add.reduceat` over the sorted rows is used instead.
    """
    xp = xp_of(out)
    n = idx.shape[0]
    if n == 0:
        return
    if xp is not np:  # on a GPU, no host read of the ids: wrap negatives unconditionally
        scatter_kernels.add_at(out, idx + (idx < 0) * out.shape[0], rows)
        return
    if int(idx.min()) < 0:  # -1 and N-1 are the same row: one group, not two
        idx = idx + (idx < 0) * out.shape[0]
    order = np.argsort(idx, kind="stable")
    s = idx[order]
    new = np.empty(n, dtype=bool)
    new[0] = True
    np.not_equal(s[1:], s[:-1], out=new[1:])
    starts = np.flatnonzero(new)
    if starts.size == n:  # all ids distinct
        out[idx] += rows
        return
    ro = rows[order]
    ends = np.append(starts[1:], n)
    if int((ends - starts).max()) > _MAX_ROUNDS:
        out[s[starts]] += np.add.reduceat(ro, starts, axis=0)
        return
    pos, keep = starts, ends
    while pos.size:
        out[s[pos]] += ro[pos]
        pos = pos + 1
        alive = pos < keep
        pos, keep = pos[alive], keep[alive]


# ------------------------------------------------------------------ lookups on a shard of a split axis
# A vocab-split embedding table or a class-split logits tensor holds only the rows/columns
# [start, stop) of the logical axis on a rank. These kernels look up the logical ids that fall in
# the own range (shifted by `start`) and write zeros for the others; their backward scatters only
# in-range entries. Summed over the ranks of the split axis (a partial-sum result) they give the
# plain lookup; on a local tensor (start=0, the whole axis) every id is in range.
# engine/distributed/rules/indexing.py substitutes VocabParallelEmbedding for Embedding under the
# signature ids B x table S(0) -> P; loss.py's TargetGather is the cross-entropy's twin.
def in_range(xp, ids, start, n):
    """(ids - start clamped to a safe 0 where out of range, the in-range mask)."""
    local = ids.astype(np.int64, copy=False) - start
    mask = (local >= 0) & (local < n)
    return xp.where(mask, local, 0), mask


def _local_pad(padding_idx, start, stop):
    if padding_idx is None or not start <= padding_idx < stop:
        return None
    return padding_idx - start


class VocabParallelEmbedding(Op):
    """out[i] = weight[ids[i] - start] for start <= ids[i] < stop, zeros elsewhere."""

    name = "VocabParallelEmbedding"
    save_inputs = (0,)

    @staticmethod
    def forward(ctx, ids, weight, padding_idx=None, start=0, stop=None):
        xp = xp_of(weight)
        n = weight.shape[0]
        stop = start + n if stop is None else stop
        if stop - start != n:
            raise ValueError(f"VocabParallelEmbedding: range [{start}, {stop}) does not match the shard's {n} rows")
        safe, mask = in_range(xp, ids, start, n)
        out = xp.take(weight, safe, axis=0)
        if xp is not np:  # on a GPU without reading the mask back (a boolean index would)
            out = xp.where(mask[..., None], out, xp.zeros((), dtype=out.dtype))
        elif not mask.all():
            out[~mask] = 0
        ctx.num, ctx.start = n, start
        ctx.padding_idx = _local_pad(padding_idx, start, stop)
        return out

    @staticmethod
    def backward(ctx, g):
        ids = ctx.saved_tensors[0]
        return None, VocabParallelEmbeddingBackward.apply(g, ids, num=ctx.num, start=ctx.start,
                                                          padding_idx=ctx.padding_idx)


class VocabParallelEmbeddingBackward(Op):
    """Dense gradient of the local shard: rows of g summed per in-range id (repeats accumulate);
    `padding_idx` is the local row (or None) that gets no gradient."""

    name = "VocabParallelEmbeddingBackward"
    save_inputs = (1,)

    @staticmethod
    def forward(ctx, g, ids, num, start, padding_idx):
        ctx.num, ctx.start, ctx.padding_idx = num, start, padding_idx
        xp = xp_of(g)
        safe, mask = in_range(xp, ids.reshape(-1), start, num)
        rows = g.reshape(-1, g.shape[-1])
        if xp is not np:  # out-of-range rows add zeros (to row 0) instead of a host read of the mask
            rows = xp.where(mask[:, None], rows, xp.zeros((), dtype=rows.dtype))
        elif not mask.all():
            safe, rows = safe[mask], rows[mask]
        return rows_gradient(num, safe, rows, padding_idx)

    @staticmethod
    def backward(ctx, gg):
        ids = ctx.saved_tensors[0]
        w = without_row(gg, ctx.padding_idx)
        return VocabParallelEmbedding.apply(ids, w, padding_idx=None, start=ctx.start,
                                            stop=ctx.start + ctx.num), None


def embedding(input, weight, padding_idx=None, max_norm=None, norm_type=2.0, scale_grad_by_freq=False,
              sparse=False):
    if not isinstance(input, Tensor) or input._data.dtype.kind not in "iu":
        got = input.dtype.name if isinstance(input, Tensor) else type(input).__name__
        raise RuntimeError(f"embedding: expected indices of dtype int64 or int32, got {got}")
    if weight.ndim != 2:
        raise RuntimeError(f"embedding: weight must be 2-D (num_embeddings, embedding_dim), got shape "
                           f"{shape_str(weight.shape)}")
    if max_norm is not None or scale_grad_by_freq or sparse:
        raise NotImplementedError("embedding: max_norm, scale_grad_by_freq and sparse are not supported")
    num = weight.shape[0]
    ids = input._data
    if ids.size and host_checks(ids):
        hi, lo = int(ids.max()), int(ids.min())
        if hi >= num or lo < 0:
            raise IndexError(f"embedding: index {hi if hi >= num else lo} is out of range for a table of "
                             f"size {num} (valid ids are 0..{num - 1})")
    if padding_idx is not None:
        if not -num <= padding_idx < num:
            raise ValueError(f"embedding: padding_idx {padding_idx} must be within the table size {num}")
        padding_idx = padding_idx % num
    return Embedding.apply(input, weight, padding_idx=padding_idx)


# ------------------------------------------------------------------ fills and copies
class Fill(Op):
    """Recorded `fill_`: the result no longer depends on the old values; grad goes to a tensor value."""

    name = "Fill"

    @staticmethod
    def forward(ctx, x, value):
        return xp_of(x).full(x.shape, value, dtype=x.dtype)

    @staticmethod
    def backward(ctx, g):
        gx = IndexZero.apply(g, key=Ellipsis) if ctx.needs_input_grad[0] else None
        return gx, sum_to(g, ()) if ctx.needs_input_grad[1] else None


@tensor_method()
def fill_(self, value):
    inplace.check_inplace_allowed(self, "fill_")
    v = _fill_value(value, self, "fill_")
    if inplace.records(self, v):
        return inplace.rebind(self, Fill.apply(self, v), "fill_")
    scatter_kernels.store_at(self._data, Ellipsis, v._data)
    if _grad_state.tracer is not None:  # nn.Graph is capturing this step
        _grad_state.tracer.call(scatter_kernels.store_at, (self._data, Ellipsis, v._data), None, "fill_ (in place)")
    self._bump_version()
    return self


@tensor_method()
def zero_(self):
    return self.fill_(0)


class Copy(Op):
    """Recorded `copy_`: the result is `src` broadcast and cast to the destination."""

    name = "Copy"

    @staticmethod
    def forward(ctx, x, src):
        ctx.src_shape, ctx.src_dtype = src.shape, src.dtype
        xp = xp_of(x)
        out = xp.empty_like(x)
        xp.copyto(out, xp.broadcast_to(src, x.shape), casting="unsafe")
        return out

    @staticmethod
    def backward(ctx, g):
        gx = IndexZero.apply(g, key=Ellipsis) if ctx.needs_input_grad[0] else None
        gs = None
        if ctx.needs_input_grad[1]:
            gs = cast(_reduce_to(g, ctx.src_shape), dtypes.from_numpy_dtype(ctx.src_dtype))
        return gx, gs


@tensor_method()
def copy_(self, src, non_blocking=False):
    inplace.check_inplace_allowed(self, "copy_")
    if not isinstance(src, Tensor):
        src = Tensor._make(xp_of(self._data).asarray(src), self._device)
    if src._device != self._device:
        src = src.to(self._device)
    try:
        broadcast_shapes(tuple(src.shape), tuple(self.shape))
        if len(src.shape) > len(self.shape) and any(s != 1 for s in src.shape[:len(src.shape) - len(self.shape)]):
            raise RuntimeError
    except RuntimeError:
        raise RuntimeError(f"copy_: the source of shape {shape_str(src.shape)} cannot be broadcast to the "
                           f"destination of shape {shape_str(self.shape)}") from None
    if inplace.records(self, src):
        return inplace.rebind(self, Copy.apply(self, src), "copy_")
    s = src._data
    if s.ndim > self._data.ndim:
        s = s.reshape(s.shape[s.ndim - self._data.ndim:])
    xp_of(self._data).copyto(self._data, s, casting="unsafe")
    self._bump_version()
    return self


# ------------------------------------------------------------------ Tensor methods
tensor_method("gather")(gather)
tensor_method("scatter")(scatter)
tensor_method("scatter_add")(scatter_add)
tensor_method("scatter_reduce")(scatter_reduce)
tensor_method("index_put")(index_put)
tensor_method("masked_scatter")(masked_scatter)
tensor_method("index_select")(index_select)
tensor_method("index_add")(index_add)
tensor_method("masked_fill")(masked_fill)
tensor_method("masked_select")(masked_select)
tensor_method("take_along_dim")(take_along_dim)
tensor_method("nonzero")(nonzero)
tensor_method("index_fill")(index_fill)
tensor_method("select")(select)
