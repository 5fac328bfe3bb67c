"""Parity cases for engine/ops/unary.py: pointwise math, activations, comparisons, logical ops."""
from harness import Input as I, OpCase

F = I((3, 4))
NC = I((4, 3), noncontig=True)
POS = I((3, 4), kind="positive")
CASES = []


def _fn(name):
    return lambda m, x, name=name: getattr(m, name)(x)


def _F(m):
    """torch.nn.functional or engine.nn.functional."""
    return m.nn.functional


# ---------------------------------------------------------------- unary math
for op, kind in (("exp", "normal"), ("log", "positive"), ("log1p", "positive"), ("expm1", "normal"),
                 ("sqrt", "positive"), ("rsqrt", "positive"), ("sin", "normal"), ("cos", "normal"),
                 ("tanh", "normal"), ("sigmoid", "normal"), ("abs", "normal"), ("erf", "normal")):
    CASES += [
        OpCase(op, _fn(op), [I((3, 4), kind=kind)]),
        OpCase(op, lambda m, x, op=op: getattr(x, op)(), [I((4, 1, 3), kind=kind, noncontig=True)], name="method-noncontig"),
        OpCase(op, _fn(op), [I((0, 3), kind=kind)], name="empty", gradcheck=False),
        OpCase(op, _fn(op), [I((), kind=kind)], name="0d"),
    ]
    if op != "abs":
        CASES.append(OpCase(op, _fn(op), [I((5,), "int64", "int", 1, 5)], name="int-to-float"))

CASES += [
    OpCase("abs", lambda m, x: abs(x), [F], name="builtin"),
    OpCase("abs", _fn("abs"), [I((6,), "int64", "int", -5, 5)], name="int"),
    OpCase("abs", _fn("abs"), [I((3, 4), "float64")], name="float64"),
    OpCase("sigmoid", _fn("sigmoid"), [I((50,), kind="uniform", low=-100, high=100)], name="extreme"),
    OpCase("tanh", _fn("tanh"), [I((70000,))], name="blocked"),  # the block-by-block, threaded path
    OpCase("sigmoid", _fn("sigmoid"), [I((300000,))], name="threaded", gradcheck=False),
    OpCase("exp", _fn("exp"), [I((3, 4), "float64")], name="float64"),
    # piecewise-constant ops: zero gradient (random inputs stay away from the jumps)
    OpCase("sign", _fn("sign"), [F]),
    OpCase("sign", _fn("sign"), [I((6,), "int64", "int", -3, 3)], name="int"),
    OpCase("floor", _fn("floor"), [I((3, 4), kind="uniform", low=-5, high=5)]),
    OpCase("floor", _fn("floor"), [I((5,), "int64", "int", -5, 5)], name="int"),
    OpCase("ceil", lambda m, x: x.ceil(), [I((3, 4), kind="uniform", low=-5, high=5, noncontig=True)]),
    OpCase("trunc", _fn("trunc"), [I((3, 4), kind="uniform", low=-5, high=5)]),
    OpCase("round", _fn("round"), [I((3, 4), kind="uniform", low=-5, high=5)]),
    OpCase("round", lambda m, x: m.round(x, decimals=2), [I((3, 4), kind="uniform", low=-5, high=5)], name="decimals"),
    OpCase("round", _fn("round"), [I((4,), "int64", "int", -5, 5)], name="int"),
]

# ---------------------------------------------------------------- pow
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
]

