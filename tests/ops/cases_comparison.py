"""Parity cases for engine/ops/comparison.py: comparisons, equal/isclose/allclose, maximum/minimum, where,
isin."""
import numpy as np

from harness import Input as I, OpCase

F = I((3, 4))
NC = I((4, 3), noncontig=True)
IA = I((3, 4), "int64", "int", -2, 3)
CASES = []

# ---------------------------------------------------------------- where, maximum, minimum
CASES += [
    OpCase("where", lambda m, c, x, y: m.where(c, x, y), [I((3, 4), "bool", "bool"), F, F]),
    OpCase("where", lambda m, c, x, y: m.where(c, x, y), [I((3, 1), "bool", "bool"), I((1, 4)), I((2, 1, 1))], name="bcast"),
    OpCase("where", lambda m, x: m.where(x > 0, x, 0.0), [NC], name="scalar-other"),
    OpCase("where", lambda m, x: m.where(x > 0, 1.5, x), [F], name="scalar-input"),
    OpCase("where", lambda m, c: m.where(c, 1.0, 0.0), [I((5,), "bool", "bool")], name="scalars"),
    OpCase("where", lambda m, c: m.where(c, 1, 0), [I((5,), "bool", "bool")], name="int-scalars"),
    OpCase("where", lambda m, c, x, y: m.where(c, x, y), [I((4,), "bool", "bool"), I((4,), "int64", "int", 0, 9), F], name="promote"),
    OpCase("where", lambda m, x, y: x.where(x > 0, y), [F, F], name="method"),
    OpCase("where", lambda m, c: m.where(c), [I((3, 4), "bool", "bool")], name="nonzero"),
    OpCase("maximum", lambda m, a, b: m.maximum(a, b), [F, F]),
    OpCase("maximum", lambda m, a, b: m.maximum(a, b), [I((2, 1, 4)), I((3, 1), noncontig=True)], name="bcast"),
    OpCase("maximum", lambda m, a, b: m.maximum(a, b), [I((5,), "int64", "int", -5, 5), I((5,), "int64", "int", -5, 5)], name="int"),
    OpCase("maximum", lambda m, a, b: m.maximum(a, b), [I((5,), "int64", "int", -5, 5), I((5,))], name="promote"),
    OpCase("minimum", lambda m, a, b: m.minimum(a, b), [F, F]),
    OpCase("minimum", lambda m, a, b: a.minimum(b), [I((2, 1, 4)), I((3, 1))], name="bcast"),
]

# ---------------------------------------------------------------- comparisons
_CMP = {"eq": "__eq__", "ne": "__ne__", "lt": "__lt__", "le": "__le__", "gt": "__gt__", "ge": "__ge__"}
for op, dunder in _CMP.items():
    CASES += [
        OpCase(op, lambda m, a, b, op=op: getattr(m, op)(a, b), [IA, I((3, 4), "int64", "int", -2, 3)], name="int"),
        OpCase(op, lambda m, a, b, d=dunder: getattr(a, d)(b), [I((2, 1, 4)), I((3, 1), noncontig=True)], name="bcast"),
        OpCase(op, lambda m, a, d=dunder: getattr(a, d)(0.0), [F], name="scalar"),
        OpCase(op, lambda m, a, d=dunder: getattr(a, d)(0.5), [IA], name="int-float-scalar"),
        OpCase(op, lambda m, a, b, op=op: getattr(a, op)(b), [IA, F], name="promote"),
        OpCase(op, lambda m, a, b, op=op: getattr(m, op)(a, b), [I((0, 4)), I((4,))], name="empty"),
    ]
CASES += [
    OpCase("eq", lambda m, a: a == a, [F], name="self"),
    OpCase("lt", lambda m, a: 0.0 < a, [F], name="reflected"),
    OpCase("eq", lambda m, a, b: a == b, [I((5,), "bool", "bool"), I((5,), "bool", "bool")], name="bool"),
    OpCase("equal", lambda m, a: m.equal(a, a.clone()), [F]),
    OpCase("equal", lambda m, a, b: m.equal(a, b), [F, F], name="different"),
    OpCase("equal", lambda m, a, b: a.equal(b), [F, I((4, 3))], name="shapes"),
    OpCase("allclose", lambda m, a: m.allclose(a, a + 1e-9), [F]),
    OpCase("allclose", lambda m, a: a.allclose(a + 1e-3, rtol=0, atol=1e-4), [F], name="far"),
    OpCase("isclose", lambda m, a, b: m.isclose(a, b, rtol=0.5), [F, I((4,))]),
    OpCase("isclose", lambda m, a: m.isclose(m.log(a), m.log(a), equal_nan=True), [F], name="nan"),
]

# ---------------------------------------------------------------- isin
CASES += [
    OpCase("isin", lambda m, a, b: m.isin(a, b), [I((3, 5), "int64", "int", 0, 8), I((4,), "int64", "int", 0, 8)]),
    OpCase("isin", lambda m, a, b: m.isin(a, b, invert=True), [I((7,), "int64", "int", 0, 5), I((2, 3), "int64", "int", 0, 5)],
           name="invert-2d-test"),
    OpCase("isin", lambda m, a: m.isin(a, 2), [I((2, 3), "int64", "int", 0, 4)], name="scalar-test"),
    OpCase("isin", lambda m, b: m.isin(3, b), [I((5,), "int64", "int", 0, 6)], name="scalar-elements"),
    OpCase("isin", lambda m, a, b: m.isin(a, b), [I(value=np.array([1.0, 2.5, np.nan, 4.0])), I(value=np.array([2.5, np.nan, 1.0]))],
           name="float-nan"),
    OpCase("isin", lambda m, a, b: m.isin(a, b, assume_unique=True), [I((4,), "int64", "int", 0, 6), I(value=np.array([2.0, 3.5]))],
           name="promote"),
    OpCase("isin", lambda m, a, b: m.isin(a, b), [I((0, 3), "int64", "int", 0, 5), I((3,), "int64", "int", 0, 5)], name="empty"),
    OpCase("isin", lambda m, a, b: m.isin(a, b), [I((), "int64", "int", 0, 3), I((0,), "int64", "int", 0, 3)], name="0d-empty-test"),
]
