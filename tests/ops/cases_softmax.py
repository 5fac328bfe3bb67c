"""Parity cases for engine/ops/softmax.py: softmax, log_softmax, the fused attention softmax."""
import numpy as np
import torch

from harness import Input as I, OpCase

CASES = []


def _mask(value):
    return I(value=value, dtype="bool")


# ------------------------------------------------------------------ softmax / log_softmax
for op in ("softmax", "log_softmax"):
    CASES += [
        OpCase(op, lambda m, x, op=op: getattr(m, op)(x, 1), [I((3, 5))], name="2d"),
        OpCase(op, lambda m, x, op=op: getattr(m, op)(x, -1), [I((2, 3, 4))], name="last"),
        OpCase(op, lambda m, x, op=op: getattr(m, op)(x, 0), [I((4, 3))], name="dim0"),
        OpCase(op, lambda m, x, op=op: getattr(m, op)(x, 1), [I((2, 4, 3))], name="middle"),
        OpCase(op, lambda m, x, op=op: getattr(m, op)(x, -1), [I((3, 6), noncontig=True)], name="noncontig"),
        OpCase(op, lambda m, x, op=op: getattr(x, op)(1), [I((2, 5, 3), noncontig=True)], name="method-noncontig"),
        OpCase(op, lambda m, x, op=op: getattr(m, op)(x, -1), [I((3, 1))], name="size1"),
        OpCase(op, lambda m, x, op=op: getattr(m, op)(x, 0), [I((0, 3))], name="empty", gradcheck=False),
        OpCase(op, lambda m, x, op=op: getattr(m, op)(x, 0), [I(())], name="scalar"),
        OpCase(op, lambda m, x, op=op: getattr(m, op)(x * 50, -1), [I((4, 7))], name="large-values"),
        OpCase(op, lambda m, x, op=op: getattr(m, op)(x, 1, dtype=m.float64), [I((3, 4))], name="dtype"),
        OpCase(op, lambda m, x, op=op: getattr(m.nn.functional, op)(x, dim=-1), [I((3, 4))], name="F"),
    ]


# ------------------------------------------------------------------ fused attention softmax
def _sms(m, x, mask, scale=0.5, fill=-10000.0):
    if m is torch:
        return torch.softmax((x * scale).masked_fill(mask, fill), -1)
    return m.scale_mask_softmax(x, mask, scale, fill)


_CAUSAL = np.triu(np.ones((5, 5), dtype=bool), 1)
_FULL_ROW = np.array([[False, True, False], [True, True, True]])
CASES += [
    OpCase("scale_mask_softmax", _sms, [I((2, 3, 5, 5)), _mask(_CAUSAL)], name="causal"),
    OpCase("scale_mask_softmax", lambda m, x, k: _sms(m, x, k, 1.0, float("-inf")),
           [I((2, 5, 5)), _mask(_CAUSAL)], name="neg-inf"),
    OpCase("scale_mask_softmax", _sms, [I((4, 2, 3)), _mask(_FULL_ROW)], name="fully-masked-row"),
    OpCase("scale_mask_softmax", lambda m, x, k: _sms(m, x, k), [I((2, 5, 5), noncontig=True), _mask(_CAUSAL)],
           name="noncontig"),
    OpCase("scale_mask_softmax",
           lambda m, x: m.softmax(x * 0.25, -1) if m is torch else m.scale_mask_softmax(x, scale=0.25),
           [I((3, 6))], name="nomask"),
    OpCase("scale_mask_softmax",
           lambda m, x, a: m.softmax(x + a, -1) if m is torch else m.scale_mask_softmax(x, a),
           [I((2, 3, 4)), I((3, 4), requires_grad=False)], name="additive"),
]
