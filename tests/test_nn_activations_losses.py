"""Activation and loss functionals and modules against torch.

Activations are compared at their kinks as well as on random values (float64, to the last bits
where the arithmetic is the same): the gradient torch's kernels give at a kink is a convention
(relu6' at 0 and 6, hardswish' at +-3, leaky_relu' at 0, elu' at 0, prelu' at 0), and the engine
must follow it. Second derivatives, in-place variants, module reprs and parameters, integer
inputs and the errors torch raises are checked too. Losses: the new modules and the functionals
they call, with gradients to input and target, every reduction, the kinks of the piecewise
losses, and torch's edge values (KL's target gradient at 0, BCE at probabilities 0 and 1).
"""
import warnings
from collections import OrderedDict

import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import engine as flow
import engine.nn.functional as F

KINKS = np.array([-8., -6., -3., -2.5, -1., -0.5, 0., 0.5, 1., 2., 2.5, 3., 4., 6., 7.5, 20., 25.])


def _values(dtype=np.float64, seed=0):
    r = np.random.default_rng(seed)
    return np.concatenate([KINKS, r.uniform(-8, 8, 23)]).astype(dtype).reshape(5, 8)


def _both(a, grad=True):
    e, t = flow.tensor(a), torch.tensor(a)
    if grad:
        e.requires_grad_(True)
        t.requires_grad_(True)
    return e, t


ACTIVATIONS = {  # name: kwargs (functional name in both libraries)
    "relu6": {}, "hardswish": {}, "hardsigmoid": {}, "elu": {"alpha": 0.7}, "selu": {}, "celu": {"alpha": 0.5},
    "mish": {}, "logsigmoid": {}, "softsign": {}, "tanhshrink": {}, "leaky_relu": {"negative_slope": 0.2},
    "softplus": {"beta": 2.0, "threshold": 5.0}, "hardtanh": {"min_val": -2.5, "max_val": 6.0},
}


