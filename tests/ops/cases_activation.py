"""Parity cases for engine/ops/activation.py: relu6, hardswish, hardsigmoid, the elu family, mish,
logsigmoid, glu, prelu, softsign, tanhshrink (kinks and module forms: tests/test_nn_activations_losses.py)."""

from harness import Input as I, OpCase

CASES = []
# values on both sides of every kink (+-3, 0, 6) but never on one, for the finite differences
WIDE = I((4, 5), kind="uniform", low=-8, high=8)


def _f(name, **kw):
    return lambda m, x, name=name: getattr(m.nn.functional, name)(x, **kw)


for op, kw in (("relu6", {}), ("hardswish", {}), ("hardsigmoid", {}), ("elu", {"alpha": 0.7}), ("selu", {}),
               ("celu", {"alpha": 1.5}), ("mish", {}), ("logsigmoid", {}), ("softsign", {}), ("tanhshrink", {})):
    CASES += [
        OpCase(op, _f(op, **kw), [WIDE], name="wide"),
        OpCase(op, _f(op, **kw), [I((3, 1, 4), noncontig=True)], name="noncontig"),
        OpCase(op, _f(op, **kw), [I((), kind="uniform", low=-4, high=4)], name="0d"),
        OpCase(op, _f(op, **kw), [I((0, 3))], name="empty", gradcheck=False),
        OpCase(op, _f(op, **kw), [I((3, 4), "float64", kind="uniform", low=-8, high=8)], name="float64"),
    ]
CASES += [
    OpCase("relu6", _f("relu6"), [I((6,), "int64", "int", -3, 9)], name="int"),
    OpCase("softsign", _f("softsign"), [I((6,), "int64", "int", -3, 9)], name="int-to-float"),
    OpCase("tanhshrink", _f("tanhshrink"), [I((6,), "int64", "int", -3, 9)], name="int-to-float"),
    OpCase("mish", _f("mish"), [I((40,), kind="uniform", low=-100, high=100)], name="extreme"),
    OpCase("logsigmoid", _f("logsigmoid"), [I((40,), kind="uniform", low=-100, high=100)], name="extreme"),
    OpCase("elu", _f("elu"), [I((40,), kind="uniform", low=-100, high=100)], name="extreme"),
]
for dim in (-1, 0, 1):
    CASES.append(OpCase("glu", lambda m, x, dim=dim: m.nn.functional.glu(x, dim), [I((4, 6, 2))], name=f"dim{dim}"))
CASES.append(OpCase("glu", lambda m, x: m.nn.functional.glu(x), [I((3, 4), noncontig=True)], name="noncontig"))


def _prelu(m, x, w):
    return m.nn.functional.prelu(x, w)


CASES += [
    OpCase("prelu", _prelu, [WIDE, I((1,))], name="shared"),
    OpCase("prelu", _prelu, [I((2, 3, 4)), I((3,))], name="channels"),
    OpCase("prelu", _prelu, [I((2, 3, 2, 2), noncontig=True), I((3,))], name="channels-4d-noncontig"),
    OpCase("prelu", _prelu, [I((5,)), I((1,))], name="1d"),
    OpCase("prelu", _prelu, [I(()), I(())], name="0d"),
    OpCase("prelu", _prelu, [I((0, 3)), I((3,))], name="empty", gradcheck=False),
    OpCase("prelu", _prelu, [I((2, 3), "float64"), I((3,), "float64")], name="float64"),
]


# gumbel_softmax draws Gumbel noise: checked statistically, and its hard=True straight-through gradient
COVERED_ELSEWHERE = {"gumbel_softmax": "tests/test_nn_extra_modules.py::test_gumbel_softmax_statistics"}
