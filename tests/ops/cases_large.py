"""Parity cases on inputs large enough to take the engine's multi-threaded, blocked CPU paths
(more than one block of BLOCK_ELEMENTS and more than MIN_PARALLEL_ELEMENTS elements, with
leading dims that make blocks of single indices and of row ranges). The small cases of each
family already run the finite-difference checks; these check the blocked kernels against torch."""
import numpy as np

from harness import Input as I, OpCase

BIG4 = (3, 5, 70, 300)  # 315k elements: blocks of (index, index, row range)
BIG2 = (1200, 384)  # 460k elements: blocks of row ranges
MASK = I((70, 300), "bool", "bool")


def _big(op, fn, inputs, name):
    # weight gradients here are float32 sums over 1000+ rows: judged against a float64 reference
    return OpCase(op, fn, inputs, gradcheck=False, name=f"large-{name}", extra={"float64_reference": True})


CASES = [
    _big("softmax", lambda m, x: m.softmax(x, dim=-1), [I(BIG4)], "4d"),
    _big("log_softmax", lambda m, x: m.log_softmax(x, dim=-1), [I(BIG4)], "4d"),
    _big("softmax", lambda m, x: m.softmax(x, dim=-1), [I(BIG2)], "2d"),
    _big("scale_mask_softmax",
         lambda m, x, k: (m.nn.functional.scale_mask_softmax(x, k, 0.125, float("-inf")) if m.__name__ == "engine"
                          else (x * 0.125).masked_fill(k, float("-inf")).softmax(-1)),
         [I(BIG4), I((70, 300), "bool", value=np.triu(np.ones((70, 300), bool), 1))], "causal"),
    _big("masked_fill", lambda m, x, k: x.masked_fill(k, -3.5), [I(BIG4), MASK], "bcast"),
    _big("masked_fill", lambda m, x, k: x.masked_fill(k, float("-inf")).softmax(-1),
         [I(BIG4), I((70, 300), "bool", value=np.triu(np.ones((70, 300), bool), 1))], "then-softmax"),
    _big("layer_norm", lambda m, x, w, b: m.nn.functional.layer_norm(x, (384,), w, b), [I(BIG2), I((384,)), I((384,))], "2d"),
    _big("layer_norm", lambda m, x: m.nn.functional.layer_norm(x, (300,)), [I(BIG4)], "4d-noaffine"),
    _big("gelu", lambda m, x: m.nn.functional.gelu(x, approximate="tanh"), [I(BIG4)], "tanh"),
    _big("gelu", lambda m, x: m.nn.functional.gelu(x), [I(BIG2)], "exact"),
    _big("add", lambda m, a, b: a + b, [I(BIG4), I((300,))], "bias"),
    _big("mul", lambda m, a, b: a * b, [I(BIG4), I(BIG4)], "same"),
    _big("sub", lambda m, a, b: a - b, [I(BIG2), I((1200, 1))], "col"),
]
