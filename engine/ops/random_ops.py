"""Random sampling ops: `multinomial`, `bernoulli` and the in-place fills `normal_`, `uniform_`,
`bernoulli_`, `exponential_`, `random_` that `nn.init` uses.

Every draw comes from an engine `Generator` (the default one unless `generator=` is given), through
`Generator.rng(xp)`: numpy's Philox generator on the CPU, CuPy's on CUDA. Values therefore cannot
match PyTorch's stream; tests/test_random_ops.py checks them statistically instead.

multinomial without replacement is an exponential race (Gumbel-top-k): each category gets a key
E/w with E ~ Exp(1); the `num_samples` smallest keys are a sample without replacement with exactly
the sequential-draw distribution, in one vectorised step. With replacement, each row's normalised
CDF is searched with uniform draws.

The fills follow engine/ops/inplace.py: a leaf that requires grad raises outside no_grad; with
nothing recorded the values are written into the tensor's own storage (views see them).
"""
import numpy as np

from .op import Op
from ..autograd.grad_mode import _state as _grad_state
from ..backend import dtypes, host_checks, xp_of
from ..backend.random import default_generator
from ..tensor import Tensor, tensor_method
from . import inplace
from ._core import shape_str

__all__ = ["multinomial", "bernoulli"]


def _rng(generator, array):
    return (generator or default_generator).rng(xp_of(array))


def _draw_dtype(dtype):
    """numpy draws float32 or float64 directly; half types are drawn in float32 and cast."""
    return np.float64 if dtype == np.float64 else np.float32


# ------------------------------------------------------------------ multinomial
class Multinomial(Op):
    name = "Multinomial"
    differentiable = False

    @staticmethod
    def forward(ctx, w, num_samples, replacement, generator):
        xp = xp_of(w)
        rng = _rng(generator, w)
        w2 = w.reshape(-1, w.shape[-1]).astype(np.float64)
        rows, k = w2.shape
        if not replacement:
            with np.errstate(divide="ignore"):  # zero weight -> inf key: picked last
                keys = rng.standard_exponential((rows, k)) / w2
            idx = xp.argsort(keys, axis=1, kind="stable")[:, :num_samples]
        else:
            cdf = xp.cumsum(w2, axis=1)
            cdf /= cdf[:, -1:]
            u = rng.random((rows, num_samples))
            if rows * num_samples * k <= 1 << 22:  # category = number of CDF entries <= u
                idx = (u[:, :, None] >= cdf[:, None, :]).sum(axis=2)
            else:
                idx = xp.empty((rows, num_samples), dtype=np.int64)
                for r in range(rows):
                    idx[r] = xp.searchsorted(cdf[r], u[r], side="right")
            xp.minimum(idx, k - 1, out=idx)
        return idx.astype(np.int64, copy=False).reshape(w.shape[:-1] + (num_samples,))


def multinomial(input, num_samples, replacement=False, *, generator=None):
    """Draw `num_samples` category indices per row of non-negative weights (1-D or 2-D input)."""
    op = "multinomial"
    if input.ndim not in (1, 2):
        raise RuntimeError(f"{op}: prob_dist must be 1 or 2 dim, got input of shape {shape_str(input.shape)}")
    if not input.is_floating_point():
        raise RuntimeError(f"{op}: only supports floating-point dtypes for input, got {input.dtype.name}")
    num_samples = int(num_samples)
    k = input.shape[-1]
    if num_samples <= 0:
        raise RuntimeError(f"{op}: cannot sample n_sample <= 0 samples, got num_samples={num_samples}")
    if k == 0:
        raise RuntimeError(f"{op}: number of categories cannot be zero (input of shape {shape_str(input.shape)})")
    if not replacement and num_samples > k:
        raise RuntimeError(f"{op}: cannot sample n_sample > prob_dist.size(-1) samples without replacement "
                           f"(num_samples={num_samples}, categories={k})")
    w = input._data
    xp = xp_of(w)
    w64 = w.astype(np.float64)
    if not host_checks(w):  # on a GPU only in the debug mode: the checks read values back
        return Multinomial.apply(input, num_samples=num_samples, replacement=bool(replacement), generator=generator)
    if not bool(xp.isfinite(w64).all()) or bool((w64 < 0).any()):
        raise RuntimeError(f"{op}: probability tensor contains either `inf`, `nan` or element < 0")
    if bool((w64.reshape(-1, k).sum(axis=1) <= 0).any()):
        raise RuntimeError(f"{op}: invalid multinomial distribution (sum of probabilities <= 0): "
                           "a row of the input has only zero weights")
    return Multinomial.apply(input, num_samples=num_samples, replacement=bool(replacement), generator=generator)


tensor_method("multinomial")(multinomial)


# ------------------------------------------------------------------ bernoulli
def _check_prob(p, op):
    if isinstance(p, Tensor):
        a = p._data
        if a.size and not (bool((a >= 0).all()) and bool((a <= 1).all())):
            raise RuntimeError(f"{op}: expects all elements of p to be in [0, 1]")
    elif not 0 <= p <= 1:
        raise RuntimeError(f"{op}: expects p to be in [0, 1], but got p={p}")


