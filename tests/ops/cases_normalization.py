"""Parity cases for engine/ops/normalization.py: layer_norm, normalize, cosine_similarity."""

from harness import Input as I, OpCase

CASES = []


# ------------------------------------------------------------------ layer_norm
def _ln(shape, *args, **kw):
    return lambda m, x, *p: m.nn.functional.layer_norm(x, shape, *p, **kw)


CASES += [
    OpCase("layer_norm", _ln((6,)), [I((4, 6))], name="plain"),
    OpCase("layer_norm", _ln((6,)), [I((2, 3, 6)), I((6,)), I((6,))], name="affine"),
    OpCase("layer_norm", _ln((3, 4)), [I((2, 3, 4)), I((3, 4)), I((3, 4))], name="2d-shape"),
    OpCase("layer_norm", lambda m, x, w: m.nn.functional.layer_norm(x, (5,), w), [I((3, 5)), I((5,))], name="weight-only"),
    OpCase("layer_norm", lambda m, x, b: m.nn.functional.layer_norm(x, (5,), None, b), [I((3, 5)), I((5,))], name="bias-only"),
    OpCase("layer_norm", _ln((4,), eps=1e-3), [I((3, 4), noncontig=True), I((4,)), I((4,))], name="noncontig-eps"),
    OpCase("layer_norm", _ln((4,)), [I((1, 4)), I((4,)), I((4,))], name="one-row"),
    OpCase("layer_norm", _ln((4,)), [I((0, 4)), I((4,)), I((4,))], name="empty", gradcheck=False),
    OpCase("layer_norm", _ln((32,)), [I((3, 32)), I((32,)), I((32,))], name="wide"),
]


# ------------------------------------------------------------------ normalize / cosine_similarity
CASES += [
    OpCase("normalize", lambda m, x: m.nn.functional.normalize(x), [I((3, 4))], name="default"),
    OpCase("normalize", lambda m, x: m.nn.functional.normalize(x, dim=-1), [I((2, 3, 4), noncontig=True)], name="last"),
    OpCase("normalize", lambda m, x: m.nn.functional.normalize(x, p=1, dim=0), [I((3, 4))], name="p1"),
    OpCase("normalize", lambda m, x: m.nn.functional.normalize(x, p=3, dim=1), [I((3, 4))], name="p3"),
    OpCase("normalize", lambda m, x: m.nn.functional.normalize(x, p=float("inf"), dim=1), [I((3, 4), kind="distinct")],
           name="pinf"),
    OpCase("normalize", lambda m, x: m.nn.functional.normalize(x * 1e-14, dim=1), [I((3, 4))], name="clamped",
           gradcheck=False),  # values ~1e-14: finite differences at eps=1e-6 are meaningless
    OpCase("cosine_similarity", lambda m, a, b: m.nn.functional.cosine_similarity(a, b), [I((3, 4)), I((3, 4))]),
    OpCase("cosine_similarity", lambda m, a, b: m.nn.functional.cosine_similarity(a, b, dim=-1),
           [I((2, 3, 4), noncontig=True), I((3, 4))], name="bcast-noncontig"),
    OpCase("cosine_similarity", lambda m, a, b: m.nn.functional.cosine_similarity(a, b, dim=0), [I((5,)), I((5,))],
           name="1d"),
]
