"""engine.distributions.Independent and MultivariateNormal against torch.distributions on shared
float64 parameters: log_prob, entropy, mean, variance, the derived matrices, shapes, expand, and
the gradients of log_prob / entropy / rsample with respect to every parameter; validation errors;
sample statistics."""
import inspect
import os

import numpy as np
import pytest
import torch

import engine as flow

DEVICE = os.environ.get("ENGINE_TEST_DEVICE", "cpu")
RNG = np.random.default_rng(7)
TOL = dict(rtol=1e-10, atol=1e-11)


def _spd(n, batch=()):
    a = RNG.standard_normal(batch + (n, n))
    return a @ np.swapaxes(a, -1, -2) + n * np.eye(n)


def _tril(n, batch=()):
    L = np.tril(RNG.standard_normal(batch + (n, n)), -1)
    return L + np.eye(n) * RNG.uniform(0.5, 1.5, batch + (n,))[..., None]


def _pair(*arrays):
    return ([torch.tensor(a, requires_grad=True) for a in arrays],
            [flow.tensor(a, requires_grad=True, device=DEVICE) for a in arrays])


def _np(t):
    return t.detach().cpu().numpy()


def _close(e, t, what="", **tol):
    np.testing.assert_allclose(_np(e), _np(t), err_msg=what, **(tol or TOL))


MVN_CASES = {
    # name: (loc shape, matrix kind, matrix batch, value shape)
    "cov": ((3,), "covariance_matrix", (), (5, 3)),
    "prec": ((3,), "precision_matrix", (), (5, 3)),
    "tril": ((3,), "scale_tril", (), (5, 3)),
    "cov-batch": ((2, 4), "covariance_matrix", (2,), (3, 2, 4)),
    "prec-bcast-loc": ((2, 3), "precision_matrix", (), (2, 3)),
    "tril-bcast-matrix": ((3,), "scale_tril", (2,), (4, 1, 3)),
}


def _mvn_pair(name):
    loc_shape, kind, mbatch, value_shape = MVN_CASES[name]
    n = loc_shape[-1]
    mat = _tril(n, mbatch) if kind == "scale_tril" else _spd(n, mbatch)
    (tl, tm), (el, em) = _pair(RNG.standard_normal(loc_shape), mat)
    t = torch.distributions.MultivariateNormal(tl, **{kind: tm})
    e = flow.distributions.MultivariateNormal(el, **{kind: em})
    return t, e, (tl, tm), (el, em), RNG.standard_normal(value_shape)


@pytest.mark.parametrize("name", sorted(MVN_CASES))
def test_mvn_matches_torch(name):
    t, e, tp, ep, value = _mvn_pair(name)
    assert tuple(e.batch_shape) == tuple(t.batch_shape) and tuple(e.event_shape) == tuple(t.event_shape)
    lp_t, lp_e = t.log_prob(torch.tensor(value)), e.log_prob(flow.tensor(value, device=DEVICE))
    _close(lp_e, lp_t, "log_prob")
    _close(e.entropy(), t.entropy(), "entropy")
    for attr in ("mean", "variance", "stddev", "mode", "scale_tril", "covariance_matrix", "precision_matrix"):
        _close(getattr(e, attr), getattr(t, attr), attr)
    (lp_t.sum() + 2 * t.entropy().sum()).backward()
    (lp_e.sum() + 2 * e.entropy().sum()).backward()
    for a, b, what in zip(tp, ep, ("loc", "matrix")):
        _close(b.grad, a.grad, f"grad {what}")


@pytest.mark.parametrize("name", ["cov", "prec", "cov-batch"])
def test_mvn_derived_matrix_gradients_match_torch(name):
    t, e, tp, ep, _ = _mvn_pair(name)
    w = RNG.standard_normal(tuple(t.covariance_matrix.shape))
    ((t.covariance_matrix * torch.tensor(w)).sum() + (t.precision_matrix * torch.tensor(w)).sum()
     + t.variance.sum()).backward()
    ((e.covariance_matrix * flow.tensor(w)).sum() + (e.precision_matrix * flow.tensor(w)).sum()
     + e.variance.sum()).backward()
    _close(ep[1].grad, tp[1].grad, "matrix grad")


