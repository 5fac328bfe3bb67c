"""Arithmetic with broadcasting and PyTorch type promotion: + - * / // % ** (pow), neg,
reciprocal, square, lerp, and their in-place forms. Each backward reduces its gradient to the
input's shape with `sum_to`."""
import numpy as np

from ..backend import dtypes, xp_of
from ..backend.parallel import MIN_PARALLEL_ELEMENTS, parallel_ufunc
from ..kernels import add as add_kernel
from ..tensor import Tensor, tensor_method
from . import inplace
from ._core import (binary_op, broadcast_shapes, cast, float_dtype_for, is_scalar, promote_operands, reflected,
                    require_tensor, sum_to)
from ._kernels import LOW_PRECISION, ignore_fp_errors, rsqrt_array
from .comparison import eq, ge, where
from .creation import zeros_like
from .logical import logical_and
from .op import Op
from .unary import log

__all__ = ["add", "sub", "subtract", "mul", "multiply", "div", "divide", "true_divide",
           "floor_divide", "remainder", "fmod", "neg", "negative", "reciprocal", "square", "pow", "lerp",
           "atan2", "arctan2", "addcmul", "addcdiv"]


def _ufunc(ufunc, a, b):
    """CPU: split large broadcasts over threads; CuPy: the plain ufunc, or for an add of two
    arrays of one shape and dtype the engine's 16-byte kernel (engine/kernels/add.py)."""
    if isinstance(a, np.ndarray):
        if a.size >= MIN_PARALLEL_ELEMENTS or b.size >= MIN_PARALLEL_ELEMENTS:
            return parallel_ufunc(ufunc, a, b)
    elif ufunc is np.add and not isinstance(a, np.generic) and a.dtype == b.dtype and add_kernel.supported(a, b):
        return add_kernel.add_cuda(a, b)
    return ufunc(a, b)


class _AddSub(Op):
    """a + alpha * b (Add) or a - alpha * b (Sub, `sign` -1): the gradients are g and sign * alpha * g."""

    ufunc = None
    sign = 1

    @classmethod
    def forward(cls, ctx, a, b, alpha=1):
        ctx.shapes = (a.shape, b.shape)
        ctx.alpha = alpha
        return _ufunc(cls.ufunc, a, b) if alpha == 1 else cls.ufunc(a, b * b.dtype.type(alpha))

    @classmethod
    def backward(cls, ctx, g):
        sa, sb = ctx.shapes
        gb = None
        if ctx.needs_input_grad[1]:
            if ctx.alpha == 1:
                gb = sum_to(g if cls.sign == 1 else -g, sb)
            else:
                gb = sum_to(g * (ctx.alpha if cls.sign == 1 else -ctx.alpha), sb)
        return sum_to(g, sa) if ctx.needs_input_grad[0] else None, gb


class Add(_AddSub):
    name = "Add"
    ufunc = np.add


class AddHalfToFloat(Op):
    """float32 a + float16 b of one shape on CUDA, into float32: what `a + b` computes after
    promoting b (an exact conversion), in one kernel that reads b as it is (engine/kernels/add.py)
    instead of a cast kernel writing its float32 copy first. The residual adds of a model under
    float16 autocast (the float32 stream plus a float16 branch). The gradients are those of the
    cast and the add: g, and g cast to float16."""

    name = "Add"

    @staticmethod
    def forward(ctx, a, b):
        if add_kernel.supported(a, b):
            return add_kernel.add_cuda(a, b)
        return a + b.astype(np.float32)

    @staticmethod
    def backward(ctx, g):
        gb = cast(g, dtypes.float16) if ctx.needs_input_grad[1] else None
        return (g if ctx.needs_input_grad[0] else None), gb


def _half_onto_float(a, b):
    """(float32 operand, float16 operand) when `a + b` is a same-shape float32 + float16 add of
    CUDA tensors (either order: IEEE addition commutes), else None."""
    if not (isinstance(a, Tensor) and isinstance(b, Tensor)) or a._device.type != "cuda" \
            or b._device.type != "cuda" or (a._global is None) != (b._global is None):
        return None
    da, db = a._data.dtype, b._data.dtype
    if da == np.float16 and db == np.float32:
        a, b, da, db = b, a, db, da
    if da != np.float32 or db != np.float16 or tuple(a.shape) != tuple(b.shape):
        return None
    return a, b


class Sub(_AddSub):
    name = "Sub"
    ufunc = np.subtract
    sign = -1


