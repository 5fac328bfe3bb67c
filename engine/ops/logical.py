"""Logical and bitwise ops: logical_and/or/xor/not, bitwise_and/or/xor/not and the shifts (and
the operators & | ^ ~ << >>). No gradients; logical ops take any dtype and return bool, bitwise ops take integer and
bool tensors."""

from ..backend import dtypes, xp_of
from ..tensor import Tensor
from ._core import binary_op, broadcast_shapes, is_scalar, promote_operands, reflected, require_tensor, scalar_tensor
from .inplace import inplace_method
from .op import Op

__all__ = ["logical_and", "logical_or", "logical_not", "logical_xor", "bitwise_and", "bitwise_or",
           "bitwise_not", "bitwise_xor", "bitwise_left_shift", "bitwise_right_shift"]


class _Logical(Op):
    differentiable = False
    ufunc = None

    @classmethod
    def forward(cls, ctx, *arrays):
        return getattr(xp_of(arrays[0]), cls.ufunc)(*arrays)


def _logical_op(name, ufunc):
    op = type(name, (_Logical,), {"name": name, "ufunc": ufunc})

    def fn(input, other):
        require_tensor(input, ufunc)
        require_tensor(other, ufunc, "other", 2)
        b = other._data if isinstance(other, Tensor) else other
        if isinstance(other, Tensor) and (input._global is not None or input._data.shape != b.shape):
            broadcast_shapes(input.shape, other.shape)
        return op.apply(input, other) if isinstance(other, Tensor) else op.apply(input, _const(other, input))

    fn.__name__ = ufunc
    return fn


def _const(value, like):
    return scalar_tensor(value, dtypes.from_numpy_dtype(xp_of(like._data).asarray(value).dtype), like)


logical_and = _logical_op("LogicalAnd", "logical_and")
logical_or = _logical_op("LogicalOr", "logical_or")
logical_xor = _logical_op("LogicalXor", "logical_xor")
LogicalNot = type("LogicalNot", (_Logical,), {"name": "LogicalNot", "ufunc": "logical_not"})


def logical_not(input):
    return LogicalNot.apply(input)


def _check_integral(op, *ts):
    for t in ts:
        if t.is_floating_point():
            raise RuntimeError(f"{op}: only integer and bool tensors are supported, got {t.dtype.name}")


def _bitwise_op(name, ufunc):
    op = type(name, (_Logical,), {"name": name, "ufunc": ufunc})

    def fn(input, other):
        if not isinstance(input, Tensor) and not isinstance(other, Tensor):
            raise TypeError(f"{ufunc}: at least one operand must be a Tensor")
        if is_scalar(input) and isinstance(input, float) or is_scalar(other) and isinstance(other, float):
            raise RuntimeError(f"{ufunc}: only integer and bool operands are supported, got a float scalar")
        a, b = promote_operands(input, other)
        _check_integral(ufunc, a, b)
        return binary_op(op, a, b)

    fn.__name__ = ufunc
    return fn


bitwise_and = _bitwise_op("BitwiseAnd", "bitwise_and")
bitwise_or = _bitwise_op("BitwiseOr", "bitwise_or")
bitwise_xor = _bitwise_op("BitwiseXor", "bitwise_xor")
# shifts by the bit width or more give 0 (or -1 for negative values shifted right), as torch's
bitwise_left_shift = _bitwise_op("BitwiseLeftShift", "left_shift")
bitwise_right_shift = _bitwise_op("BitwiseRightShift", "right_shift")
bitwise_left_shift.__name__, bitwise_right_shift.__name__ = "bitwise_left_shift", "bitwise_right_shift"
BitwiseNot = type("BitwiseNot", (_Logical,), {"name": "BitwiseNot", "ufunc": "invert"})


def bitwise_not(input):
    _check_integral("bitwise_not", input)
    return BitwiseNot.apply(input)


# ------------------------------------------------------------------ Tensor methods
for _name in ("logical_and", "logical_or", "logical_xor", "logical_not", "bitwise_not"):
    setattr(Tensor, _name, globals()[_name])
for _fn, _names in ((bitwise_and, ("bitwise_and", "__and__")), (bitwise_or, ("bitwise_or", "__or__")),
                    (bitwise_xor, ("bitwise_xor", "__xor__")), (bitwise_left_shift, ("bitwise_left_shift", "__lshift__")),
                    (bitwise_right_shift, ("bitwise_right_shift", "__rshift__"))):
    setattr(Tensor, _names[0], _fn)
    setattr(Tensor, _names[1], _fn)
    setattr(Tensor, "__r" + _names[1][2:], reflected(_fn))
    setattr(Tensor, _names[0] + "_", inplace_method(_names[0] + "_", _fn))
    setattr(Tensor, "__i" + _names[1][2:], getattr(Tensor, _names[0] + "_"))
Tensor.__invert__ = bitwise_not
