"""Parity cases for engine/ops/loss.py: cross_entropy, nll_loss and the pointwise losses."""
import numpy as np

from harness import Input as I, OpCase

CASES = []


def _noweight(shape):
    """A class-weight / pos_weight input: positive, no gradient (PyTorch does not differentiate it)."""
    return I(shape, kind="positive", requires_grad=False)


def _ids(value):
    return I(value=np.asarray(value, dtype=np.int64), dtype="int64")


def _target(shape, c, **kw):
    return I(shape, "int64", "int", 0, c, **kw)


# ------------------------------------------------------------------ cross_entropy
def _ce(**kw):
    return lambda m, x, t, *w: m.nn.functional.cross_entropy(x, t, *w, **kw)


_T_IGN = np.array([1, -100, 3, 0, -100, 2])
_T_IGN_ALL = np.array([-100, -100])
for red in ("mean", "sum", "none"):
    CASES += [
        OpCase("cross_entropy", _ce(reduction=red), [I((5, 4)), _target((5,), 4)], name=f"{red}"),
        OpCase("cross_entropy", _ce(reduction=red), [I((6, 4)), _ids(_T_IGN)], name=f"{red}-ignore"),
        OpCase("cross_entropy", _ce(reduction=red), [I((5, 4)), _target((5,), 4), _noweight((4,))],
               name=f"{red}-weight"),
        OpCase("cross_entropy", _ce(reduction=red), [I((6, 4)), _ids(_T_IGN), _noweight((4,))],
               name=f"{red}-weight-ignore"),
        OpCase("cross_entropy", _ce(reduction=red, label_smoothing=0.2), [I((6, 4)), _ids(_T_IGN)],
               name=f"{red}-smooth-ignore"),
        OpCase("cross_entropy", _ce(reduction=red, label_smoothing=0.1),
               [I((6, 4)), _ids(_T_IGN), _noweight((4,))], name=f"{red}-smooth-weight-ignore"),
        OpCase("cross_entropy", _ce(reduction=red), [I((2, 3, 4)), _target((2, 4), 3)], name=f"{red}-3d"),
        OpCase("cross_entropy", _ce(reduction=red, label_smoothing=0.3),
               [I((2, 3, 2, 2)), _target((2, 2, 2), 3), _noweight((3,))], name=f"{red}-4d-smooth-weight"),
        OpCase("cross_entropy", _ce(reduction=red), [I((4, 5)), I((4, 5), kind="positive")], name=f"{red}-prob"),
        OpCase("cross_entropy", _ce(reduction=red, label_smoothing=0.2),
               [I((2, 3, 4)), I((2, 3, 4), kind="positive"), _noweight((3,))], name=f"{red}-prob-3d-smooth-weight"),
    ]
CASES += [
    OpCase("cross_entropy", _ce(), [I((5, 4), noncontig=True), _target((5,), 4)], name="noncontig"),
    OpCase("cross_entropy", _ce(ignore_index=2), [I((6, 4)), _target((6,), 4)], name="ignore-2"),
    OpCase("cross_entropy", _ce(), [I((3, 1)), _ids(np.array([0, 0, 0]))], name="one-class"),
    OpCase("cross_entropy", _ce(), [I((5, 4)), _target((5,), 4, noncontig=False)], name="F"),
    OpCase("cross_entropy", lambda m, x, t: m.nn.functional.cross_entropy(x * 40, t), [I((3, 6)), _target((3,), 6)],
           name="large-logits"),
    OpCase("cross_entropy", _ce(reduction="sum"), [I((0, 4)), _ids(np.zeros(0, dtype=np.int64))],
           name="empty-sum", gradcheck=False),
    # all targets ignored: 'mean' is 0/0 = nan in both libraries
    OpCase("cross_entropy", _ce(reduction="sum"), [I((2, 3)), _ids(_T_IGN_ALL)], name="all-ignored-sum"),
]


# ------------------------------------------------------------------ nll_loss
def _nll(**kw):
    return lambda m, x, t, *w: m.nn.functional.nll_loss(x, t, *w, **kw)


for red in ("mean", "sum", "none"):
    CASES += [
        OpCase("nll_loss", _nll(reduction=red), [I((5, 4)), _target((5,), 4)], name=red),
        OpCase("nll_loss", _nll(reduction=red), [I((6, 4)), _ids(_T_IGN), _noweight((4,))],
               name=f"{red}-weight-ignore"),
        OpCase("nll_loss", _nll(reduction=red), [I((2, 3, 2, 2)), _target((2, 2, 2), 3)], name=f"{red}-4d"),
    ]
CASES += [
    OpCase("nll_loss", _nll(), [I((4, 3), noncontig=True), _target((4,), 3)], name="noncontig"),
    OpCase("nll_loss", lambda m, x, t: m.nn.functional.nll_loss(m.log_softmax(x, 1), t), [I((4, 5)), _target((4,), 5)],
           name="composed"),
]


# ------------------------------------------------------------------ pointwise losses
def _loss(name, **kw):
    return lambda m, x, t, *w: getattr(m.nn.functional, name)(x, t, *w, **kw)