class Mul(Op):
    name = "Mul"
    save_inputs = (0, 1)

    @staticmethod
    def forward(ctx, a, b):
        return _ufunc(np.multiply, a, b)

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved_tensors
        ga = sum_to(g * b, a.shape) if ctx.needs_input_grad[0] else None
        gb = sum_to(g * a, b.shape) if ctx.needs_input_grad[1] else None
        return ga, gb


class Div(Op):
    name = "Div"
    save_inputs = (0, 1)

    @staticmethod
    def forward(ctx, a, b):
        return _ufunc(np.true_divide, a, b)

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved_tensors
        ga = sum_to(g / b, a.shape) if ctx.needs_input_grad[0] else None
        gb = sum_to(-g * a / (b * b), b.shape) if ctx.needs_input_grad[1] else None
        return ga, gb


class Neg(Op):
    name = "Neg"

    @staticmethod
    def forward(ctx, a):
        return -a

    @staticmethod
    def backward(ctx, g):
        return -g


def check_integer_divisor(a, b):
    """torch's RuntimeError for an integer division (floor, trunc, remainder, fmod) by zero, which
    numpy answers with 0 and a warning. On the CPU only: the check would read a GPU's array back
    (torch's CUDA kernels do not check either)."""
    b = b._data if isinstance(b, Tensor) else b
    a = a._data if isinstance(a, Tensor) else a
    xp = xp_of(b) if hasattr(b, "dtype") else np
    if xp is not np:
        return
    kinds = (np.asarray(a).dtype.kind, np.asarray(b).dtype.kind)
    if kinds[0] in "iub" and kinds[1] in "iub" and np.any(np.asarray(b) == 0):
        raise RuntimeError("ZeroDivisionError: integer division or modulo by zero")


class FloorDivide(Op):
    """Piecewise constant: differentiable with zero gradients, as torch (the output requires grad)."""

    name = "FloorDivide"

    @staticmethod
    def forward(ctx, a, b):
        ctx.shapes = (a.shape, b.shape)
        check_integer_divisor(a, b)
        return xp_of(a).floor_divide(a, b)

    @staticmethod
    def backward(ctx, g):
        return tuple(sum_to(zeros_like(g), shape) if need else None
                     for shape, need in zip(ctx.shapes, ctx.needs_input_grad))


def _modulo_backward(ctx, g, quotient):
    """a mod b = a - quotient(a, b) * b with a piecewise-constant quotient: d/da = 1,
    d/db = -quotient(a, b)."""
    a, b = ctx.saved_tensors
    ga = sum_to(g, a.shape) if ctx.needs_input_grad[0] else None
    gb = sum_to(-g * quotient(a, b), b.shape) if ctx.needs_input_grad[1] else None
    return ga, gb


class Remainder(Op):
    """Python-style modulo (sign of the divisor), as torch.remainder."""

    name = "Remainder"
    save_inputs = (0, 1)

    @staticmethod
    def forward(ctx, a, b):
        check_integer_divisor(a, b)
        return xp_of(a).remainder(a, b)

    @staticmethod
    def backward(ctx, g):
        return _modulo_backward(ctx, g, floor_divide)


class Fmod(Op):
    """C-style modulo (sign of the dividend), as torch.fmod."""

    name = "Fmod"
    save_inputs = (0, 1)

    @staticmethod
    def forward(ctx, a, b):
        check_integer_divisor(a, b)
        return xp_of(a).fmod(a, b)

    @staticmethod
    def backward(ctx, g):
        return _modulo_backward(ctx, g, lambda a, b: (a / b).trunc())


def add(input, other, *, alpha=1):
    if alpha == 1:
        pair = _half_onto_float(input, other)
        if pair is not None:
            return AddHalfToFloat.apply(*pair)
    return binary_op(Add, input, other, alpha=alpha)


def sub(input, other, *, alpha=1):
    return binary_op(Sub, input, other, alpha=alpha)


def mul(input, other):
    return binary_op(Mul, input, other)


def _to_float_operands(a, b):
    a, b = promote_operands(a, b)
    if not a.is_floating_point():
        f = dtypes.get_default_dtype()
        a, b = cast(a, f), cast(b, f)
    return a, b