class Bernoulli(Op):
    name = "Bernoulli"
    differentiable = False

    @staticmethod
    def forward(ctx, probs, generator):
        u = _rng(generator, probs).random(probs.shape, dtype=_draw_dtype(probs.dtype))
        return (u < probs).astype(probs.dtype)


def bernoulli(input, p=None, *, generator=None):
    """0/1 draws with probability `input` (or the scalar `p`), in input's floating dtype."""
    if not input.is_floating_point():
        raise RuntimeError(f"bernoulli: expected a floating point input, got {input.dtype.name}")
    if p is not None:
        return bernoulli_(input.detach().clone(), p, generator=generator)
    _check_prob(input, "bernoulli")
    return Bernoulli.apply(input.detach(), generator=generator)


tensor_method("bernoulli")(bernoulli)


# ------------------------------------------------------------------ in-place fills
def _fill(t, op, make):
    """Fill `t` in place with `make(rng, shape, draw_dtype)` (an array), by the in-place rule."""
    inplace.check_inplace_allowed(t, op)
    if _grad_state.tracer is not None:
        from ..autograd.trace import GraphTraceError
        raise GraphTraceError(f"{op}: an in-place random fill inside a step that nn.Graph captures would draw its "
                              "numbers once; draw them with a random op (rand, randn, dropout) or outside the graph")
    array = make(t._data, t._data.shape, _draw_dtype(t._data.dtype))
    if inplace.records(t):
        return inplace.rebind(t, Tensor._make(array.astype(t._data.dtype, copy=False), t._device), op)
    xp_of(t._data).copyto(t._data, array, casting="unsafe")
    t._bump_version()
    return t


def _need_float(t, op):
    if not t.is_floating_point():
        raise RuntimeError(f"{op}: expected a floating point tensor, got {t.dtype.name}")


@tensor_method()
def normal_(self, mean=0.0, std=1.0, *, generator=None):
    if std < 0:
        raise RuntimeError(f"normal_: expects std >= 0.0, but found std {std}")
    _need_float(self, "normal_")

    def make(a, shape, wt):
        z = _rng(generator, a).standard_normal(shape, dtype=wt)
        if std != 1:
            z *= wt(std)
        if mean != 0:
            z += wt(mean)
        return z

    return _fill(self, "normal_", make)


@tensor_method()
def uniform_(self, a=0.0, b=1.0, *, generator=None):
    if a > b:
        raise RuntimeError(f"uniform_: expects to return a [from, to) range, but found from={a} > to={b}")
    _need_float(self, "uniform_")

    def make(arr, shape, wt):
        u = _rng(generator, arr).random(shape, dtype=wt)
        u *= wt(b - a)
        u += wt(a)
        return u

    return _fill(self, "uniform_", make)


@tensor_method()
def exponential_(self, lambd=1.0, *, generator=None):
    if lambd <= 0:
        raise RuntimeError(f"exponential_: expects lambda > 0.0, but found lambda={lambd}")
    _need_float(self, "exponential_")

    def make(a, shape, wt):
        e = _rng(generator, a).standard_exponential(shape, dtype=wt)
        if lambd != 1:
            e /= wt(lambd)
        return e

    return _fill(self, "exponential_", make)


@tensor_method()
def bernoulli_(self, p=0.5, *, generator=None):
    _check_prob(p, "bernoulli_")

    def make(a, shape, wt):
        u = _rng(generator, a).random(shape, dtype=wt)
        prob = p._data if isinstance(p, Tensor) else p
        if isinstance(p, Tensor) and prob.shape != shape:
            prob = xp_of(a).broadcast_to(prob, shape)
        return u < prob

    return _fill(self, "bernoulli_", make)


def _random_upper(dtype):
    """random_() with no bounds: [0, 2**mantissa] for floats, [0, max] for integers."""
    if dtype.is_floating_point:
        digits = {"float16": 11, "bfloat16": 8, "float32": 24, "float64": 53}[dtype.name]
        return 2 ** digits + 1
    if dtype is dtypes.bool_:
        return 2
    return int(np.iinfo(dtype.np).max) + 1


@tensor_method()
def random_(self, from_=0, to=None, *, generator=None, **kw):
    """Integers drawn uniformly from [from, to - 1] (`random_(to)` means [0, to - 1])."""
    from_ = kw.pop("from", from_)
    if kw:
        raise TypeError(f"random_: unexpected arguments {sorted(kw)}")
    if to is None and from_ != 0:
        lo, hi = 0, int(from_)
    elif to is None:
        lo, hi = 0, _random_upper(self.dtype)
    else:
        lo, hi = int(from_), int(to)
    if lo >= hi:
        raise RuntimeError(f"random_: expects 'from' to be less than 'to', but got from={lo} >= to={hi}")

    def make(a, shape, wt):
        return _rng(generator, a).integers(lo, hi, size=shape, dtype=np.int64)

    return _fill(self, "random_", make)
