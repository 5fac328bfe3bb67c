"""Comparisons and selection by comparison: eq/ne/lt/le/gt/ge (and the operators == != < <= >
>=), equal, isclose, allclose, maximum/minimum and where.

Comparisons have no gradient. maximum/minimum give a tie's gradient half to each input; where
routes the gradient by its condition. Operands broadcast with PyTorch's type promotion.
"""
import numpy as np

from ..backend import dtypes, xp_of
from ..tensor import Tensor, tensor_method
from ._core import (binary_op, broadcast_shapes, is_scalar, promote_operands, require_tensor, scalar_tensor,
                    sum_to)
from .op import Op
from .indexing import nonzero

__all__ = ["eq", "ne", "lt", "le", "gt", "ge", "equal", "allclose", "isclose", "maximum", "minimum", "where",
           "isin"]


class _Compare(Op):
    differentiable = False
    ufunc = None

    @classmethod
    def forward(cls, ctx, a, b):
        return getattr(xp_of(a), cls.ufunc)(a, b)


def _compare_op(name, ufunc):
    op = type(name, (_Compare,), {"name": name, "ufunc": ufunc})

    def fn(input, other):
        require_tensor(input, fn.__name__)
        return binary_op(op, input, other)

    return fn


eq = _compare_op("Eq", "equal")
ne = _compare_op("Ne", "not_equal")
lt = _compare_op("Lt", "less")
le = _compare_op("Le", "less_equal")
gt = _compare_op("Gt", "greater")
ge = _compare_op("Ge", "greater_equal")
for _fn, _n in ((eq, "eq"), (ne, "ne"), (lt, "lt"), (le, "le"), (gt, "gt"), (ge, "ge")):
    _fn.__name__ = _n


def equal(input, other):
    """True when both tensors have the same shape and elements."""
    if tuple(input.shape) != tuple(other.shape):
        return False
    a, b = promote_operands(input, other)
    return bool(xp_of(a._data).array_equal(a._data, b._data))


class IsClose(Op):
    name = "IsClose"
    differentiable = False

    @staticmethod
    def forward(ctx, a, b, rtol, atol, equal_nan):
        return xp_of(a).isclose(a, b, rtol=rtol, atol=atol, equal_nan=equal_nan)


def isclose(input, other, rtol=1e-05, atol=1e-08, equal_nan=False):
    require_tensor(input, "isclose")
    require_tensor(other, "isclose", "other", 2)
    if rtol < 0:
        raise RuntimeError(f"isclose: rtol must be greater than or equal to zero, but got {rtol}")
    if atol < 0:
        raise RuntimeError(f"isclose: atol must be greater than or equal to zero, but got {atol}")
    return binary_op(IsClose, input, other, rtol=rtol, atol=atol, equal_nan=equal_nan)


def allclose(input, other, rtol=1e-05, atol=1e-08, equal_nan=False):
    r = isclose(input, other, rtol, atol, equal_nan)
    return bool(xp_of(r._data).all(r._data))


# ------------------------------------------------------------------ maximum / minimum / where
class Where(Op):
    name = "Where"
    save_inputs = (0,)

    @staticmethod
    def forward(ctx, cond, x, y):
        ctx.shapes = (x.shape, y.shape)
        return xp_of(x).where(cond, x, y)

    @staticmethod
    def backward(ctx, g):
        (cond,) = ctx.saved_tensors
        sx, sy = ctx.shapes
        gx = sum_to(where(cond, g, 0.0), sx) if ctx.needs_input_grad[1] else None
        gy = sum_to(where(cond, 0.0, g), sy) if ctx.needs_input_grad[2] else None
        return None, gx, gy