def div(input, other, *, rounding_mode=None):
    if rounding_mode is None:
        a, b = _to_float_operands(input, other)
        return binary_op(Div, a, b)
    if rounding_mode == "floor":
        return floor_divide(input, other)
    if rounding_mode == "trunc":
        a, b = promote_operands(input, other)
        check_integer_divisor(a, b)
        q = binary_op(Div, *_to_float_operands(a, b)).trunc()
        return cast(q, a.dtype)
    raise ValueError(f"div: rounding_mode must be None, 'floor' or 'trunc', got {rounding_mode!r}")


def floor_divide(input, other):
    return binary_op(FloorDivide, input, other)


def remainder(input, other):
    return binary_op(Remainder, input, other)


def fmod(input, other):
    require_tensor(input, "fmod")
    return binary_op(Fmod, input, other)


def neg(input):
    if input.dtype is dtypes.bool_:
        raise RuntimeError("Negation, the `-` operator, on a bool tensor is not supported; use `~` or logical_not()")
    return Neg.apply(input)


def reciprocal(input):
    return div(1.0, input if input.is_floating_point() else cast(input, float_dtype_for(input)))


def square(input):
    if isinstance(input, Tensor) and input.dtype is dtypes.bool_:
        input = cast(input, dtypes.int64)  # torch squares booleans as int64
    return mul(input, input)


subtract, multiply, divide, true_divide, negative = sub, mul, div, div, neg


# ------------------------------------------------------------------ pow
class PowScalar(Op):
    """x ** e for a Python-number exponent; common exponents avoid np.power (~40x slower)."""

    name = "Pow"
    save_inputs = (0,)

    @staticmethod
    def forward(ctx, x, exponent):
        ctx.exponent = e = exponent
        xp = xp_of(x)
        with ignore_fp_errors(xp):
            if e == 2:
                return x * x
            if e == 3:
                return x * x * x
            if e == 1:
                return x.copy()
            if e == 0:
                return xp.ones_like(x)
            if e == 0.5:
                return xp.sqrt(x)
            if e == -1:
                return xp.reciprocal(x)
            if e == -0.5:
                return rsqrt_array(xp, x)
            return xp.power(x, x.dtype.type(e))  # a scalar operand: nothing copied to a GPU

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        e = ctx.exponent
        if e == 0:
            return zeros_like(g)
        if e == 1:
            return g
        if e == 2:
            return g * (x * 2.0)
        return g * (pow(x, e - 1) * e)


class Pow(Op):
    name = "Pow"
    save_inputs = (0, 1)
    save_outputs = (0,)

    @staticmethod
    def forward(ctx, a, b):
        xp = xp_of(a)
        if b.dtype.kind == "i":
            return _int_power(xp, a, b)
        with ignore_fp_errors(xp):
            return xp.power(a, b)

    @staticmethod
    def backward(ctx, g):
        a, b, y = ctx.saved_tensors
        ga = gb = None
        if ctx.needs_input_grad[0]:
            ga = sum_to(where(eq(b, 0), 0.0, g * b * pow(a, b - 1)), a.shape)  # torch: 0 where b == 0
        if ctx.needs_input_grad[1]:
            # PyTorch's convention: no gradient flows to the exponent where the base is 0 and b >= 0
            d = where(logical_and(eq(a, 0), ge(b, 0)), 0.0, y * log(a))
            gb = sum_to(g * d, b.shape)
        return ga, gb


def _int_power(xp, a, b):
    """Signed integers to integer tensor powers as torch's `powi`: a negative exponent gives 1 for a
    base of 1, +-1 for -1 (by the exponent's parity) and 0 otherwise (numpy raises instead)."""
    neg = b < 0
    out = xp.power(a, xp.where(neg, 0, b).astype(b.dtype, copy=False))
    ones = xp.where(b % 2 == 0, 1, -1)
    at_neg = xp.where(a == 1, 1, xp.where(a == -1, ones, 0))
    return xp.where(neg, at_neg, out).astype(out.dtype, copy=False)


def pow(input, exponent):
    if isinstance(input, Tensor) and is_scalar(exponent):
        res = dtypes.result_type([input.dtype], scalars=[exponent])
        if res._category == 1 and exponent < 0:
            raise RuntimeError("Integers to negative integer powers are not allowed.")
        return PowScalar.apply(cast(input, res), exponent=exponent)
    a, b = promote_operands(input, exponent)
    if a._global is not None or a._data.shape != b._data.shape:
        broadcast_shapes(a.shape, b.shape)
    return Pow.apply(a, b)


def lerp(input, end, weight):
    """input + weight * (end - input)."""
    return input + weight * (end - input)


