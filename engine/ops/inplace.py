"""In-place ops (`add_`, `mul_`, `copy_`, ...) share one rule.

* Nothing recorded (no grad mode, or no input requires grad): the result is written into the
  tensor's own storage (`out=` ufuncs where possible), so views made by slicing see it, and
  optimizer updates allocate nothing.
* Recorded: the op runs out of place and the tensor is rebound to the result and its grad_fn.
  Arrays saved by earlier ops are never overwritten, so gradients stay correct. When the tensor
  is a view (of a local tensor), its base is rebound too, to the base with the view's elements
  replaced (an out-of-place index_put, PyTorch's CopySlices), and the view becomes that view of
  the new base: `a[0].mul_(5)` changes `a`, as in PyTorch. Every other live view of the base
  is then taken again from its new value, so views held elsewhere see the write too (a view of
  a global tensor is rebound alone: docs/engine.md).
Either way the version counter is bumped, so a backward that needs the old value raises.
"""
import numpy as np

from ..autograd.function import Context
from ..autograd.grad_mode import _state
from ..backend import dtypes, xp_of
from ..tensor import Tensor


def check_inplace_allowed(t, op):
    if _state.enabled and t.grad_fn is None and t._requires_grad:
        raise RuntimeError(
            f"a leaf Variable that requires grad is being used in an in-place operation ({op}); "
            "wrap it in `with engine.no_grad():` or use the out-of-place op"
        )


def records(t, *others):
    """True when an in-place op on `t` must be recorded in the autograd graph."""
    if not _state.enabled:
        return False
    if t._requires_grad:
        return True
    return any(isinstance(o, Tensor) and o._requires_grad for o in others)


def rebind(t, result, op):
    """Recorded path: make `t` the out-of-place `result` (dtype kept, graph attached)."""
    if result._data.dtype != t._data.dtype:
        from ._core import cast

        check_cast(result.dtype, t.dtype, op)
        result = cast(result, t.dtype)
    if tuple(result.shape) != tuple(t.shape):
        raise RuntimeError(
            f"{op}: output with shape {list(t.shape)} doesn't match the broadcast shape {list(result.shape)}"
        )
    original = result
    through_view = t._view_of is not None and t._global is None
    if through_view:
        result = _write_through_view(t, result, op)
        if result is None:  # not a view the engine can write through: t alone is rebound
            through_view, result = False, original
    t._data = result._data
    t._view_of = result._view_of
    t.grad_fn = result.grad_fn
    t._output_nr = result._output_nr
    t._requires_grad = result._requires_grad
    t._global = result._global
    # the old storage is untouched (nodes that saved it keep the old value), so t starts a new
    # version history instead of invalidating everything that saved it (a view: its new base's)
    t._vc = result._vc if through_view else [t._vc[0] + 1]
    if not through_view and t._view_of is None:
        _take_views_again(t, None)  # its views show the new values, as PyTorch's do
    return t


def _view_chain(t):
    """(the tensor `t` is a view of, at the end of its chain of views; the (op class, attrs,
    output index) of each view from that base down to `t`)."""
    chain = []
    while t._view_of is not None:
        base, cls, attrs, k = t._view_of
        chain.append((cls, attrs, k))
        t = base
    return t, chain[::-1]


def view_positions(t, xp=np):
    """(t's root base, t's chain of views, the flat positions in the root of t's elements: the
    chain taken of an arange of the root's shape, an `xp` int64 array of t's shape)."""
    base, chain = _view_chain(t)
    return base, chain, _take_view(xp.arange(base._data.size, dtype=np.int64).reshape(base._data.shape), chain, True)


def _take_view(x, chain, on_arrays):
    """The view `chain` describes, taken of `x`: a Tensor through the ops (recorded), or, with
    `on_arrays`, of an array through their kernels."""
    for cls, attrs, k in chain:
        out = cls.forward(Context(), x, **attrs) if on_arrays else cls.apply(x, **attrs)
        x = out if k is None else out[k]
    return x


def _write_through_view(t, result, op):
    """Rebind the base of view `t` to itself with t's elements replaced by `result`, and return
    the view of the new base that `t` becomes (the values of `result`, its graph through it)."""
    from ._core import reshape
    from .creation import tensor

    if any(s == 0 and n > 1 for s, n in zip(t._data.strides, t._data.shape)):
        raise RuntimeError(f"{op}: unsupported operation: more than one element of the written-to tensor refers to a "
                           "single memory location (an expanded view); clone() the tensor first")
    base, chain = _view_chain(t)
    if base._global is not None:
        return None
    if _state.enabled and base.grad_fn is None and base._requires_grad:
        raise RuntimeError(f"a view of a leaf Variable that requires grad is being used in an in-place operation "
                           f"({op}); wrap it in `with engine.no_grad():` or clone the leaf first")
    xp = xp_of(base._data)
    _, _, where = view_positions(t, xp)
    if where.dtype != np.int64 or tuple(where.shape) != tuple(t.shape):  # an op that only aliased its input
        return None
    positions = tensor(xp.ascontiguousarray(where).reshape(-1), device=base.device)
    shape = tuple(base.shape)
    new_base = reshape(reshape(base, (-1,)).index_put((positions,), reshape(result, (-1,))), shape)
    base._data, base.grad_fn, base._output_nr = new_base._data, new_base.grad_fn, new_base._output_nr
    base._requires_grad = new_base._requires_grad
    base._vc = [base._vc[0] + 1]
    _take_views_again(base, t)
    return _take_view(base, chain, False)