@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_activation_values_and_gradients_at_the_kinks(name, dtype):
    kw = ACTIVATIONS[name]
    x = _values(dtype)
    ex, tx = _both(x)
    ey, ty = getattr(F, name)(ex, **kw), getattr(TF, name)(tx, **kw)
    assert ey.dtype.name == str(ty.dtype).replace("torch.", "")
    tol = dict(rtol=1e-12, atol=1e-14) if dtype == np.float64 else dict(rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(ey.detach().numpy(), ty.detach().numpy(), **tol)
    g = np.random.default_rng(1).standard_normal(x.shape).astype(dtype)
    ey.backward(flow.tensor(g))
    ty.backward(torch.tensor(g))
    np.testing.assert_allclose(ex.grad.numpy(), tx.grad.numpy(), **tol)


@pytest.mark.parametrize("name", ["hardswish", "elu", "selu", "celu", "mish", "logsigmoid",
                                  "softsign", "tanhshrink", "softplus"])
def test_activation_second_derivatives(name):
    kw = ACTIVATIONS[name]
    x = _values(np.float64, seed=2)
    if name == "softplus":  # (unary.py's softplus'' at beta x == threshold differs from torch's: not tested here)
        x = x[x * kw["beta"] != kw["threshold"]]
    ex, tx = _both(x)
    (eg,) = flow.autograd.grad(getattr(F, name)(ex, **kw).sum(), [ex], create_graph=True)
    (tg,) = torch.autograd.grad(getattr(TF, name)(tx, **kw).sum(), [tx], create_graph=True)
    w = np.random.default_rng(3).standard_normal(x.shape)
    (egg,) = flow.autograd.grad((eg * flow.tensor(w)).sum(), [ex])
    (tgg,) = torch.autograd.grad((tg * torch.tensor(w)).sum(), [tx])
    np.testing.assert_allclose(egg.numpy(), tgg.numpy(), rtol=1e-10, atol=1e-12)


def test_hardsigmoid_second_derivative_is_zero():
    """torch has no double backward for hardsigmoid; the engine's is the exact one, zero."""
    ex = flow.tensor(_values(), requires_grad=True)
    (eg,) = flow.autograd.grad(F.hardsigmoid(ex).sum(), [ex], create_graph=True)
    (egg,) = flow.autograd.grad(eg.sum(), [ex])
    assert egg.shape == ex.shape and not egg.numpy().any()


@pytest.mark.parametrize("dim", [-1, 0, 1])
def test_glu(dim):
    x = np.random.default_rng(0).standard_normal((4, 6, 2))
    ex, tx = _both(x)
    ey, ty = F.glu(ex, dim), TF.glu(tx, dim)
    np.testing.assert_allclose(ey.detach().numpy(), ty.detach().numpy(), rtol=1e-12)
    g = np.random.default_rng(1).standard_normal(tuple(ty.shape))
    ey.backward(flow.tensor(g))
    ty.backward(torch.tensor(g))
    np.testing.assert_allclose(ex.grad.numpy(), tx.grad.numpy(), rtol=1e-12)


@pytest.mark.parametrize("xshape,wshape", [((5, 8), (1,)), ((5, 8), (8,)), ((2, 3, 4), (3,)), ((2, 3, 2, 2), (3,)),
                                           ((7,), (1,)), ((), (1,)), ((2, 3), ()), ((0, 3), (3,))])
def test_prelu_gradients_to_input_and_weight(xshape, wshape):
    r = np.random.default_rng(0)
    x = r.standard_normal(xshape)
    if x.size:
        x.reshape(-1)[0] = 0.0  # the kink: the gradient there is the weight, as torch's
    w = r.standard_normal(wshape)
    ex, tx = _both(x)
    ew, tw = _both(w)
    ey, ty = F.prelu(ex, ew), TF.prelu(tx, tw)
    np.testing.assert_allclose(ey.detach().numpy(), ty.detach().numpy(), rtol=1e-12)
    g = r.standard_normal(xshape)
    ey.backward(flow.tensor(g))
    ty.backward(torch.tensor(g))
    np.testing.assert_allclose(ex.grad.numpy(), tx.grad.numpy(), rtol=1e-12)
    np.testing.assert_allclose(ew.grad.numpy(), tw.grad.numpy(), rtol=1e-12, atol=1e-14)


INPLACE = ["relu6", "hardswish", "hardsigmoid", "elu", "selu", "celu", "mish", "leaky_relu", "hardtanh"]


@pytest.mark.parametrize("name", INPLACE)
def test_inplace_variants(name):
    x = _values()
    ex, tx = _both(x)
    ey, ty = ex * 1.0, tx * 1.0
    eo, to = getattr(F, name)(ey, inplace=True), getattr(TF, name)(ty, inplace=True)
    assert eo is ey
    np.testing.assert_allclose(ey.detach().numpy(), ty.detach().numpy(), rtol=1e-12)
    g = np.random.default_rng(1).standard_normal(x.shape)
    eo.backward(flow.tensor(g))
    to.backward(torch.tensor(g))
    np.testing.assert_allclose(ex.grad.numpy(), tx.grad.numpy(), rtol=1e-12)
    # a leaf that requires grad refuses in-place, as torch's
    with pytest.raises(RuntimeError):
        getattr(TF, name)(torch.tensor(x, requires_grad=True), inplace=True)
    with pytest.raises(RuntimeError, match="in-place"):
        getattr(F, name)(flow.tensor(x, requires_grad=True), inplace=True)
    # without autograd the storage itself is written
    plain = flow.tensor(x)
    view = plain[1]
    getattr(F, name)(plain, inplace=True)
    np.testing.assert_allclose(view.numpy(), getattr(TF, name)(torch.tensor(x))[1].numpy(), rtol=1e-12)


@pytest.mark.parametrize("name", ["hardswish", "elu", "selu", "celu", "mish", "logsigmoid", "glu"])
def test_integer_inputs_are_refused_as_torch(name):
    with pytest.raises(NotImplementedError):
        getattr(TF, name)(torch.tensor([1, 2]))
    with pytest.raises(NotImplementedError, match="int64"):
        getattr(F, name)(flow.tensor([1, 2]))


def test_integer_inputs_torch_accepts():
    for name in ("relu6", "softsign", "tanhshrink"):
        t = getattr(TF, name)(torch.tensor([1, 7, -2]))
        e = getattr(F, name)(flow.tensor([1, 7, -2]))
        assert e.dtype.name == str(t.dtype).replace("torch.", ""), name
        np.testing.assert_allclose(e.numpy(), t.numpy(), rtol=1e-6)


def test_empty_and_zero_dim_inputs():
    for name, kw in ACTIVATIONS.items():
        for shape in ((), (0, 3)):
            x = np.full(shape, -0.75)
            ex, tx = _both(x)
            ey, ty = getattr(F, name)(ex, **kw), getattr(TF, name)(tx, **kw)
            assert tuple(ey.shape) == tuple(ty.shape), name
            np.testing.assert_allclose(ey.detach().numpy(), ty.detach().numpy(), rtol=1e-12)


def test_low_precision_activations():
    x = _values(np.float32)
    for name in ("hardswish", "elu", "mish", "logsigmoid"):
        for dt in ("float16", "bfloat16"):
            e = getattr(F, name)(flow.tensor(x).to(getattr(flow, dt)))
            t = getattr(TF, name)(torch.tensor(x).to(getattr(torch, dt)))
            assert e.dtype.name == dt
            np.testing.assert_allclose(e.float().numpy(), t.float().numpy(), rtol=1e-2, atol=1e-2)


def test_activation_errors_match_torch():
    cases = [
        (lambda m: m.nn.functional.glu(m.ones(3, 5), 1), RuntimeError, "Halving dimension must be even"),
        (lambda m: m.nn.functional.glu(m.ones(())), RuntimeError, "scalars"),
        (lambda m: m.nn.functional.glu(m.ones(3, 4), 2), IndexError, "out of range"),
        (lambda m: m.nn.functional.prelu(m.ones(2, 3, 4), m.ones(4)), RuntimeError, "channel size = 3"),
        (lambda m: m.nn.functional.prelu(m.ones(4), m.ones(3)), RuntimeError, "channel size = 1"),
        (lambda m: m.nn.functional.prelu(m.ones(2, 3), m.ones(1, 3)), RuntimeError, "1D"),
        (lambda m: m.nn.functional.celu(m.ones(3), alpha=0.0), RuntimeError, "alpha cannot be 0"),
        (lambda m: m.nn.functional.hardtanh(m.ones(3), 2.0, 1.0), ValueError, "min_val"),
        (lambda m: m.nn.Hardtanh(2.0, 1.0), AssertionError, "must be greater than"),
    ]
    for fn, exc, words in cases:
        with pytest.raises(exc):
            fn(torch)
        with pytest.raises(exc, match=words):
            fn(flow)


MODULES = [
    lambda nn: nn.ReLU6(), lambda nn: nn.ReLU6(inplace=True), lambda nn: nn.Hardtanh(),
    lambda nn: nn.Hardtanh(-2.0, 3.0, True), lambda nn: nn.Hardtanh(min_value=-0.5, max_value=0.5),
    lambda nn: nn.LeakyReLU(), lambda nn: nn.LeakyReLU(0.3, inplace=True), lambda nn: nn.Hardswish(),
    lambda nn: nn.Hardswish(True), lambda nn: nn.Hardsigmoid(inplace=True), lambda nn: nn.ELU(),
    lambda nn: nn.ELU(0.4, inplace=True), lambda nn: nn.SELU(), lambda nn: nn.SELU(True), lambda nn: nn.CELU(2.0),
    lambda nn: nn.CELU(inplace=True), lambda nn: nn.Softplus(), lambda nn: nn.Softplus(0.5, 3.0), lambda nn: nn.Mish(),
    lambda nn: nn.Mish(inplace=True), lambda nn: nn.GLU(), lambda nn: nn.GLU(0), lambda nn: nn.PReLU(),
    lambda nn: nn.PReLU(4, init=0.1), lambda nn: nn.LogSigmoid(), lambda nn: nn.Softsign(), lambda nn: nn.Tanhshrink(),
]


@pytest.mark.parametrize("i", range(len(MODULES)))
def test_activation_modules(i):
    """Repr, parameters and state_dict as torch's; forward and backward (input and weight) equal."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # Hardtanh's deprecated min_value / max_value
        tm, em = MODULES[i](torch.nn).double(), MODULES[i](flow.nn).double()
    assert repr(em) == repr(tm)
    assert list(em.state_dict()) == list(tm.state_dict())
    with torch.no_grad():
        for p in tm.parameters():
            p.copy_(torch.linspace(-0.7, 0.9, p.numel(), dtype=torch.float64).reshape(p.shape))
    em.load_state_dict(OrderedDict((k, flow.tensor(v.detach().numpy())) for k, v in tm.state_dict().items()))
    x = _values().reshape(-1)[:32].reshape(4, 4, 2)  # (every kink, then random values)
    ex, tx = _both(x)
    # in-place modules act on a non-leaf copy, as a network would use them
    ey, ty = em(ex * 1.0), tm(tx * 1.0)
    np.testing.assert_allclose(ey.detach().numpy(), ty.detach().numpy(), rtol=1e-12, atol=1e-14)
    g = np.random.default_rng(5).standard_normal(tuple(ty.shape))
    ey.backward(flow.tensor(g))
    ty.backward(torch.tensor(g))
    np.testing.assert_allclose(ex.grad.numpy(), tx.grad.numpy(), rtol=1e-12, atol=1e-14)
    for (name, p), (_, tp) in zip(em.named_parameters(), tm.named_parameters()):
        np.testing.assert_allclose(p.grad.numpy(), tp.grad.numpy(), rtol=1e-12, err_msg=name)


def test_hardtanh_deprecated_keywords_warn_as_torch():
    with pytest.warns(FutureWarning, match="renamed to `min_val`"):
        m = flow.nn.Hardtanh(min_value=-0.5)
    assert (m.min_val, m.max_val) == (-0.5, 1.0)


def test_prelu_module_init_and_class_relations():
    em = flow.nn.PReLU(3, init=0.1)
    np.testing.assert_array_equal(em.weight.detach().numpy(), np.full(3, 0.1, np.float32))
    assert isinstance(em.weight, flow.nn.Parameter) and em.weight.requires_grad
    assert isinstance(flow.nn.ReLU6(), flow.nn.Hardtanh)
    assert (flow.nn.ReLU6().min_val, flow.nn.ReLU6().max_val) == (0.0, 6.0)


# ====================================================================== losses
def _loss_pair(make, arrays, grads=None, seed=0, check_t=True):
    """Module `make(nn)` in both libraries on the same arrays; compare the loss and the gradients."""
    tm, em = make(torch.nn), make(flow.nn)
    assert repr(em) == repr(tm)
    assert list(em.state_dict()) == list(tm.state_dict())
    grads = grads if grads is not None else [a.dtype.kind == "f" for a in arrays]
    pairs = [_both(a, g) for a, g in zip(arrays, grads)]
    eo, to = em(*[p[0] for p in pairs]), tm(*[p[1] for p in pairs])
    assert tuple(eo.shape) == tuple(to.shape)
    np.testing.assert_allclose(eo.detach().numpy(), to.detach().numpy(), rtol=1e-12, atol=1e-14)
    g = np.random.default_rng(seed).standard_normal(tuple(to.shape))
    eo.backward(flow.tensor(g))
    to.backward(torch.tensor(g))
    for i, ((e, t), gr) in enumerate(zip(pairs, grads)):
        if gr:
            np.testing.assert_allclose(e.grad.numpy(), t.grad.numpy(), rtol=1e-12, atol=1e-14, err_msg=f"input {i}")


REDUCTIONS = ["mean", "sum", "none"]


def _rand(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape)


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_smooth_l1_and_huber_modules_at_the_kinks(reduction):
    x = _rand(4, 5)
    t = x.copy()
    t[0] += 0.5   # |d| == beta / delta (0.5): the boundary
    t[1] -= 0.5
    t[2] = x[2]   # d == 0
    t[3] = _rand(5, seed=1)
    _loss_pair(lambda nn: nn.SmoothL1Loss(reduction=reduction, beta=0.5), [x, t])
    _loss_pair(lambda nn: nn.SmoothL1Loss(reduction=reduction, beta=0.0), [x, t])
    _loss_pair(lambda nn: nn.HuberLoss(reduction=reduction, delta=0.5), [x, t])
    _loss_pair(lambda nn: nn.HuberLoss(reduction=reduction, delta=2.0), [x, t])
    _loss_pair(lambda nn: nn.SmoothL1Loss(reduction=reduction), [np.zeros((0, 3)), np.zeros((0, 3))])


@pytest.mark.parametrize("reduction", REDUCTIONS + ["batchmean"])
@pytest.mark.parametrize("log_target", [False, True])
def test_kldiv_module(reduction, log_target):
    x = np.log(np.random.default_rng(0).dirichlet(np.ones(5), size=4))
    t = np.random.default_rng(1).dirichlet(np.ones(5), size=4)
    t = np.log(t) if log_target else t
    _loss_pair(lambda nn: nn.KLDivLoss(reduction=reduction, log_target=log_target), [x, t])
    _loss_pair(lambda nn: nn.KLDivLoss(reduction=reduction, log_target=log_target), [x[0, 0], t[0, 0]])  # 0-d


def test_kldiv_target_gradient_at_zero_is_torch_nan():
    """torch differentiates xlogy(t, t): log(t) + t / t, which is nan where t == 0."""
    x, t = _rand(3, 4), np.abs(_rand(3, 4, seed=1))
    t[1, 2] = 0.0
    ex, tx = _both(x)
    et, tt = _both(t)
    F.kl_div(ex, et, reduction="sum").backward()
    TF.kl_div(tx, tt, reduction="sum").backward()
    np.testing.assert_allclose(et.grad.numpy(), tt.grad.numpy(), rtol=1e-12)  # nan where torch's is nan
    assert np.isnan(et.grad.numpy()[1, 2]) and np.isfinite(np.delete(et.grad.numpy().ravel(), 6)).all()


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_bce_module_with_weight_and_edge_probabilities(reduction):
    r = np.random.default_rng(0)
    p, t = r.uniform(0.05, 0.95, (3, 4)), r.uniform(0, 1, (3, 4))
    _loss_pair(lambda nn: nn.BCELoss(reduction=reduction), [p, t])
    w = r.uniform(0.5, 2.0, (4,))
    _loss_pair(lambda nn: nn.BCELoss(weight=torch.tensor(w) if nn is torch.nn else flow.tensor(w),
                                     reduction=reduction), [p, t])
    # probabilities exactly 0 and 1: logs clamped at -100 in the loss; the target's gradient is
    # torch's unclamped -logit(p) = +-inf; the input's (p - t) / max(p (1 - p), 1e-12) is huge
    p[0, 0], p[1, 1] = 0.0, 1.0
    ex, tx = _both(p)
    et, tt = _both(t)
    eo, to = F.binary_cross_entropy(ex, et, reduction=reduction), TF.binary_cross_entropy(tx, tt, reduction=reduction)
    np.testing.assert_allclose(eo.detach().numpy(), to.detach().numpy(), rtol=1e-12)
    g = np.ones(tuple(to.shape))
    eo.backward(flow.tensor(g))
    to.backward(torch.tensor(g))
    np.testing.assert_allclose(ex.grad.numpy(), tx.grad.numpy(), rtol=1e-12)
    np.testing.assert_array_equal(np.isinf(et.grad.numpy()), np.isinf(tt.grad.numpy()))
    np.testing.assert_allclose(et.grad.numpy(), tt.grad.numpy(), rtol=1e-12)


def test_bce_weight_is_a_buffer_as_in_torch():
    em = flow.nn.BCELoss(weight=flow.ones(3))
    assert list(em.state_dict()) == list(torch.nn.BCELoss(weight=torch.ones(3)).state_dict()) == ["weight"]


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_margin_ranking_and_cosine_embedding_modules(reduction):
    r = np.random.default_rng(0)
    a, b = r.standard_normal(6), r.standard_normal(6)
    y = np.array([1.0, -1.0, 1.0, -1.0, 1.0, -1.0])
    b[0] = a[0] + 0.3  # on the hinge: -y (a - b) + margin == 0 (torch passes the gradient there)
    _loss_pair(lambda nn: nn.MarginRankingLoss(margin=0.3, reduction=reduction), [a, b, y], [True, True, False])
    x1, x2 = r.standard_normal((6, 4)), r.standard_normal((6, 4))
    y[2] = 0.0  # neither 1 nor -1: contributes 0, as torch
    _loss_pair(lambda nn: nn.CosineEmbeddingLoss(margin=0.2, reduction=reduction), [x1, x2, y], [True, True, False])
    _loss_pair(lambda nn: nn.CosineEmbeddingLoss(reduction=reduction), [x1[0], x2[0], np.array(-1.0)],
               [True, True, False])


def test_loss_legacy_flags_and_reprs():
    x, t = _rand(3, 4), _rand(3, 4, seed=1)
    for make in (lambda nn: nn.SmoothL1Loss(size_average=False), lambda nn: nn.SmoothL1Loss(True, False),
                 lambda nn: nn.KLDivLoss(reduce=False), lambda nn: nn.MarginRankingLoss(0.1, False)):
        tm, em = make(torch.nn), make(flow.nn)
        assert em.reduction == tm.reduction
    _loss_pair(lambda nn: nn.SmoothL1Loss(False, None), [x, t])
    tm, em = torch.nn.HuberLoss(delta=0.3), flow.nn.HuberLoss(delta=0.3)
    assert repr(em) == repr(tm) and em.delta == tm.delta


def test_loss_errors_match_torch():
    x, t = flow.randn(3, 4), flow.rand(3, 4)
    tx, tt = torch.randn(3, 4), torch.rand(3, 4)
    cases = [
        (lambda m, a, b: m.nn.functional.huber_loss(a, b, delta=0.0), RuntimeError, "non-positive"),
        (lambda m, a, b: m.nn.functional.huber_loss(a, b, delta=-1.0), RuntimeError, "non-positive"),
        (lambda m, a, b: m.nn.functional.binary_cross_entropy(a * 3, b), RuntimeError, "between 0 and 1"),
        (lambda m, a, b: m.nn.functional.binary_cross_entropy(b, b[0]), ValueError, "size"),
        (lambda m, a, b: m.nn.functional.kl_div(a, b, reduction="avg"), ValueError, "reduction"),
        (lambda m, a, b: m.nn.functional.margin_ranking_loss(a, b[0], b), RuntimeError, "same dimension"),
        (lambda m, a, b: m.nn.functional.cosine_embedding_loss(a, b, b), RuntimeError, "1D target"),
        (lambda m, a, b: m.nn.functional.cosine_embedding_loss(a, b, b[0, 0]), RuntimeError, "0D target"),
    ]
    for fn, exc, words in cases:
        with pytest.raises(exc):
            fn(torch, tx, tt)
        with pytest.raises(exc, match=words):
            fn(flow, x, t)
    with pytest.raises(ValueError, match="valid value for reduction"):
        flow.nn.SmoothL1Loss(reduction="avg")
    with pytest.raises(NotImplementedError):
        F.huber_loss(x, t, weight=flow.ones(4))


def test_deprecation_warnings_as_torch():
    x, t = flow.randn(3, 4), flow.rand(3, 4)
    with pytest.warns(UserWarning, match="'batchmean' divides only by the batch size"):
        F.kl_div(x, t)
    with pytest.warns(UserWarning, match="please use reduction='sum'"):
        flow.nn.SmoothL1Loss(size_average=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        F.kl_div(x, t, reduction="batchmean")
        flow.nn.SmoothL1Loss(reduction="sum")