# ------------------------------------------------------------------ atan2, addcmul, addcdiv
class Atan2(Op):
    """atan2(a, b), the angle of the point (b, a); d/da = b / (a^2 + b^2), d/db = -a / (a^2 + b^2),
    both 0 at the origin."""

    name = "Atan2"
    save_inputs = (0, 1)

    @staticmethod
    def forward(ctx, a, b):
        xp = xp_of(a)
        with ignore_fp_errors(xp):
            return xp.arctan2(a, b)

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved_tensors
        denom = a * a + b * b
        at_origin = eq(denom, 0)  # torch: no gradient where a^2 + b^2 is 0 (underflow included)
        scale = where(at_origin, 0.0, g / where(at_origin, 1.0, denom))
        ga = sum_to(scale * b, a.shape) if ctx.needs_input_grad[0] else None
        gb = sum_to(-scale * a, b.shape) if ctx.needs_input_grad[1] else None
        return ga, gb


def atan2(input, other):
    require_tensor(input, "atan2")
    require_tensor(other, "atan2", "other", 2)
    return binary_op(Atan2, *_to_float_operands(input, other))


arctan2 = atan2


class _Addc(Op):
    """input + value * (tensor1 <op> tensor2) in one pass, the operands already cast to the result
    dtype (broadcast). The backward is torch's formula, whose factors are formed in each tensor's
    own dtype (`own`): a 16-bit tensor1 beside a float64 result gives tensor2 the gradient
    g * (tensor1 * value) with that product rounded to 16 bits, as torch does."""

    save_inputs = (1, 2)

    @classmethod
    def forward(cls, ctx, x, a, b, value, own):
        ctx.shape, ctx.value, ctx.own = x.shape, value, own
        xp = xp_of(x)
        dt = x.dtype
        if dt in LOW_PRECISION:  # computed in float32 and rounded once, as torch's opmath
            x, a, b = (t.astype(np.float32) for t in (x, a, b))
        with ignore_fp_errors(xp):
            t = cls.combine(a, b)
            out = x + (t if value == 1 else t * t.dtype.type(value))
        return out.astype(dt, copy=False)

    @classmethod
    def backward(cls, ctx, g):
        a, b = ctx.saved_tensors
        need_x, need_a, need_b = ctx.needs_input_grad
        own_a, own_b = (cast(t, d) for t, d in zip((a, b), ctx.own))
        ga, gb = cls.factors(own_a, own_b, ctx.value)
        return (sum_to(g, ctx.shape) if need_x else None,
                sum_to(g * cast(ga, g.dtype), a.shape) if need_a else None,
                sum_to(g * cast(gb, g.dtype), b.shape) if need_b else None)


def _rounded(fn, t):
    """fn(t) (t with a Python scalar) in t's dtype; a 16-bit t computed in float32 and rounded once,
    as torch's kernels do (the engine's own op rounds the scalar to 16 bits first)."""
    if t.dtype not in (dtypes.float16, dtypes.bfloat16):
        return fn(t)
    return cast(fn(cast(t, dtypes.float32)), t.dtype)


class Addcmul(_Addc):
    name = "Addcmul"
    combine = staticmethod(lambda a, b: a * b)

    @staticmethod
    def factors(a, b, value):
        """d/da = value * b, d/db = value * a, each product in the factor's own dtype."""
        return _rounded(lambda t: t * value, b), _rounded(lambda t: t * value, a)


class Addcdiv(_Addc):
    name = "Addcdiv"
    combine = staticmethod(lambda a, b: a / b)

    @staticmethod
    def factors(a, b, value):
        """d/da = value / b, d/db = -(value * a) / (b * b), the pieces in the tensors' own dtypes
        (torch's `value / b` rounds value to b's dtype first, its `value * a` does not)."""
        v = float(np.asarray(value).astype(b.dtype.np)) if b.dtype in (dtypes.float16, dtypes.bfloat16) else value
        return _rounded(lambda t: v / t, b), -_rounded(lambda t: t * value, a) / (b * b)


def _addc(op_cls, input, tensor1, tensor2, value):
    name = op_cls.name.lower()
    for i, t in enumerate((input, tensor1, tensor2)):
        require_tensor(t, name, ("input", "tensor1", "tensor2")[i], i + 1)
    if not is_scalar(value):
        raise TypeError(f"{name}(): argument 'value' must be a Number, not {type(value).__name__}")
    ts = (input, tensor1, tensor2)
    res = dtypes.result_type([t.dtype for t in ts if t.ndim], [t.dtype for t in ts if not t.ndim])
    if res is dtypes.bool_:
        raise RuntimeError(f"{name}: not implemented for 'Bool' tensors")
    x, a, b = (cast(t, res) for t in ts)
    broadcast_shapes(x.shape, a.shape, b.shape)
    value = value if res.is_floating_point else int(value)  # an integer result truncates it, as torch's cast
    return op_cls.apply(x, a, b, value=value, own=(tensor1.dtype, tensor2.dtype))