def test_mvn_rsample_gradient_and_statistics():
    t, e, tp, ep, _ = _mvn_pair("cov")
    flow.manual_seed(0)
    draws = e.rsample((20000,))
    assert tuple(draws.shape) == (20000, 3) and draws.requires_grad
    x = _np(draws)
    np.testing.assert_allclose(x.mean(0), _np(t.mean), atol=0.05)
    np.testing.assert_allclose(np.cov(x.T), _np(t.covariance_matrix), rtol=0.05, atol=0.15)
    # d/dloc of mean(draws) is 1/3 per coordinate... per element of loc: (1/n_draws) * n_draws / 3
    draws.mean().backward()
    np.testing.assert_allclose(_np(ep[0].grad), np.full(3, 1 / 3), rtol=1e-12)
    # d/dcov of sum(L @ eps) for a fixed eps, vs torch with the same eps through its factor
    eps = np.random.default_rng(1).standard_normal((4, 3))
    tcov = torch.tensor(_np(ep[1]), requires_grad=True)
    ecov = flow.tensor(_np(ep[1]), requires_grad=True)
    (torch.linalg.cholesky(tcov) @ torch.tensor(eps).T).sin().sum().backward()
    (flow.distributions.MultivariateNormal(flow.zeros(3, dtype=flow.float64), ecov)._unbroadcasted_scale_tril
     @ flow.tensor(eps).T).sin().sum().backward()
    _close(ecov.grad, tcov.grad, "cholesky grad")
    s = e.sample((2, 5))
    assert tuple(s.shape) == (2, 5, 3) and not s.requires_grad


def test_mvn_expand_matches_torch():
    for name in ("cov", "tril-bcast-matrix", "prec"):
        t, e, _, _, _ = _mvn_pair(name)
        shape = (4,) + tuple(t.batch_shape) if name != "tril-bcast-matrix" else (3, 2)
        te, ee = t.expand(torch.Size(shape)), e.expand(shape)
        assert tuple(ee.batch_shape) == tuple(te.batch_shape) and tuple(ee.event_shape) == tuple(te.event_shape)
        value = RNG.standard_normal(shape + (3,))
        _close(ee.log_prob(flow.tensor(value)), te.log_prob(torch.tensor(value)), name)
        _close(ee.entropy(), te.entropy(), name)
        for attr in ("covariance_matrix", "scale_tril", "precision_matrix", "variance", "mean"):
            _close(getattr(ee, attr), getattr(te, attr), f"{name} {attr}")


def test_mvn_arguments_are_validated_as_in_torch():
    MVN = flow.distributions.MultivariateNormal
    loc = flow.zeros(3, dtype=flow.float64)
    eye = flow.eye(3, dtype=flow.float64)
    with pytest.raises(ValueError, match="Exactly one of"):
        MVN(loc)
    with pytest.raises(ValueError, match="Exactly one of"):
        MVN(loc, eye, scale_tril=eye)
    with pytest.raises(ValueError, match="loc must be at least one-dimensional"):
        MVN(flow.tensor(0.0, dtype=flow.float64), eye)
    with pytest.raises(ValueError, match="covariance_matrix must be at least two-dimensional"):
        MVN(loc, flow.ones(3, dtype=flow.float64))
    with pytest.raises(ValueError, match="PositiveDefinite"):
        MVN(loc, -eye)
    with pytest.raises(ValueError, match="PositiveDefinite"):
        MVN(loc, precision_matrix=eye + flow.triu(flow.ones(3, 3, dtype=flow.float64), 1))  # not symmetric
    with pytest.raises(ValueError, match="LowerCholesky"):
        MVN(loc, scale_tril=flow.ones(3, 3, dtype=flow.float64))
    with pytest.raises(ValueError, match="right-most size"):
        MVN(loc, eye).log_prob(flow.zeros(4, dtype=flow.float64))
    with pytest.raises(RuntimeError):  # broadcast of loc and matrix batch dims
        MVN(flow.zeros(2, 3, dtype=flow.float64), flow.eye(3, dtype=flow.float64).expand(4, 3, 3))
    MVN(loc, -eye * 0 + eye, validate_args=False)
    ours, theirs = (inspect.signature(c) for c in (MVN, torch.distributions.MultivariateNormal))
    assert list(ours.parameters) == list(theirs.parameters)
    assert [p.default for p in ours.parameters.values()] == [p.default for p in theirs.parameters.values()]


# ------------------------------------------------------------------ Independent
def _normal(lib, loc, scale):
    return lib.distributions.Normal(loc, scale)


def _bernoulli(lib, logits):
    return lib.distributions.Bernoulli(logits=logits)


def _categorical(lib, logits):
    return lib.distributions.Categorical(logits=logits)