def _take_views_again(base, skip):
    """Rebind every live view of `base` (but `skip`, the one just written) to the same view of
    base's new value, through recorded ops: views held elsewhere (`v = buf.view(...)`, a row
    taken before the write) see the write, and a later write through them starts from it."""
    views = base.__dict__.get("_views")
    if not views:
        return
    for view in list(views):
        if view is skip or view._view_of is None:
            continue
        fresh = _take_view(base, _view_chain(view)[1], False)
        view._data, view.grad_fn, view._output_nr = fresh._data, fresh.grad_fn, fresh._output_nr
        view._requires_grad, view._vc, view._view_of = fresh._requires_grad, fresh._vc, fresh._view_of


def write(t, array, op):
    """Unrecorded path: copy `array` into t's storage (broadcasting, casting like PyTorch)."""
    if array.dtype != t._data.dtype:
        check_cast(dtypes.from_numpy_dtype(array.dtype), t.dtype, op)
    if array.shape != t._data.shape:
        xp = xp_of(t._data)
        try:
            array = xp.broadcast_to(array, t._data.shape)
        except ValueError:
            raise RuntimeError(
                f"{op}: output with shape {list(t.shape)} doesn't match the broadcast shape {list(array.shape)}"
            ) from None
    _copy_into(t._data, array)
    t._bump_version()
    if _state.tracer is not None:  # nn.Graph is capturing this step
        _state.tracer.call(_copy_into, (t._data, array), None, f"{op} (in place)")
    return t


def _copy_into(dst, src):
    xp_of(dst).copyto(dst, src, casting="unsafe")


def check_cast(src, dst, op):
    if src._category > dst._category:
        raise RuntimeError(f"{op}: result type {src.name} can't be cast to the desired output type {dst.name}")


def inplace_binary(t, other, out_of_place, ufunc, op):
    """`t op= other` with the fast `out=` path when nothing is recorded."""
    check_inplace_allowed(t, op)
    if ufunc is np.true_divide and not t.is_floating_point():
        # true division of integers is a float (torch refuses the in-place form as well)
        raise RuntimeError(f"{op}: result type Float can't be cast to the desired output type {t.dtype.name}")
    if records(t, other):
        return rebind(t, out_of_place(t, other), op)
    o = other._data if isinstance(other, Tensor) else other
    if isinstance(other, Tensor):
        check_cast(other.dtype if t.is_floating_point() or not other.is_floating_point() else other.dtype, t.dtype, op)
    elif isinstance(other, float) and not t.is_floating_point():
        raise RuntimeError(f"{op}: result type Float can't be cast to the desired output type {t.dtype.name}")
    if ufunc is None or t._data.dtype == dtypes.bfloat16.np:
        return write(t, out_of_place(t, other)._data, op)
    try:
        ufunc(t._data, o, out=t._data, casting="unsafe")
        if _state.tracer is not None:  # nn.Graph is capturing this step
            _state.tracer.call(_UfuncInPlace(ufunc), (t._data, o), None, f"{op} (in place)")
    except ValueError:
        raise RuntimeError(
            f"{op}: output with shape {list(t.shape)} doesn't match the broadcast shape "
            f"{list(getattr(o, 'shape', ()))}"
        ) from None
    t._bump_version()
    return t


class _UfuncInPlace:
    """`ufunc(a, b, out=a)` as a replayable call."""

    def __init__(self, ufunc):
        self.ufunc = ufunc

    def __call__(self, a, b):
        self.ufunc(a, b, out=a, casting="unsafe")


def apply_inplace(t, fn, op, *args, **kwargs):
    """Store `fn(t, *args, **kwargs)` into `t` under the in-place rule (any out-of-place op)."""
    check_inplace_allowed(t, op)
    if records(t, *args, *kwargs.values()):
        return rebind(t, fn(t, *args, **kwargs), op)
    res = fn(t, *args, **kwargs)
    g = t._global
    if g is not None and res._global is not None and tuple(res._global.sbp) != tuple(g.sbp):
        res = res.to_global(sbp=g.sbp)  # t's shard is what gets written: the result in t's layout
    return write(t, res._data, op)


def inplace_method(name, fn):
    """A Tensor method `name` (e.g. "erfinv_") storing `fn(t, *args, **kwargs)` into t under the
    in-place rule; it belongs to fn's module (engine/tensor.pyi lists it there)."""

    def method(self, *args, **kwargs):
        return apply_inplace(self, fn, name, *args, **kwargs)

    method.__name__ = method.__qualname__ = name
    method.__module__ = fn.__module__
    return method
