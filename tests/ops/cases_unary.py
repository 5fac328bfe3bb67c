"""Parity cases for engine/ops/unary.py: pointwise math, clamp, isnan & co, nan_to_num, activations."""
import numpy as np

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
                 ("tanh", "normal"), ("sigmoid", "normal"), ("abs", "normal"), ("erf", "normal"),
                 ("log2", "positive"), ("erfinv", "unit")):
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

# ---------------------------------------------------------------- clamp, isnan & co
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
]
for op in ("isnan", "isinf", "isfinite"):
    CASES += [
        OpCase(op, lambda m, x, op=op: getattr(m, op)(m.log(x)), [I((3, 4), kind="uniform", low=-1, high=1)]),
        OpCase(op, lambda m, x, op=op: getattr(x, op)(), [I((5,), "int64", "int", -5, 5)], name="int"),
        OpCase(op, lambda m, x, op=op: getattr(m, op)(x / 0.0), [I((6,), kind="uniform", low=-1, high=1)], name="inf"),
    ]

# ---------------------------------------------------------------- log2, erfinv, nan_to_num
SPECIAL = np.array([[1.5, np.nan, np.inf], [-np.inf, -2.0, 0.25], [np.nan, 3.0, -np.inf]], dtype=np.float32)
CASES += [
    OpCase("log2", _fn("log2"), [I(dtype="int64", value=np.array([1, 8, 1024, 3]))], name="int-exact"),
    OpCase("log2", lambda m, x: x.clone().log2_(), [POS], name="inplace"),
    OpCase("log2", _fn("log2"), [I((3, 4), "float64", "positive")], name="float64"),
    OpCase("erfinv", lambda m, x: x.clone().erfinv_(), [I((3, 4), kind="unit")], name="inplace"),
    OpCase("erfinv", _fn("erfinv"), [I(value=np.array([-1.0, 1.0, 1.5, 0.0], dtype=np.float32))], name="edges",
           backward=False, gradcheck=False),  # +-inf and NaN outside (-1, 1)
    OpCase("erfinv", _fn("erfinv"), [I((3, 4), "float64", "unit")], name="float64"),
    OpCase("nan_to_num", _fn("nan_to_num"), [I(value=SPECIAL)], gradcheck=False),  # inf/NaN: no finite differences
    OpCase("nan_to_num", lambda m, x: m.nan_to_num(x, nan=1.5, posinf=2, neginf=-3.0), [I(value=SPECIAL)], name="values",
           gradcheck=False),
    OpCase("nan_to_num", lambda m, x: x.nan_to_num(posinf=1e300), [I(value=SPECIAL)], name="overflow", gradcheck=False),
    OpCase("nan_to_num", _fn("nan_to_num"), [I(value=SPECIAL.astype(np.float64))], name="float64", gradcheck=False),
    OpCase("nan_to_num", _fn("nan_to_num"), [I(value=SPECIAL.astype(np.float16), dtype="float16")], name="float16",
           gradcheck=False),
    OpCase("nan_to_num", lambda m, x: x.clone().nan_to_num_(neginf=0.0), [I(value=SPECIAL)], name="inplace",
           gradcheck=False),
    OpCase("nan_to_num", _fn("nan_to_num"), [NC], name="finite-noncontig"),
    OpCase("nan_to_num", _fn("nan_to_num"), [I((5,), "int64", "int", -5, 5)], name="int"),
    OpCase("nan_to_num", _fn("nan_to_num"), [I(())], name="0d"),
    OpCase("nan_to_num", _fn("nan_to_num"), [I((0, 2))], name="empty", gradcheck=False),
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
    OpCase("abs", lambda m, x: x.clone().abs_(), [F], name="inplace"),
    OpCase("gelu", lambda m, x: _F(m).gelu(x), [I((4, 5))]),
    OpCase("gelu", lambda m, x: _F(m).gelu(x, approximate="tanh"), [I((4, 5))], name="tanh"),
    OpCase("gelu", lambda m, x: _F(m).gelu(x), [I((5, 4), noncontig=True)], name="noncontig"),
    OpCase("gelu", lambda m, x: _F(m).gelu(x), [I(())], name="0d"),  # its backward failed on 0-d arrays
    OpCase("gelu", lambda m, x: _F(m).gelu(x, approximate="tanh"), [I(())], name="tanh-0d"),
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
    OpCase("softplus", lambda m, x: _F(m).softplus(x), [I(())], name="0d"),
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

# ---------------------------------------------------------------- in-place clamp_min_/clamp_max_, is_complex
CASES += [
    OpCase("clamp_min", lambda m, x: x.clone().clamp_min_(0.1), [F], name="inplace"),
    OpCase("clamp_max", lambda m, x: x.clone().clamp_max_(-0.1), [NC], name="inplace"),
    OpCase("clamp_min", lambda m, x, lo: x.clone().clamp_min_(lo), [F, I((4,))], name="inplace-tensor"),
    OpCase("clamp_max", lambda m, x: x.clone().clamp_max_(2), [I((6,), "int64", "int", -5, 5)], name="inplace-int"),
    OpCase("is_complex", lambda m, x: m.is_complex(x), [F], backward=False),
    OpCase("is_complex", lambda m, x: (x.is_complex(), m.is_complex(x)), [I((3,), "int64", "int", 0, 3)], name="int", backward=False),
    OpCase("is_floating_point", lambda m, x: m.is_floating_point(x), [F], backward=False),
    OpCase("is_floating_point", lambda m, x: m.is_floating_point(x), [I((3,), "int64", "int", 0, 3)], name="int",
           backward=False),
]
