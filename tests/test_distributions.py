"""engine.distributions against torch.distributions: log_prob, entropy, cdf, moments and KL on
shared parameters (float64), gradients of log_prob / entropy / rsample, sample shapes and
statistics, and argument validation. Device-aware: ENGINE_TEST_DEVICE=cuda puts ours on CuPy."""
import os

import numpy as np
import pytest
import torch

import engine as flow

DEVICE = os.environ.get("ENGINE_TEST_DEVICE", "cpu")  # "cuda": our side on CuPy

RNG = np.random.default_rng(0)
LOC, SCALE = RNG.standard_normal((3, 4)), RNG.uniform(0.5, 2.0, (3, 4))
LOGITS = RNG.standard_normal((3, 5))
PROBS = RNG.uniform(0.05, 0.95, (3, 4))


def _both(make, *params):
    """(torch distribution, ours, torch params, our params) on the same float64 values."""
    tp = [torch.tensor(p, requires_grad=True) for p in params]
    ep = [flow.tensor(p, requires_grad=True, device=DEVICE) for p in params]
    return make(torch.distributions, *tp), make(flow.distributions, *ep), tp, ep


CASES = {
    "normal": (lambda d, loc, scale: d.Normal(loc, scale), (LOC, SCALE), lambda: RNG.standard_normal((2, 3, 4))),
    "uniform": (lambda d, lo, w: d.Uniform(lo, lo + w), (LOC, SCALE),
                lambda: LOC + SCALE * RNG.uniform(0, 1, (2, 3, 4))),
    "bernoulli-probs": (lambda d, p: d.Bernoulli(probs=p), (PROBS,), lambda: RNG.integers(0, 2, (2, 3, 4)) * 1.0),
    "bernoulli-logits": (lambda d, lg: d.Bernoulli(logits=lg), (LOC,), lambda: RNG.integers(0, 2, (2, 3, 4)) * 1.0),
    "categorical-logits": (lambda d, lg: d.Categorical(logits=lg), (LOGITS,), lambda: RNG.integers(0, 5, (2, 3))),
    "categorical-probs": (lambda d, p: d.Categorical(probs=p), (np.abs(LOGITS),), lambda: RNG.integers(0, 5, (3,))),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_log_prob_entropy_and_their_gradients_match_torch(name):
    make, params, values = CASES[name]
    t, e, tp, ep = _both(make, *params)
    v = values()
    tv = torch.tensor(v, dtype=torch.int64 if "categorical" in name else torch.float64)
    lp_t, lp_e = t.log_prob(tv), e.log_prob(flow.tensor(v, dtype=flow.int64 if "categorical" in name else None, device=DEVICE))
    np.testing.assert_allclose(lp_e.detach().cpu().cpu().numpy(), lp_t.detach().cpu().cpu().numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(e.entropy().detach().cpu().cpu().numpy(), t.entropy().detach().cpu().cpu().numpy(), rtol=1e-12, atol=1e-12)
    (lp_t.sum() + t.entropy().sum()).backward()
    (lp_e.sum() + e.entropy().sum()).backward()
    for a, b in zip(tp, ep):
        np.testing.assert_allclose(b.grad.cpu().cpu().numpy(), a.grad.cpu().cpu().numpy(), rtol=1e-10, atol=1e-12)
    assert tuple(e.batch_shape) == tuple(t.batch_shape) and tuple(e.event_shape) == tuple(t.event_shape)
    for attr in ("mean", "variance"):
        if "categorical" not in name:
            np.testing.assert_allclose(getattr(e, attr).detach().cpu().cpu().numpy(), getattr(t, attr).detach().cpu().cpu().numpy(),
                                       rtol=1e-12)
    if hasattr(t, "probs"):
        np.testing.assert_allclose(e.probs.detach().cpu().cpu().numpy(), t.probs.detach().cpu().cpu().numpy(), rtol=1e-12)
        np.testing.assert_allclose(e.logits.detach().cpu().cpu().numpy(), t.logits.detach().cpu().cpu().numpy(), rtol=1e-9, atol=1e-12)


def test_normal_cdf_rsample_gradient_and_sample_statistics():
    t, e, _, (loc, scale) = _both(lambda d, a, b: d.Normal(a, b), LOC, SCALE)
    x = RNG.standard_normal((3, 4))
    np.testing.assert_allclose(e.cdf(flow.tensor(x, device=DEVICE)).detach().cpu().cpu().numpy(), t.cdf(torch.tensor(x)).detach().cpu().cpu().numpy(),
                               rtol=1e-12)
    flow.manual_seed(0)
    draw = e.rsample((5000,))
    assert tuple(draw.shape) == (5000, 3, 4) and draw.requires_grad
    draw.mean().backward()  # d mean(loc + eps * scale): 1/12 per loc element, mean(eps)/12 per scale
    np.testing.assert_allclose(loc.grad.cpu().cpu().numpy(), np.full((3, 4), 1 / 12), rtol=1e-12)
    z = (draw.detach().cpu().cpu().numpy() - LOC) / SCALE
    assert abs(z.mean()) < 0.02 and abs(z.std() - 1) < 0.02
    assert not e.sample((2,)).requires_grad


def test_categorical_and_bernoulli_samples_follow_their_probabilities():
    flow.manual_seed(0)
    probs = np.array([[0.1, 0.6, 0.3], [0.5, 0.25, 0.25]])
    c = flow.distributions.Categorical(probs=flow.tensor(probs, device=DEVICE))
    draws = c.sample((20000,)).cpu().numpy()
    assert draws.shape == (20000, 2)
    freq = np.stack([(draws == k).mean(0) for k in range(3)], axis=1)
    np.testing.assert_allclose(freq, probs, atol=0.015)
    assert tuple(flow.distributions.Categorical(logits=flow.zeros(4, device=DEVICE)).sample().shape) == ()
    b = flow.distributions.Bernoulli(probs=flow.tensor([0.2, 0.9], device=DEVICE))
    np.testing.assert_allclose(b.sample((20000,)).cpu().numpy().mean(0), [0.2, 0.9], atol=0.015)
    oh = flow.distributions.OneHotCategorical(probs=flow.tensor(probs, device=DEVICE))
    one = oh.sample()
    assert tuple(one.shape) == (2, 3) and (one.cpu().numpy().sum(-1) == 1).all()
    ref = torch.distributions.OneHotCategorical(probs=torch.tensor(probs))
    np.testing.assert_allclose(oh.log_prob(one).cpu().numpy(), ref.log_prob(torch.tensor(one.cpu().numpy())).cpu().numpy(), rtol=1e-12)


@pytest.mark.parametrize("pair", ["normal", "categorical", "bernoulli", "uniform"])
def test_kl_divergence_matches_torch(pair):
    rng = np.random.default_rng(1)
    makers = {
        "normal": lambda d, a, b: (d.Normal(a[0], b[0]), d.Normal(a[1], b[1])),
        "categorical": lambda d, a, b: (d.Categorical(logits=a[0]), d.Categorical(logits=a[1])),
        "bernoulli": lambda d, a, b: (d.Bernoulli(logits=a[0]), d.Bernoulli(logits=a[1])),
        "uniform": lambda d, a, b: (d.Uniform(a[0], a[0] + b[0]), d.Uniform(a[0] - b[1], a[0] + b[0] + b[1])),
    }
    a, b = rng.standard_normal((2, 3, 4)), rng.uniform(0.5, 2, (2, 3, 4))
    tp, tq = makers[pair](torch.distributions, torch.tensor(a), torch.tensor(b))
    ep, eq = makers[pair](flow.distributions, flow.tensor(a, device=DEVICE), flow.tensor(b, device=DEVICE))
    np.testing.assert_allclose(flow.distributions.kl_divergence(ep, eq).cpu().numpy(),
                               torch.distributions.kl_divergence(tp, tq).cpu().numpy(), rtol=1e-10, atol=1e-12)


def test_bad_arguments_are_value_errors_as_in_torch():
    d = flow.distributions
    for make, match in ((lambda: d.Normal(0.0, flow.tensor([1.0, -1.0])), "expected scale > 0"),
                        (lambda: d.Uniform(1.0, 0.0), "expected low < high"),
                        (lambda: d.Bernoulli(probs=flow.tensor([1.5])), r"expected probs in \[0, 1\]"),
                        (lambda: d.Categorical(probs=flow.tensor([0.5]), logits=flow.tensor([0.0])),
                         "either probs or logits"),
                        (lambda: d.Categorical(logits=flow.zeros(3)).log_prob(flow.tensor([3])), r"in \[0, 3\)"),
                        (lambda: d.Bernoulli(probs=flow.tensor([0.5])).log_prob(flow.tensor([0.5])), r"in \{0, 1\}")):
        with pytest.raises(ValueError, match=match):
            make()
    with pytest.raises(NotImplementedError, match="no KL registered for Normal || Categorical"):
        d.kl_divergence(d.Normal(0.0, 1.0), d.Categorical(logits=flow.zeros(2)))