# ---------------------------------------------------------------- clamp, where, maximum, ...
U = I((3, 4), kind="uniform", low=-2, high=2)
CASES += [
    OpCase("clamp", lambda m, x: m.clamp(x, -0.5, 0.5), [F]),
    OpCase("clamp", lambda m, x: x.clamp(min=-0.2), [NC], name="min"),
    OpCase("clamp", lambda m, x: x.clamp(max=0.3), [F], name="max"),
    OpCase("clamp", lambda m, x: m.clamp(x, 1.0, -1.0), [F], name="min-gt-max"),
    OpCase("clamp", lambda m, x: m.clamp(x, -2, 3), [I((6,), "int64", "int", -5, 5)], name="int"),
    OpCase("clamp", lambda m, x: m.clamp(x, min=1.5), [I((6,), "int64", "int", -5, 5)], name="int-float-bound"),
    OpCase("clamp", lambda m, x, lo, hi: m.clamp(x, lo, hi),
           [U, I((4,), kind="uniform", low=-1.5, high=-0.5), I((3, 1), kind="uniform", low=0.5, high=1.5)], name="tensor-bounds"),
    OpCase("clamp", lambda m, x, lo: m.clamp(x, min=lo), [U, I((3, 4), kind="uniform", low=-1, high=0)], name="tensor-min"),
    OpCase("clamp", lambda m, x, hi: x.clamp(max=hi), [U, I((4,), kind="uniform", low=0, high=1)], name="tensor-max"),
    OpCase("clip", lambda m, x: m.clip(x, -0.5, 0.5), [F]),
    OpCase("clip", lambda m, x: x.clip(-0.5, 0.5), [F], name="method"),
    OpCase("clamp_min", lambda m, x: m.clamp_min(x, 0.1), [F]),
    OpCase("clamp_max", lambda m, x: x.clamp_max(0.1), [F]),
    OpCase("clamp", lambda m, x: x.clone().clamp_(-0.5, 0.5), [F], name="inplace"),
    OpCase("clip", lambda m, x: x.clone().clip_(min=0.0), [F], name="inplace"),
    OpCase("clamp", lambda m, x, lo: x.clone().clamp_(min=lo), [F, I((4,))], name="inplace-tensor"),
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
    OpCase("lerp", lambda m, a, b: m.lerp(a, b, 0.3), [F, F]),
    OpCase("lerp", lambda m, a, b, w: m.lerp(a, b, w), [I((3, 4)), I((4,)), I((3, 1), kind="unit")], name="tensor-weight"),
]
for op in ("isnan", "isinf", "isfinite"):
    CASES += [
        OpCase(op, lambda m, x, op=op: getattr(m, op)(m.log(x)), [I((3, 4), kind="uniform", low=-1, high=1)]),
        OpCase(op, lambda m, x, op=op: getattr(x, op)(), [I((5,), "int64", "int", -5, 5)], name="int"),
        OpCase(op, lambda m, x, op=op: getattr(m, op)(x / 0.0), [I((6,), kind="uniform", low=-1, high=1)], name="inf"),
    ]

