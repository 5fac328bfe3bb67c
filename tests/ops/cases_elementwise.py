"""Parity cases for engine/ops/elementwise.py (arithmetic with broadcasting and promotion, pow, lerp,
atan2, addcmul/addcdiv and their in-place forms)."""
import numpy as np

from harness import Input as I, OpCase

F = I((3, 4))
CASES = []

for op in ("add", "sub", "mul", "div"):
    CASES += [
        OpCase(op, lambda m, a, b, op=op: getattr(m, op)(a, b), [F, I((3, 4), kind="positive")], name="same"),
        OpCase(op, lambda m, a, b, op=op: getattr(m, op)(a, b), [I((2, 1, 4)), I((3, 1), kind="positive")], name="bcast"),
        OpCase(op, lambda m, a, b, op=op: getattr(m, op)(a, b), [I((3, 4), noncontig=True), I((4,), kind="positive")], name="noncontig"),
        OpCase(op, lambda m, a, b, op=op: getattr(m, op)(a, b), [I((0, 4)), I((4,), kind="positive")], name="empty", gradcheck=False),
        OpCase(op, lambda m, a, op=op: getattr(m, op)(a, 2.5), [F], name="scalar"),
        OpCase(op, lambda m, a, b, op=op: getattr(m, op)(a, b), [I((3, 4), "int64", "int", 1, 5), I((4,), "float32", "positive")], name="promote"),
        OpCase(op, lambda m, a, b, op=op: getattr(m, op)(a, b), [I((3,), "int64", "int", 1, 9), I((), "int64", "int", 1, 4)], name="int"),
    ]