def addcmul(input, tensor1, tensor2, *, value=1):
    """input + value * tensor1 * tensor2, broadcast, in the operands' common dtype."""
    return _addc(Addcmul, input, tensor1, tensor2, value)


def addcdiv(input, tensor1, tensor2, *, value=1):
    """input + value * tensor1 / tensor2; integer tensor1 and tensor2 are refused, as by torch."""
    if not (tensor1.is_floating_point() or tensor2.is_floating_point()):
        raise RuntimeError(
            "Integer division with addcdiv is no longer supported, and in a future release addcdiv will perform a "
            "true division of tensor1 and tensor2. The historic addcdiv behavior can be implemented as "
            "(input + value * torch.trunc(tensor1 / tensor2)).to(input.dtype) for integer inputs and as "
            "(input + value * tensor1 / tensor2) for float inputs. The future addcdiv behavior is just the latter "
            "implementation: (input + value * tensor1 / tensor2), for all dtypes.")
    return _addc(Addcdiv, input, tensor1, tensor2, value)


# ------------------------------------------------------------------ Tensor methods
tensor_method("add", "__add__")(add)
tensor_method("__radd__")(reflected(add))
tensor_method("sub", "subtract", "__sub__")(sub)
tensor_method("__rsub__")(reflected(sub))
tensor_method("mul", "multiply", "__mul__")(mul)
tensor_method("__rmul__")(reflected(mul))
tensor_method("div", "divide", "true_divide", "__truediv__")(div)
tensor_method("__rtruediv__")(reflected(div))
tensor_method("floor_divide", "__floordiv__")(floor_divide)
tensor_method("__rfloordiv__")(reflected(floor_divide))
tensor_method("remainder", "__mod__")(remainder)
tensor_method("__rmod__")(reflected(remainder))
tensor_method("fmod")(fmod)
tensor_method("neg", "negative", "__neg__")(neg)
tensor_method("reciprocal")(reciprocal)
tensor_method("square")(square)
tensor_method("pow", "__pow__")(pow)
tensor_method("__rpow__")(reflected(pow))
tensor_method("lerp")(lerp)
tensor_method("atan2", "arctan2")(atan2)
tensor_method("addcmul")(addcmul)
tensor_method("addcdiv")(addcdiv)
Tensor.__pos__ = lambda self: self


# ------------------------------------------------------------------ in-place forms
def _inplace(name, fn, ufunc):
    def method(self, other, **kw):
        if ufunc in (np.floor_divide, np.remainder) or kw.get("rounding_mode") == "trunc":
            check_integer_divisor(self, other)
        if kw:
            return inplace.inplace_binary(self, other, lambda a, b: fn(a, b, **kw), None, name)
        return inplace.inplace_binary(self, other, fn, ufunc, name)

    method.__name__ = name
    return method


for _name, _dunder, _fn, _uf in (
    ("add_", "__iadd__", add, np.add), ("sub_", "__isub__", sub, np.subtract),
    ("mul_", "__imul__", mul, np.multiply), ("div_", "__itruediv__", div, np.true_divide),
    ("floor_divide_", "__ifloordiv__", floor_divide, np.floor_divide),
    ("remainder_", "__imod__", remainder, np.remainder),
):
    setattr(Tensor, _name, _inplace(_name, _fn, _uf))
    setattr(Tensor, _dunder, getattr(Tensor, _name))
Tensor.subtract_ = Tensor.sub_
Tensor.multiply_ = Tensor.mul_
Tensor.divide_ = Tensor.div_


@tensor_method()
def pow_(self, exponent):
    return inplace.apply_inplace(self, pow, "pow_", exponent)


Tensor.__ipow__ = pow_


@tensor_method()
def neg_(self):
    return self.mul_(-1)


for _name, _fn in (("atan2_", atan2), ("arctan2_", atan2), ("addcmul_", addcmul), ("addcdiv_", addcdiv),
                   ("lerp_", lerp)):
    setattr(Tensor, _name, inplace.inplace_method(_name, _fn))
