"""Parity cases for engine/ops/logical.py: logical and bitwise ops."""
from harness import Input as I, OpCase

F = I((3, 4))
IA = I((3, 4), "int64", "int", -2, 3)
CASES = []

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

SHIFT = I((4,), "int64", "int", 0, 9)
for op, sym in (("bitwise_left_shift", "<<"), ("bitwise_right_shift", ">>")):
    CASES += [
        OpCase(op, lambda m, a, b, op=op: getattr(m, op)(a, b), [IA, SHIFT]),
        OpCase(op, eval(f"lambda m, a, b: a {sym} b"), [IA, I((3, 4), "int64", "int", 60, 70)], name="past-width"),
        OpCase(op, eval(f"lambda m, a: a {sym} 3"), [IA], name="scalar"),
        OpCase(op, eval(f"lambda m, a: 3 {sym} a"), [I((3, 4), "int64", "int", 0, 5)], name="reflected"),
        OpCase(op, eval(f"lambda m, a: a {sym} 1"), [B], name="bool"),
        OpCase(op, eval(f"lambda m, a, b: a {sym} b"), [I((4,), "int32", "int", -99, 99), I((4,), "int32", "int", 0, 40)],
               name="int32"),
    ]