IND_CASES = {
    # name: (base maker, parameter arrays, reinterpreted dims, value maker)
    "normal-1": (_normal, (RNG.standard_normal((2, 3, 4)), RNG.uniform(0.5, 2, (2, 3, 4))), 1,
                 lambda: RNG.standard_normal((5, 2, 3, 4))),
    "normal-2": (_normal, (RNG.standard_normal((2, 3, 4)), RNG.uniform(0.5, 2, (2, 3, 4))), 2,
                 lambda: RNG.standard_normal((2, 3, 4))),
    "normal-0": (_normal, (RNG.standard_normal((3,)), RNG.uniform(0.5, 2, (3,))), 0,
                 lambda: RNG.standard_normal((3,))),
    "bernoulli-1": (_bernoulli, (RNG.standard_normal((3, 4)),), 1, lambda: RNG.integers(0, 2, (3, 4)) * 1.0),
    "categorical-1": (_categorical, (RNG.standard_normal((2, 3, 5)),), 1, lambda: RNG.integers(0, 5, (4, 2, 3))),
    "mvn-1": (lambda lib, loc, tril: lib.distributions.MultivariateNormal(loc, scale_tril=tril),
              (RNG.standard_normal((2, 3)), _tril(3, (2,))), 1, lambda: RNG.standard_normal((4, 2, 3))),
}


@pytest.mark.parametrize("name", sorted(IND_CASES))
def test_independent_matches_torch(name):
    make, params, n, values = IND_CASES[name]
    tp, ep = _pair(*params)
    t = torch.distributions.Independent(make(torch, *tp), n)
    e = flow.distributions.Independent(make(flow, *ep), n)
    assert tuple(e.batch_shape) == tuple(t.batch_shape) and tuple(e.event_shape) == tuple(t.event_shape)
    assert e.has_rsample == t.has_rsample and e.has_enumerate_support == t.has_enumerate_support
    v = values()
    categorical = name.startswith("categorical")
    tv = torch.tensor(v, dtype=torch.int64 if categorical else torch.float64)
    ev = flow.tensor(v, dtype=flow.int64 if categorical else flow.float64, device=DEVICE)
    lp_t, lp_e = t.log_prob(tv), e.log_prob(ev)
    _close(lp_e, lp_t, "log_prob")
    _close(e.entropy(), t.entropy(), "entropy")
    if not categorical:
        for attr in ("mean", "variance"):
            _close(getattr(e, attr), getattr(t, attr), attr)
    (lp_t.sum() + t.entropy().sum()).backward()
    (lp_e.sum() + e.entropy().sum()).backward()
    for a, b in zip(tp, ep):
        _close(b.grad, a.grad, "grad")
    # expand: a new leading batch dim
    shape = (2,) + tuple(t.batch_shape)
    te, ee = t.expand(torch.Size(shape)), e.expand(shape)
    assert tuple(ee.batch_shape) == tuple(te.batch_shape) and tuple(ee.event_shape) == tuple(te.event_shape)
    lead = (0,) * (len(v.shape) - len(t.batch_shape) - len(t.event_shape))  # one value of the batch's shape
    _close(ee.log_prob(ev[lead]), te.log_prob(tv[lead]), "expanded log_prob")
    _close(ee.entropy(), te.entropy(), "expanded entropy")
    flow.manual_seed(0)
    s = e.sample((3,))
    assert tuple(s.shape) == (3,) + tuple(t.batch_shape) + tuple(t.event_shape)


def test_independent_rsample_and_errors():
    (tl, ts), (el, es) = _pair(RNG.standard_normal((2, 3)), RNG.uniform(0.5, 2, (2, 3)))
    e = flow.distributions.Independent(flow.distributions.Normal(el, es), 1)
    flow.manual_seed(0)
    draw = e.rsample((4,))
    assert tuple(draw.shape) == (4, 2, 3) and draw.requires_grad
    draw.sum().backward()
    np.testing.assert_allclose(_np(el.grad), np.full((2, 3), 4.0))
    with pytest.raises(ValueError, match="reinterpreted_batch_ndims <= len"):
        flow.distributions.Independent(flow.distributions.Normal(el, es), 3)
    cat = flow.distributions.Independent(flow.distributions.Categorical(logits=el), 1)
    with pytest.raises(NotImplementedError, match="cartesian product"):
        cat.enumerate_support()
    assert list(inspect.signature(flow.distributions.Independent).parameters) == \
        list(inspect.signature(torch.distributions.Independent).parameters)
