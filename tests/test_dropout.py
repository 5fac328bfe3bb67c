"""Statistical checks of dropout (random, so not value-for-value with PyTorch): the fraction of
zeros is ~p, survivors are scaled by 1/(1-p), backward reuses the forward's mask, eval mode is the
identity, and the default generator's seed makes it reproducible."""
import numpy as np
import pytest

import engine as flow
import engine.nn.functional as F

N = 200_000


def _drop(p, **kw):
    x = flow.ones(N, requires_grad=True)
    return x, F.dropout(x, p=p, **kw)


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_fraction_and_scale(p):
    flow.manual_seed(0)
    _, y = _drop(p)
    a = y.detach().numpy()
    zero = a == 0
    # binomial std of the zero fraction is sqrt(p(1-p)/N) < 1.2e-3: 5 sigma
    assert abs(zero.mean() - p) < 6e-3
    np.testing.assert_allclose(a[~zero], 1.0 / (1.0 - p), rtol=1e-6)
    assert y.dtype == flow.float32 and tuple(y.shape) == (N,)


def test_backward_uses_the_same_mask():
    flow.manual_seed(1)
    x = flow.randn(1000, requires_grad=True)
    y = F.dropout(x, p=0.3)
    g = flow.randn(1000)
    y.backward(g)
    mask = (y.detach().numpy() != 0) / 0.7
    np.testing.assert_allclose(x.grad.numpy(), g.numpy() * mask, rtol=1e-6)


def test_eval_mode_and_p0_are_identity():
    x = flow.randn(10, 10)
    assert F.dropout(x, p=0.5, training=False) is x
    np.testing.assert_array_equal(F.dropout(x, p=0.0).numpy(), x.numpy())


def test_p1_zeroes_everything():
    x, y = _drop(1.0)
    assert not np.any(y.detach().numpy())
    y.sum().backward()
    assert not np.any(x.grad.numpy())


def test_seed_reproducibility():
    flow.manual_seed(123)
    a = F.dropout(flow.ones(1000), 0.5).numpy()
    b = F.dropout(flow.ones(1000), 0.5).numpy()
    flow.manual_seed(123)
    c = F.dropout(flow.ones(1000), 0.5).numpy()
    np.testing.assert_array_equal(a, c)
    assert not np.array_equal(a, b)


def test_generator_argument():
    g1, g2 = flow.Generator().manual_seed(7), flow.Generator().manual_seed(7)
    a = F.dropout(flow.ones(500), 0.5, generator=g1).numpy()
    b = F.dropout(flow.ones(500), 0.5, generator=g2).numpy()
    np.testing.assert_array_equal(a, b)


def test_inplace():
    flow.manual_seed(3)
    x = flow.ones(1000)
    y = F.dropout(x, 0.5, inplace=True)
    assert y is x
    assert set(np.unique(x.numpy())) <= {0.0, 2.0}
    # recorded in-place on a non-leaf: gradient flows through the mask
    w = flow.ones(1000, requires_grad=True)
    h = w * 1.0
    F.dropout(h, 0.5, inplace=True)
    h.sum().backward()
    np.testing.assert_array_equal(w.grad.numpy(), h.detach().numpy())


def test_half_and_float64_keep_dtype():
    for dt in (flow.float16, flow.float64):
        y = F.dropout(flow.ones(100, dtype=dt), 0.5)
        assert y.dtype == dt


@pytest.mark.parametrize("p", [-0.1, 1.5])
def test_bad_p_raises(p):
    with pytest.raises(ValueError, match="dropout probability"):
        F.dropout(flow.ones(3), p)
