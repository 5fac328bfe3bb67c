"""Statistical tests of the random ops (engine/ops/random_ops.py): their values cannot match
PyTorch's stream, so each test checks the distribution (chi-square or moment bounds at roughly a
one-in-a-million false-alarm level), the support, dtypes, the in-place rule and seeding."""
import numpy as np
import pytest
from scipy import stats

import engine as flow


def _chi2_ok(counts, expected, p=1e-6):
    """Pearson chi-square goodness of fit over the categories with positive expectation."""
    counts, expected = np.asarray(counts, float), np.asarray(expected, float)
    keep = expected > 0
    assert counts[~keep].sum() == 0, f"drew categories of zero probability: {counts}"
    chi2 = ((counts[keep] - expected[keep]) ** 2 / expected[keep]).sum()
    bound = stats.chi2.ppf(1 - p, keep.sum() - 1)
    assert chi2 < bound, f"chi-square {chi2:.1f} >= {bound:.1f}: counts {counts} vs expected {expected}"


def test_multinomial_frequencies_match_weights():
    flow.manual_seed(0)
    w = np.array([[1.0, 2.0, 3.0, 0.0, 4.0], [5.0, 0.0, 0.0, 1.0, 1.0]], dtype=np.float32)
    n = 20000
    s = flow.multinomial(flow.tensor(w), n, replacement=True)
    assert s.dtype is flow.int64 and tuple(s.shape) == (2, n)
    for row in range(2):
        counts = np.bincount(s[row].numpy(), minlength=5)
        _chi2_ok(counts, n * w[row] / w[row].sum())


def test_multinomial_1d_and_method():
    flow.manual_seed(1)
    w = flow.tensor([0.1, 0.0, 0.6, 0.3])
    s = w.multinomial(6000, replacement=True)
    assert tuple(s.shape) == (6000,)
    _chi2_ok(np.bincount(s.numpy(), minlength=4), 6000 * np.array([0.1, 0.0, 0.6, 0.3]))


def test_multinomial_without_replacement_unique_and_sequential_law():
    flow.manual_seed(2)
    w = np.array([1.0, 2.0, 3.0, 4.0, 0.0], dtype=np.float64)
    rows = 20000
    s = flow.multinomial(flow.tensor(np.tile(w, (rows, 1))), 2).numpy()
    assert s.shape == (rows, 2)
    assert np.all(s[:, 0] != s[:, 1]), "a row repeated a category without replacement"
    p = w / w.sum()
    _chi2_ok(np.bincount(s[:, 0], minlength=5), rows * p)
    # second draw: P(j) = sum_i p_i * w_j / (W - w_i), the sequential-draw law
    second = np.array([sum(p[i] * w[j] / (w.sum() - w[i]) for i in range(5) if i != j) for j in range(5)])
    _chi2_ok(np.bincount(s[:, 1], minlength=5), rows * second)


def test_multinomial_all_categories_is_a_permutation():
    flow.manual_seed(3)
    w = flow.rand(50, 7) + 0.01
    s = flow.multinomial(w, 7).numpy()
    assert np.all(np.sort(s, axis=1) == np.arange(7))


def test_multinomial_zero_weights_come_last_without_replacement():
    flow.manual_seed(4)
    s = flow.multinomial(flow.tensor([[0.0, 1.0, 0.0, 2.0]] * 100), 3).numpy()
    assert set(map(int, s[:, :2].ravel())) <= {1, 3}


@pytest.mark.parametrize("w, n, repl, match", [
    ([1.0, -0.5, 2.0], 1, True, "element < 0"),
    ([[1.0, 2.0], [0.0, 0.0]], 1, True, "sum of probabilities"),
    ([1.0, 2.0, 3.0], 4, False, "without replacement"),
    ([[[1.0]]], 1, True, "1 or 2 dim"),
    ([1.0, float("nan")], 1, True, "nan"),
])
def test_multinomial_errors(w, n, repl, match):
    with pytest.raises(RuntimeError, match=match):
        flow.multinomial(flow.tensor(w), n, replacement=repl)


def test_multinomial_int_input_raises():
    with pytest.raises(RuntimeError, match="floating"):
        flow.multinomial(flow.tensor([1, 2]), 1)


def test_seed_reproducibility():
    w = flow.tensor([[1.0, 2.0, 3.0]] * 4)
    draws = []
    for _ in range(2):
        flow.manual_seed(123)
        a = flow.multinomial(w, 3)
        b = flow.multinomial(w, 5, replacement=True)
        c = flow.empty(10).normal_()
        d = flow.empty(10).uniform_(-1, 1)
        e = flow.bernoulli(flow.full((10,), 0.5))
        draws.append([t.numpy() for t in (a, b, c, d, e)])
    for x, y in zip(*draws):
        np.testing.assert_array_equal(x, y)
    flow.manual_seed(124)
    assert not np.array_equal(flow.empty(10).normal_().numpy(), draws[0][2])