def where(condition, input=None, other=None):
    if input is None and other is None:
        # where(cond): the indices of the nonzero entries, as nonzero(as_tuple=True)
        if condition._global is not None:
            return nonzero(condition, as_tuple=True)
        return tuple(Tensor._make(i.astype(np.int64), condition._device)
                     for i in xp_of(condition._data).nonzero(condition._data))
    if condition.dtype is not dtypes.bool_:
        raise RuntimeError(f"where expected condition to be a boolean tensor, but got a tensor with dtype {condition.dtype.name}")
    if not isinstance(input, Tensor) and not isinstance(other, Tensor):
        res = dtypes.result_type([], scalars=[input, other])
        return where(condition, scalar_tensor(input, res, condition), other)
    x, y = promote_operands(input, other)
    broadcast_shapes(condition.shape, x.shape, y.shape)
    return Where.apply(condition, x, y)


def _extremum_backward(ctx, g, loses):
    """torch's rule: ties split the gradient, the losing side gets none, and where a NaN makes
    both comparisons false each side gets all of it."""
    a, b = ctx.saved_tensors
    shared = where(eq(a, b), g * 0.5, g)
    ga = sum_to(where(loses(a, b), 0.0, shared), a.shape) if ctx.needs_input_grad[0] else None
    gb = sum_to(where(loses(b, a), 0.0, shared), b.shape) if ctx.needs_input_grad[1] else None
    return ga, gb


class Maximum(Op):
    name = "Maximum"
    save_inputs = (0, 1)

    @staticmethod
    def forward(ctx, a, b):
        return xp_of(a).maximum(a, b)

    @staticmethod
    def backward(ctx, g):
        return _extremum_backward(ctx, g, lt)


class Minimum(Op):
    name = "Minimum"
    save_inputs = (0, 1)

    @staticmethod
    def forward(ctx, a, b):
        return xp_of(a).minimum(a, b)

    @staticmethod
    def backward(ctx, g):
        return _extremum_backward(ctx, g, gt)


def maximum(input, other):
    require_tensor(input, "maximum")
    require_tensor(other, "maximum", "other", 2)
    return binary_op(Maximum, input, other)


def minimum(input, other):
    require_tensor(input, "minimum")
    require_tensor(other, "minimum", "other", 2)
    return binary_op(Minimum, input, other)


# ------------------------------------------------------------------ isin
class IsIn(Op):
    """Whether each element of `elements` equals some element of `test` (any shape); `invert`
    negates. Values compare after promotion to a common dtype; NaN matches nothing."""

    name = "IsIn"
    differentiable = False

    @staticmethod
    def forward(ctx, elements, test, invert):
        return xp_of(elements).isin(elements, test, invert=invert)


def isin(elements, test_elements, *, assume_unique=False, invert=False):
    if not isinstance(elements, Tensor) and not isinstance(test_elements, Tensor):
        raise TypeError(f"isin() received an invalid combination of arguments - got "
                        f"({type(elements).__name__}, {type(test_elements).__name__}): one of them must be a Tensor")
    a, b = promote_operands(elements, test_elements)  # a Python scalar becomes a 0-dim tensor
    return IsIn.apply(a, b, invert=bool(invert))


# ------------------------------------------------------------------ Tensor methods
def _dunder(fn):
    """Tensor comparison operators: unsupported operand types defer to Python (t == None is False)."""

    def method(self, other):
        if not isinstance(other, Tensor) and not is_scalar(other):
            return NotImplemented
        return fn(self, other)

    return method


for _fn, _names in ((eq, ("eq", "__eq__")), (ne, ("ne", "__ne__")), (lt, ("lt", "__lt__")),
                    (le, ("le", "__le__")), (gt, ("gt", "__gt__")), (ge, ("ge", "__ge__"))):
    setattr(Tensor, _names[0], _fn)
    setattr(Tensor, _names[1], _dunder(_fn))
Tensor.greater, Tensor.greater_equal, Tensor.less, Tensor.less_equal = gt, ge, lt, le
Tensor.not_equal = ne
Tensor.__hash__ = lambda self: id(self)  # elementwise __eq__ makes tensors unhashable by value
for _name in ("equal", "allclose", "isclose", "maximum", "minimum"):
    setattr(Tensor, _name, globals()[_name])
tensor_method("where")(lambda self, condition, other: where(condition, self, other))