for red in ("mean", "sum", "none"):
    CASES += [
        OpCase("mse_loss", _loss("mse_loss", reduction=red), [I((3, 4)), I((3, 4))], name=red),
        OpCase("l1_loss", _loss("l1_loss", reduction=red), [I((3, 4)), I((3, 4))], name=red),
        OpCase("smooth_l1_loss", _loss("smooth_l1_loss", reduction=red), [I((3, 4)), I((3, 4))], name=red),
        OpCase("binary_cross_entropy", _loss("binary_cross_entropy", reduction=red),
               [I((3, 4), kind="uniform", low=0.05, high=0.95), I((3, 4), kind="uniform")], name=red),
        OpCase("binary_cross_entropy_with_logits", _loss("binary_cross_entropy_with_logits", reduction=red),
               [I((3, 4)), I((3, 4), kind="uniform")], name=red),
        OpCase("kl_div", _loss("kl_div", reduction=red), [I((3, 4)), I((3, 4), kind="positive")], name=red),
    ]
CASES += [
    OpCase("mse_loss", _loss("mse_loss"), [I((3, 4), noncontig=True), I((3, 4))], name="noncontig"),
    OpCase("mse_loss", _loss("mse_loss"), [I((2, 3, 4)), I((3, 4), requires_grad=False)], name="bcast"),
    OpCase("mse_loss", _loss("mse_loss"), [I((3, 4)), I((3, 4), requires_grad=False)], name="target-nograd"),
    OpCase("mse_loss", _loss("mse_loss", reduction="sum"), [I((0, 4)), I((0, 4))], name="empty", gradcheck=False),
    OpCase("l1_loss", _loss("l1_loss"), [I((3, 4), noncontig=True), I((4,))], name="noncontig-bcast"),
    OpCase("smooth_l1_loss", _loss("smooth_l1_loss", beta=0.5), [I((3, 4)), I((3, 4))], name="beta"),
    OpCase("smooth_l1_loss", _loss("smooth_l1_loss", beta=0.0), [I((3, 4)), I((3, 4))], name="beta0"),
    OpCase("binary_cross_entropy", _loss("binary_cross_entropy"),
           [I((3, 4), kind="uniform", low=0.05, high=0.95), I((3, 4), kind="uniform"), _noweight((4,))],
           name="weight"),
    OpCase("binary_cross_entropy_with_logits", _loss("binary_cross_entropy_with_logits"),
           [I((3, 4), noncontig=True), I((3, 4), kind="uniform"), _noweight((3, 4))], name="weight-noncontig"),
    OpCase("binary_cross_entropy_with_logits",
           lambda m, x, t, pw: m.nn.functional.binary_cross_entropy_with_logits(x, t, pos_weight=pw),
           [I((3, 4)), I((3, 4), kind="uniform"), _noweight((4,))], name="pos-weight"),
    OpCase("binary_cross_entropy_with_logits",
           lambda m, x, t, w, pw: m.nn.functional.binary_cross_entropy_with_logits(x * 30, t, w, reduction="sum",
                                                                                 pos_weight=pw),
           [I((2, 5)), I((2, 5), kind="uniform"), _noweight((5,)), _noweight((5,))], name="large-weight-pos"),
    OpCase("kl_div", _loss("kl_div", reduction="batchmean"), [I((3, 4)), I((3, 4), kind="positive")], name="batchmean"),
    OpCase("kl_div", _loss("kl_div", reduction="sum", log_target=True), [I((3, 4)), I((3, 4))], name="log-target"),
]

# ------------------------------------------------------------------ huber, margin ranking, cosine embedding
for red in ("mean", "sum", "none"):
    CASES += [
        OpCase("huber_loss", _loss("huber_loss", reduction=red), [I((3, 4)), I((3, 4))], name=red),
        OpCase("margin_ranking_loss",
               lambda m, a, b, t, red=red: m.nn.functional.margin_ranking_loss(a, b, t.sign(), 0.3, reduction=red),
               [I((6,)), I((6,)), I((6,), requires_grad=False)], name=red),
        OpCase("cosine_embedding_loss",
               lambda m, a, b, t, red=red: m.nn.functional.cosine_embedding_loss(a, b, t, 0.1, reduction=red),
               [I((4, 5)), I((4, 5)), I(value=np.array([1.0, -1.0, 1.0, -1.0]), requires_grad=False)], name=red),
    ]
CASES += [
    OpCase("huber_loss", _loss("huber_loss", delta=0.4), [I((2, 3, 4)), I((3, 4))], name="delta-bcast"),
    OpCase("huber_loss", _loss("huber_loss", delta=2.5), [I((3, 4), noncontig=True), I((3, 4))],
           name="delta-noncontig"),
    OpCase("huber_loss", _loss("huber_loss", reduction="sum"), [I((0, 4)), I((0, 4))], name="empty",
           gradcheck=False),
    OpCase("cosine_embedding_loss",  # (a 0-d target made inside: the harness stores inputs at least 1-d)
           lambda m, a, b: m.nn.functional.cosine_embedding_loss(a, b, m.tensor(-1.0, dtype=a.dtype), -0.2),
           [I((5,)), I((5,))], name="0d-target"),
    OpCase("kl_div", _loss("kl_div", reduction="batchmean", log_target=True), [I((2, 3, 4)), I((2, 3, 4))],
           name="batchmean-log-target-3d"),
    OpCase("binary_cross_entropy", _loss("binary_cross_entropy", reduction="sum"),
           [I((2, 5), "float64", kind="uniform", low=0.05, high=0.95), I((2, 5), "float64", kind="uniform"),
            _noweight((2, 5))], name="float64-weight"),
]