def test_generator_argument_is_independent_of_default():
    g1, g2 = flow.Generator().manual_seed(7), flow.Generator().manual_seed(7)
    a = flow.empty(100).normal_(generator=g1)
    flow.manual_seed(0)
    flow.empty(100).normal_()  # consumes the default generator only
    b = flow.empty(100).normal_(generator=g2)
    np.testing.assert_array_equal(a.numpy(), b.numpy())
    w = flow.tensor([1.0, 1.0, 1.0, 1.0])
    np.testing.assert_array_equal(flow.multinomial(w, 4, generator=flow.Generator().manual_seed(5)).numpy(),
                                  flow.multinomial(w, 4, generator=flow.Generator().manual_seed(5)).numpy())


def test_normal_moments():
    flow.manual_seed(5)
    n = 200000
    x = flow.empty(n).normal_(mean=2.0, std=3.0)
    a = x.numpy()
    assert x.dtype is flow.float32
    assert abs(a.mean() - 2.0) < 5 * 3.0 / np.sqrt(n)
    assert abs(a.std() - 3.0) < 5 * 3.0 / np.sqrt(2 * n)
    assert abs(stats.skew(a)) < 5 * np.sqrt(6 / n)
    d = flow.empty(1000, dtype=flow.float64).normal_()
    assert d.dtype is flow.float64 and d.numpy().dtype == np.float64


def test_uniform_range_and_moments():
    flow.manual_seed(6)
    n = 200000
    a = flow.empty(n).uniform_(-2.0, 3.0).numpy()
    assert a.min() >= -2.0 and a.max() < 3.0
    assert abs(a.mean() - 0.5) < 5 * 5 / np.sqrt(12 * n)
    assert abs(a.var() - 25 / 12) < 0.05
    _chi2_ok(np.histogram(a, bins=10, range=(-2, 3))[0], np.full(10, n / 10))
    u = flow.empty(100).uniform_().numpy()
    assert u.min() >= 0 and u.max() < 1


def test_exponential_and_random_int():
    flow.manual_seed(7)
    n = 100000
    e = flow.empty(n).exponential_(2.0).numpy()
    assert e.min() >= 0 and abs(e.mean() - 0.5) < 5 * 0.5 / np.sqrt(n)
    r = flow.empty(n, dtype=flow.int64).random_(3, 9).numpy()
    assert r.min() == 3 and r.max() == 8
    _chi2_ok(np.bincount(r, minlength=9)[3:], np.full(6, n / 6))
    r2 = flow.zeros(1000).random_(5).numpy()
    assert set(np.unique(r2)) <= set(range(5))


def test_bernoulli_rate():
    flow.manual_seed(8)
    p = np.array([0.0, 0.1, 0.5, 0.9, 1.0], dtype=np.float32)
    n = 40000
    probs = flow.tensor(np.tile(p, (n, 1)))
    b = flow.bernoulli(probs)
    assert b.dtype is flow.float32 and tuple(b.shape) == (n, 5)
    a = b.numpy()
    assert set(np.unique(a)) <= {0.0, 1.0}
    rate = a.mean(axis=0)
    assert rate[0] == 0 and rate[4] == 1
    for r, q in zip(rate[1:4], p[1:4]):
        assert abs(r - q) < 5 * np.sqrt(q * (1 - q) / n)
    m = flow.empty(n, dtype=flow.float64).bernoulli_(0.3).numpy()
    assert abs(m.mean() - 0.3) < 5 * np.sqrt(0.21 / n)
    t = flow.empty(n).bernoulli_(flow.full((n,), 0.7)).numpy()
    assert abs(t.mean() - 0.7) < 5 * np.sqrt(0.21 / n)
    s = flow.bernoulli(flow.zeros(n), p=0.25).numpy()
    assert abs(s.mean() - 0.25) < 5 * np.sqrt(0.1875 / n)


def test_bernoulli_errors():
    with pytest.raises(RuntimeError, match=r"\[0, 1\]"):
        flow.bernoulli(flow.tensor([0.5, 1.5]))
    with pytest.raises(RuntimeError, match=r"\[0, 1\]"):
        flow.empty(3).bernoulli_(-0.1)


def test_fills_follow_inplace_rule():
    w = flow.zeros(4, 3, requires_grad=True)
    for fill in (lambda t: t.normal_(), lambda t: t.uniform_(), lambda t: t.bernoulli_(0.5),
                 lambda t: t.exponential_()):
        with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
            fill(w)
    with flow.no_grad():
        v0 = w._version
        out = w.normal_()
        assert out is w and w._version > v0 and w.requires_grad and w.is_leaf
    assert np.any(w.detach().numpy() != 0)
    base = flow.zeros(4, 3)
    view = base[1]
    view.uniform_(5, 6)  # unrecorded path writes into the storage: the base sees it
    a = base.numpy()
    assert np.all((a[1] >= 5) & (a[1] < 6)) and np.all(a[0] == 0)


def test_fill_keeps_half_dtypes():
    for dt in (flow.float16, flow.bfloat16):
        t = flow.empty(1000, dtype=dt).normal_()
        assert t.dtype is dt
        assert abs(float(t.float().numpy().mean())) < 0.2


def test_float_fills_reject_integers():
    with pytest.raises(RuntimeError, match="floating"):
        flow.zeros(3, dtype=flow.int64).normal_()