CASES += [
    OpCase("add", lambda m, a, b: m.add(a, b, alpha=0.5), [F, F], name="alpha"),
    OpCase("sub", lambda m, a, b: a.sub(b, alpha=2), [F, F], name="alpha"),
    OpCase("add", lambda m, a: 3 + a, [F], name="radd"),
    OpCase("sub", lambda m, a: 3 - a, [F], name="rsub"),
    OpCase("div", lambda m, a: 3 / a, [I((5,), kind="positive")], name="rdiv"),
    OpCase("mul", lambda m, a, b: a * b, [I((2, 3), "float64"), I((), "float32")], name="zerodim-promote"),
    OpCase("div", lambda m, a, b: m.div(a, b, rounding_mode="trunc"), [I((6,), "int64", "int", -9, 9), I((6,), "int64", "int", 1, 4)], name="trunc"),
    OpCase("subtract", lambda m, a, b: m.subtract(a, b), [F, F]),
    OpCase("multiply", lambda m, a, b: m.multiply(a, b), [F, F]),
    OpCase("divide", lambda m, a, b: m.divide(a, b), [F, I((3, 4), kind="positive")]),
    OpCase("true_divide", lambda m, a, b: m.true_divide(a, b), [F, I((3, 4), kind="positive")]),
    OpCase("floor_divide", lambda m, a, b: m.floor_divide(a, b), [I((6,), "int64", "int", -9, 9), I((6,), "int64", "int", 1, 4)]),
    OpCase("floor_divide", lambda m, a: a // 2.5, [I((6,), kind="uniform", low=-5, high=5)], name="float", backward=False),
    OpCase("remainder", lambda m, a, b: m.remainder(a, b), [I((3, 4), kind="uniform", low=-5, high=5), I((4,), kind="uniform", low=1, high=2)]),
    OpCase("remainder", lambda m, a: a % 3, [I((6,), "int64", "int", -9, 9)], name="int"),
    OpCase("fmod", lambda m, a, b: m.fmod(a, b), [I((3, 4), kind="uniform", low=-5, high=5), I((4,), kind="uniform", low=1, high=2)]),
    OpCase("neg", lambda m, a: m.neg(a), [F]),
    OpCase("neg", lambda m, a: -a, [I((3,), "int64", "int", -5, 5)], name="int"),
    OpCase("negative", lambda m, a: m.negative(a), [F]),
    OpCase("reciprocal", lambda m, a: m.reciprocal(a), [I((3, 4), kind="positive")]),
    OpCase("square", lambda m, a: m.square(a), [F]),
]


# ---------------------------------------------------------------- pow
NC = I((4, 3), noncontig=True)
POS = I((3, 4), kind="positive")
CASES += [
    OpCase("pow", lambda m, x: m.pow(x, 2), [F], name="sq"),
    OpCase("pow", lambda m, x: x ** 3, [NC], name="cube"),
    OpCase("pow", lambda m, x: x ** 0.5, [POS], name="sqrt"),
    OpCase("pow", lambda m, x: x ** -1, [POS], name="recip"),
    OpCase("pow", lambda m, x: x ** -0.5, [POS], name="rsqrt"),
    OpCase("pow", lambda m, x: x ** 1, [F], name="one"),
    OpCase("pow", lambda m, x: x ** 0, [F], name="zero"),
    OpCase("pow", lambda m, x: x ** 2.7, [POS], name="general"),
    OpCase("pow", lambda m, x: 2.5 ** x, [F], name="rpow"),
    OpCase("pow", lambda m, x: m.pow(x, 2), [I((5,), "int64", "int", -5, 5)], name="int"),
    OpCase("pow", lambda m, x: x ** 1.5, [I((5,), "int64", "int", 1, 5)], name="int-float-exp"),
    OpCase("pow", lambda m, x: 2 ** x, [I((5,), "int64", "int", 0, 5)], name="int-rpow"),
    OpCase("pow", lambda m, x: 2.0 ** x, [I((5,), "int64", "int", 0, 5)], name="int-rpow-float"),
    OpCase("pow", lambda m, a, b: m.pow(a, b), [POS, I((3, 4))], name="tensor"),
    OpCase("pow", lambda m, a, b: a ** b, [I((2, 1, 4), kind="positive"), I((3, 1))], name="bcast"),
    OpCase("pow", lambda m, a, b: a ** b, [I((3, 4), "float64", "positive"), I((), "float32")], name="promote"),
    OpCase("pow", lambda m, x: x.clone().pow_(2), [I((3, 4))], name="inplace"),
]

# ---------------------------------------------------------------- lerp
CASES += [
    OpCase("lerp", lambda m, a, b: m.lerp(a, b, 0.3), [F, F]),
    OpCase("lerp", lambda m, a, b, w: m.lerp(a, b, w), [I((3, 4)), I((4,)), I((3, 1), kind="unit")], name="tensor-weight"),
]
CASES += [
    OpCase("lerp", lambda m, a, b: a.clone().lerp_(b, 0.7), [F, I((4,))], name="inplace"),
    OpCase("lerp", lambda m, a, b, w: a.clone().lerp_(b, w), [F, F, I((3, 4), kind="unit")], name="inplace-tensor-weight"),
]

# ---------------------------------------------------------------- atan2
CASES += [
    OpCase("atan2", lambda m, a, b: m.atan2(a, b), [F, F]),
    OpCase("atan2", lambda m, a, b: m.atan2(a, b), [I((2, 1, 4)), I((3, 1), noncontig=True)], name="bcast"),
    OpCase("atan2", lambda m, a, b: a.atan2(b), [I((3, 4), "float64"), I((), "float32")], name="zerodim-promote"),
    OpCase("atan2", lambda m, a, b: m.atan2(a, b), [I((5,), "int64", "int", -3, 4), I((5,), "int64", "int", 1, 4)], name="int"),
    OpCase("atan2", lambda m, a, b: m.atan2(a, b), [I((5,), "int64", "int", -3, 4), I((5,))], name="promote"),
    OpCase("atan2", lambda m, a, b: m.atan2(a, b), [I(()), I(())], name="0d"),
    OpCase("atan2", lambda m, a, b: m.atan2(a, b), [I((0, 4)), I((4,))], name="empty", gradcheck=False),
    OpCase("arctan2", lambda m, a, b: m.arctan2(a, b), [F, F]),
    OpCase("arctan2", lambda m, a, b: a.arctan2(b), [F, F], name="method"),
    OpCase("atan2", lambda m, a, b: a.clone().atan2_(b), [F, I((4,))], name="inplace"),
    OpCase("arctan2", lambda m, a, b: a.clone().arctan2_(b), [F, F], name="inplace"),
]

# ---------------------------------------------------------------- addcmul / addcdiv
POS4 = I((4,), kind="positive")
for op, t2 in (("addcmul", F), ("addcdiv", POS)):
    CASES += [
        OpCase(op, lambda m, x, a, b, op=op: getattr(m, op)(x, a, b), [F, F, t2]),
        OpCase(op, lambda m, x, a, b, op=op: getattr(m, op)(x, a, b, value=-0.5), [I((3, 1)), I((1, 4), noncontig=True), POS4],
               name="bcast-value"),
        OpCase(op, lambda m, x, a, b, op=op: getattr(x, op)(a, b, value=2), [F, I((2, 3, 4)), POS4], name="method-grow"),
        OpCase(op, lambda m, x, a, b, op=op: getattr(m, op)(x, a, b), [I(()), I(()), I((), kind="positive")], name="0d"),
        OpCase(op, lambda m, x, a, b, op=op: getattr(m, op)(x, a, b, value=3),
               [I((3, 4), "int64", "int", -5, 5), F, t2], name="promote"),
        OpCase(op, lambda m, x, a, b, op=op: getattr(m, op)(x, a, b),
               [I((3, 4), "float64"), I((), "float32"), t2], name="zerodim-promote"),
        OpCase(op, lambda m, x, a, b, op=op: getattr(m, op)(x, a, b), [I((0, 4)), I((4,)), POS4], name="empty",
               gradcheck=False),
        OpCase(op, lambda m, x, a, b, op=op: getattr(x.clone(), op + "_")(a, b, value=0.25), [F, I((4,)), t2],
               name="inplace"),
    ]
CASES += [
    # a float16 factor beside a float64 result: torch forms value * tensor1 in float16 for tensor2's gradient
    OpCase("addcmul", lambda m, x, a, b: m.addcmul(x, a, b, value=3.14), [I((3, 4), "float64"), I((3, 4), "float16"), F],
           name="mixed-half", gradcheck=False),
    OpCase("addcdiv", lambda m, x, a, b: m.addcdiv(x, a, b, value=-2.7), [I((3, 4), "float64"), F, I((4,), "float16", "positive")],
           name="mixed-half", gradcheck=False),
    OpCase("addcmul", lambda m, x, a, b: m.addcmul(x, a, b, value=1.5),
           [I((4,), "int64", "int", -5, 5), I((4,), "int64", "int", -5, 5), I((4,), "int64", "int", -5, 5)], name="int-truncated-value"),
    OpCase("addcdiv", lambda m, x, a, b: m.addcdiv(x, a, b, value=2),
           [I((4,), "int64", "int", -5, 5), F, I((3, 1), "int64", "int", 1, 5)], name="int-divisor",
           backward=False),  # torch's backward fails casting the divisor's gradient to int
]

# ---------------------------------------------------------------- integers to negative integer tensor powers (torch's powi)
CASES += [
    OpCase("pow", lambda m, a, b: m.pow(a, b), [I(dtype="int64", value=np.array([[1], [2], [-1], [0], [-2], [3]])),
                                                 I(dtype="int64", value=np.array([-1, -2, -3, 0, 2, 3]))], name="int-neg-tensor-exp"),
    OpCase("pow", lambda m, a, b: a ** b.reshape(()), [I(dtype="int32", value=np.array([1, -1, 5, -1], np.int32)),
                                                         I(dtype="int32", value=np.array([-3], np.int32))], name="int32-neg-0d-exp"),
    OpCase("pow", lambda m, b: (-1) ** b, [I((6,), "int64", "int", -4, 4)], name="int-rpow-neg-exp"),
    OpCase("pow", lambda m, a, b: a.clone().pow_(b), [I((5,), "int64", "int", -3, 4), I((5,), "int64", "int", -3, 3)],
           name="int-inplace-neg-exp"),
]