# ---------------------------------------------------------------- activations
CASES += [
    OpCase("relu", _fn("relu"), [F]),
    OpCase("relu", lambda m, x: x.relu(), [NC], name="method-noncontig"),
    OpCase("relu", lambda m, x: _F(m).relu(x), [I((2, 3, 4))], name="functional"),
    OpCase("relu", _fn("relu"), [I((6,), "int64", "int", -5, 5)], name="int"),
    OpCase("relu", lambda m, x: m.relu(x).relu(), [F], name="chain"),
    OpCase("relu_", lambda m, x: m.relu_(x * 1.0), [F]),
    OpCase("relu_", lambda m, x: x.clone().relu_(), [F], name="method"),
    OpCase("relu_", lambda m, x: _F(m).relu(x.clone(), inplace=True), [F], name="functional-inplace"),
    OpCase("silu", lambda m, x: _F(m).silu(x.clone(), inplace=True), [F], name="inplace"),
    OpCase("leaky_relu", lambda m, x: _F(m).leaky_relu(x.clone(), 0.1, inplace=True), [F], name="inplace"),
    OpCase("hardtanh", lambda m, x: _F(m).hardtanh(x.clone(), inplace=True), [F], name="inplace"),
    OpCase("exp", lambda m, x: x.clone().exp_(), [F], name="inplace"),
    OpCase("sigmoid", lambda m, x: x.clone().sigmoid_(), [F], name="inplace"),
    OpCase("pow", lambda m, x: x.clone().pow_(2), [F], name="inplace"),
    OpCase("abs", lambda m, x: x.clone().abs_(), [F], name="inplace"),
    OpCase("gelu", lambda m, x: _F(m).gelu(x), [I((4, 5))]),
    OpCase("gelu", lambda m, x: _F(m).gelu(x, approximate="tanh"), [I((4, 5))], name="tanh"),
    OpCase("gelu", lambda m, x: _F(m).gelu(x), [I((5, 4), noncontig=True)], name="noncontig"),
    OpCase("gelu", lambda m, x: _F(m).gelu(x), [I((200,), kind="uniform", low=-8, high=8)], name="wide"),
    OpCase("gelu", lambda m, x: _F(m).gelu(x, approximate="tanh"), [I((200,), kind="uniform", low=-8, high=8)], name="tanh-wide"),
    OpCase("gelu", lambda m, x: _F(m).gelu(x), [I((3, 4), "float64")], name="float64"),
    OpCase("gelu", lambda m, x: _F(m).gelu(x), [I((70000,))], name="blocked"),
    OpCase("gelu", lambda m, x: _F(m).gelu(x, approximate="tanh"), [I((300000,))], name="tanh-threaded", gradcheck=False),
    OpCase("gelu", lambda m, x: _F(m).gelu(x), [I((0, 4))], name="empty", gradcheck=False),
    OpCase("silu", lambda m, x: _F(m).silu(x), [I((3, 4))]),
    OpCase("silu", lambda m, x: _F(m).silu(x), [I((50,), kind="uniform", low=-100, high=100)], name="extreme"),
    OpCase("silu", lambda m, x: _F(m).silu(x), [I((70000,))], name="blocked"),
    OpCase("softplus", lambda m, x: _F(m).softplus(x), [I((3, 4))]),
    OpCase("softplus", lambda m, x: _F(m).softplus(x, beta=2.0, threshold=5.0), [I((40,), kind="uniform", low=-6, high=6)], name="beta-threshold"),
    OpCase("softplus", lambda m, x: _F(m).softplus(x), [I((50,), kind="uniform", low=-100, high=100)], name="extreme"),
    OpCase("leaky_relu", lambda m, x: _F(m).leaky_relu(x), [F]),
    OpCase("leaky_relu", lambda m, x: _F(m).leaky_relu(x, 0.2), [NC], name="slope"),
    OpCase("hardtanh", lambda m, x: _F(m).hardtanh(x), [I((3, 4), kind="uniform", low=-2, high=2)]),
    OpCase("hardtanh", lambda m, x: _F(m).hardtanh(x, -0.5, 0.7), [F], name="bounds"),
    OpCase("tanh", lambda m, x: _F(m).tanh(x), [F], name="functional"),
    OpCase("sigmoid", lambda m, x: _F(m).sigmoid(x), [F], name="functional"),
    OpCase("gelu", lambda m, x: _F(m).gelu(x), [I((3, 4), "float16")], name="float16", gradcheck=False, rtol=2e-3, atol=2e-3),
]

# ---------------------------------------------------------------- comparisons
_CMP = {"eq": "__eq__", "ne": "__ne__", "lt": "__lt__", "le": "__le__", "gt": "__gt__", "ge": "__ge__"}
IA = I((3, 4), "int64", "int", -2, 3)
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

# ---------------------------------------------------------------- logical / bitwise
B = I((3, 4), "bool", "bool")
for op in ("logical_and", "logical_or", "logical_xor"):
    CASES += [
        OpCase(op, lambda m, a, b, op=op: getattr(m, op)(a, b), [B, I((4,), "bool", "bool")]),
        OpCase(op, lambda m, a, b, op=op: getattr(a, op)(b), [F, IA], name="numbers"),
    ]
CASES += [
    OpCase("logical_not", lambda m, a: m.logical_not(a), [B]),
    OpCase("logical_not", lambda m, a: a.logical_not(), [F], name="float"),
]
for op, sym in (("bitwise_and", "&"), ("bitwise_or", "|"), ("bitwise_xor", "^")):
    CASES += [
        OpCase(op, lambda m, a, b, op=op: getattr(m, op)(a, b), [B, I((4,), "bool", "bool")]),
        OpCase(op, eval(f"lambda m, a, b: a {sym} b"), [IA, I((4,), "int64", "int", 0, 7)], name="int"),
        OpCase(op, eval(f"lambda m, a: a {sym} 3"), [IA], name="scalar"),
        OpCase(op, eval(f"lambda m, a: 3 {sym} a"), [IA], name="reflected"),
        OpCase(op, eval(f"lambda m, a, b: a {sym} b"), [B, IA], name="promote"),
        OpCase(op, eval(f"lambda m, a: (a > 0) {sym} (a < 0.5)"), [F], name="masks"),
    ]
CASES += [
    OpCase("bitwise_not", lambda m, a: ~a, [B]),
    OpCase("bitwise_not", lambda m, a: m.bitwise_not(a), [IA], name="int"),
]
