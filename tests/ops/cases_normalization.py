"""Parity cases for engine/ops/normalization.py: layer_norm, normalize, cosine_similarity."""
import torch

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


# layer_norm_into_autocast (an engine function) is torch's layer_norm outside autocast; under
# autocast it adds the cast a product would make (tests/test_fused_kernels_norm_act.py)
def _ln_into_autocast(shape):
    def fn(m, x, *p):
        if m is torch:
            return m.nn.functional.layer_norm(x, shape, *p)
        return m.nn.functional.layer_norm_into_autocast(x, shape, *p)
    return fn


CASES += [
    OpCase("layer_norm_into_autocast", _ln_into_autocast((6,)), [I((2, 3, 6)), I((6,)), I((6,))], name="affine"),
    OpCase("layer_norm_into_autocast", _ln_into_autocast((3, 4)), [I((2, 3, 4))], name="2d-shape"),
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


# ------------------------------------------------------------------ batch / instance / group / rms norm
def _stats(x, rm, rv):
    """Running statistics in the input's dtype (gradcheck runs x in float64; torch refuses a mix)."""
    return rm.to(x.dtype), rv.to(x.dtype)


def _positive(shape):
    return I(shape, kind="positive", requires_grad=False)


def _fixed(shape):
    return I(shape, requires_grad=False)


CASES += [
    # training without running statistics: a pure function of (x, weight, bias)
    OpCase("batch_norm", lambda m, x, w, b: m.nn.functional.batch_norm(x, None, None, w, b, training=True),
           [I((4, 3, 5)), I((3,)), I((3,))], name="train"),
    OpCase("batch_norm", lambda m, x: m.nn.functional.batch_norm(x, None, None, training=True, eps=1e-3),
           [I((2, 3, 4, 5), noncontig=True)], name="train-4d"),
    OpCase("batch_norm", lambda m, x, b: m.nn.functional.batch_norm(x, None, None, None, b, training=True),
           [I((5, 2)), I((2,))], name="train-2d-bias-only"),
    OpCase("batch_norm", lambda m, x, rm, rv, w, b: m.nn.functional.batch_norm(x, *_stats(x, rm, rv), w, b),
           [I((3, 4, 5)), _fixed((4,)), _positive((4,)), I((4,)), I((4,))], name="eval"),
    OpCase("batch_norm", lambda m, x, rm, rv: m.nn.functional.batch_norm(x, rm, rv, training=True),
           [I((0, 3)), _fixed((3,)), _positive((3,))], name="empty", gradcheck=False),
    OpCase("instance_norm", lambda m, x, w, b: m.nn.functional.instance_norm(x, weight=w, bias=b),
           [I((2, 3, 4, 5)), I((3,)), I((3,))]),
    OpCase("instance_norm", lambda m, x: m.nn.functional.instance_norm(x, eps=1e-3), [I((1, 2, 7))], name="batch1"),
    OpCase("instance_norm", lambda m, x, rm, rv, w: m.nn.functional.instance_norm(x, *_stats(x, rm, rv), w,
                                                                                  use_input_stats=False),
           [I((2, 3, 6)), _fixed((3,)), _positive((3,)), I((3,))], name="running-stats"),
    OpCase("group_norm", lambda m, x, w, b: m.nn.functional.group_norm(x, 2, w, b),
           [I((2, 6, 4, 5)), I((6,)), I((6,))]),
    OpCase("group_norm", lambda m, x: m.nn.functional.group_norm(x, 3, eps=1e-3), [I((3, 6), noncontig=True)],
           name="2d"),
    OpCase("group_norm", lambda m, x, w: m.nn.functional.group_norm(x, 1, w), [I((1, 5, 7)), I((5,))],
           name="one-group"),
    OpCase("group_norm", lambda m, x, w: m.nn.functional.group_norm(x, 4, w), [I((0, 4, 3)), I((4,))], name="empty",
           gradcheck=False),
    OpCase("rms_norm", lambda m, x, w: m.nn.functional.rms_norm(x, (4, 5), w), [I((2, 3, 4, 5)), I((4, 5))]),
    OpCase("rms_norm", lambda m, x: m.nn.functional.rms_norm(x, [7], eps=1e-3), [I((3, 7), noncontig=True)],
           name="eps"),
    OpCase("rms_norm", lambda m, x, w: m.nn.functional.rms_norm(x, (3,), w), [I((0, 3)), I((3,))], name="empty",
           gradcheck=False),
]
