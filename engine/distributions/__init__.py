"""Probability distributions (`engine.distributions`, PyTorch's `torch.distributions`):
`Normal`, `Uniform`, `Bernoulli`, `Categorical`, `OneHotCategorical`, and `kl_divergence`
between two of a kind; `Independent` and `MultivariateNormal` are in multivariate.py.

Reinforcement-learning scripts (REINFORCE, actor-critic, PPO) and VAEs use these few: sample an
action, score it with `log_prob`, regularise with `entropy` or a KL term. Everything is written
in engine ops, so log-probabilities, entropies and `rsample()` (the reparameterised draw of
Normal and Uniform) are differentiable, run on any device, and follow the parameters' dtype.
Arguments are validated as PyTorch's default `validate_args=True` does: a bad parameter or a
value outside the support is a ValueError naming it.
"""
import math

import numpy as np

from ..autograd.grad_mode import no_grad
from ..backend.dtypes import get_default_dtype
from ..nn import functional as F
from ..ops.comparison import where
from ..ops.creation import arange, full, full_like, rand, randn, tensor, zeros_like
from ..ops.random_ops import bernoulli, multinomial
from ..ops.unary import erf
from ..tensor import Size, Tensor
from .distribution import Distribution
from .multivariate import Independent, MultivariateNormal

__all__ = ["Distribution", "Normal", "Uniform", "Bernoulli", "Categorical", "OneHotCategorical",
           "Independent", "MultivariateNormal", "kl_divergence", "register_kl"]

_LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)


def _as_tensor(value, like=None):
    if isinstance(value, Tensor):
        return value
    dtype = like.dtype if like is not None and like.is_floating_point() else get_default_dtype()
    return tensor(value, dtype=dtype, device=like.device if like is not None else None)


def _min_real(t):
    """The most negative finite number of t's dtype (torch clamps log(0) to it in entropies)."""
    return float(np.finfo(t._data.dtype).min)


def _eps(t):
    return float(np.finfo(t._data.dtype).eps)


def _broadcast(*values):
    """The parameters as tensors of one broadcast shape (numbers take a tensor's dtype)."""
    like = next((v for v in values if isinstance(v, Tensor)), None)
    tensors = [_as_tensor(v, like) for v in values]
    shape = tuple(tensors[0].shape)
    for t in tensors[1:]:
        shape = _broadcast_shape(shape, tuple(t.shape))
    return [t.expand(*shape) if tuple(t.shape) != shape else t for t in tensors]


def _broadcast_shape(a, b):
    n = max(len(a), len(b))
    a, b = (1,) * (n - len(a)) + a, (1,) * (n - len(b)) + b
    out = []
    for x, y in zip(a, b):
        if x != y and 1 not in (x, y):
            raise ValueError(f"distribution parameters of shapes {list(a)} and {list(b)} do not broadcast")
        out.append(max(x, y) if 0 not in (x, y) else 0)
    return tuple(out)


class Normal(Distribution):
    """N(loc, scale^2), scale > 0."""

    has_rsample = True

    def __init__(self, loc, scale, validate_args=None):
        self.loc, self.scale = _broadcast(loc, scale)
        if validate_args is not False and not bool((self.scale > 0).all()):
            raise ValueError(f"Normal: expected scale > 0, got {self.scale}")
        super().__init__(self.loc.shape)

    def _params(self):
        return {"loc": self.loc, "scale": self.scale}

    @property
    def mean(self):
        return self.loc

    @property
    def mode(self):
        return self.loc

    @property
    def variance(self):
        return self.scale * self.scale

    def rsample(self, sample_shape=()):
        eps = randn(*self._extended_shape(sample_shape), dtype=self.loc.dtype, device=self.loc.device)
        return self.loc + eps * self.scale

    def log_prob(self, value):
        value = _as_tensor(value, self.loc)
        return -((value - self.loc) ** 2) / (2 * self.variance) - self.scale.log() - _LOG_SQRT_2PI

    def cdf(self, value):
        value = _as_tensor(value, self.loc)
        return 0.5 * (1 + erf((value - self.loc) / (self.scale * math.sqrt(2))))

    def entropy(self):
        return 0.5 + _LOG_SQRT_2PI + self.scale.log()


class Uniform(Distribution):
    """Uniform on [low, high), low < high."""

    has_rsample = True

    def __init__(self, low, high, validate_args=None):
        self.low, self.high = _broadcast(low, high)
        if validate_args is not False and not bool((self.low < self.high).all()):
            raise ValueError(f"Uniform: expected low < high, got low={self.low}, high={self.high}")
        self._validate = validate_args is not False
        super().__init__(self.low.shape)

    def _params(self):
        return {"low": self.low, "high": self.high}

    @property
    def mean(self):
        return (self.low + self.high) / 2

    @property
    def variance(self):
        return (self.high - self.low) ** 2 / 12

    def rsample(self, sample_shape=()):
        u = rand(*self._extended_shape(sample_shape), dtype=self.low.dtype, device=self.low.device)
        return self.low + u * (self.high - self.low)

    def log_prob(self, value):
        value = _as_tensor(value, self.low)
        if self._validate:
            self._check_value(value, (value >= self.low) & (value < self.high), "in [low, high)")
        return -(self.high - self.low).log() + value * 0  # the value's shape, broadcast

    def cdf(self, value):
        value = _as_tensor(value, self.low)
        return ((value - self.low) / (self.high - self.low)).clamp(0, 1)

    def entropy(self):
        return (self.high - self.low).log()


class _ProbsOrLogits(Distribution):
    """Shared by Bernoulli and the categoricals: exactly one of `probs` / `logits`."""

    def __init__(self, probs, logits, name):
        if (probs is None) == (logits is None):
            raise ValueError(f"{name}: either probs or logits must be specified, but not both")
        self._given_probs = probs is not None
        self._param = _as_tensor(probs if probs is not None else logits)
        if not self._param.is_floating_point():
            self._param = self._param.to(get_default_dtype())


class Bernoulli(_ProbsOrLogits):
    """1 with probability `probs` (or sigmoid(`logits`)), else 0."""

    def __init__(self, probs=None, logits=None, validate_args=None):
        super().__init__(probs, logits, "Bernoulli")
        if self._given_probs and validate_args is not False:
            p = self._param
            if not bool(((p >= 0) & (p <= 1)).all()):
                raise ValueError(f"Bernoulli: expected probs in [0, 1], got {p}")
        self._validate = validate_args is not False
        Distribution.__init__(self, self._param.shape)

    def _params(self):
        return {"probs": self.probs}

    @property
    def probs(self):
        return self._param if self._given_probs else self._param.sigmoid()

    @property
    def logits(self):
        if not self._given_probs:
            return self._param
        eps = _eps(self._param)
        p = self._param.clamp(eps, 1 - eps)
        return p.log() - (-p).log1p()

    @property
    def mean(self):
        return self.probs

    @property
    def variance(self):
        return self.probs * (1 - self.probs)

    def sample(self, sample_shape=()):
        with no_grad():
            return bernoulli(self.probs.detach().expand(*self._extended_shape(sample_shape)))

    def log_prob(self, value):
        value = _as_tensor(value, self._param)
        if self._validate:
            self._check_value(value, (value == 0) | (value == 1), "in {0, 1}")
        logits, value = _broadcast(self.logits, value)
        return -F.binary_cross_entropy_with_logits(logits, value, reduction="none")

    def entropy(self):
        return F.binary_cross_entropy_with_logits(self.logits, self.probs, reduction="none")


class Categorical(_ProbsOrLogits):
    """One of K categories (the last dim of `probs` / `logits`; probs need not sum to 1)."""

    def __init__(self, probs=None, logits=None, validate_args=None):
        super().__init__(probs, logits, type(self).__name__)
        if self._param.ndim < 1:
            raise ValueError(f"{type(self).__name__}: probs / logits need at least one dimension (the categories)")
        if self._given_probs and validate_args is not False and not bool((self._param >= 0).all()):
            raise ValueError(f"{type(self).__name__}: expected non-negative probs, got {self._param}")
        self._validate = validate_args is not False
        self._num_events = self._param.shape[-1]
        Distribution.__init__(self, self._param.shape[:-1])

    def _params(self):
        return {"probs": self.probs}

    @property
    def logits(self):
        """Normalised: log-probabilities (logsumexp over the categories is 0)."""
        raw = self._param.log() if self._given_probs else self._param
        return raw - raw.logsumexp(dim=-1, keepdim=True)

    @property
    def probs(self):
        if self._given_probs:
            return self._param / self._param.sum(dim=-1, keepdim=True)
        return self._param.softmax(dim=-1)

    @property
    def param_shape(self):
        return self._param.shape

    @property
    def mean(self):
        return full(self._extended_shape(), float("nan"), dtype=self._param.dtype)

    @property
    def mode(self):
        return self.probs.argmax(dim=-1)

    def sample(self, sample_shape=()):
        with no_grad():
            n = math.prod(sample_shape) if sample_shape else 1
            probs = self.probs.detach().reshape(-1, self._num_events)
            draws = multinomial(probs, n, replacement=True)  # [batch, n]
            return draws.t().reshape(tuple(sample_shape) + tuple(self._batch_shape))

    def log_prob(self, value):
        value = _as_tensor(value).long()
        if self._validate:
            self._check_value(value, (value >= 0) & (value < self._num_events),
                              f"in [0, {self._num_events}) (a category index)")
        logits = self.logits
        shape = _broadcast_shape(tuple(value.shape), tuple(logits.shape[:-1]))
        value = value.expand(*shape) if tuple(value.shape) != shape else value
        logits = logits.expand(*shape, self._num_events)
        return logits.gather(-1, value.unsqueeze(-1)).squeeze(-1)

    def entropy(self):
        return -(self.logits.clamp(min=_min_real(self._param)) * self.probs).sum(dim=-1)

    def enumerate_support(self, expand=True):
        values = arange(self._num_events).view(-1, *((1,) * len(self._batch_shape)))
        return values.expand(-1, *self._batch_shape) if expand else values


class OneHotCategorical(Categorical):
    """Categorical whose draws and values are one-hot vectors over the K categories."""

    def __init__(self, probs=None, logits=None, validate_args=None):
        super().__init__(probs, logits, validate_args)
        self._event_shape = Size((self._num_events,))

    def sample(self, sample_shape=()):
        index = super().sample(sample_shape)
        return F.one_hot(index, self._num_events).to(self._param.dtype)

    def log_prob(self, value):
        value = _as_tensor(value, self._param)
        if self._validate:
            self._check_value(value, ((value == 0) | (value == 1)).all(dim=-1) & (value.sum(dim=-1) == 1),
                              "one-hot over the last dim")
        return super().log_prob(value.argmax(dim=-1))

    @property
    def mean(self):
        return self.probs

    @property
    def variance(self):
        return self.probs * (1 - self.probs)


# ------------------------------------------------------------------ KL divergence
_KL = {}


def register_kl(type_p, type_q):
    """Decorator registering `fn(p, q)` as KL(p || q) for p of `type_p` and q of `type_q`."""
    def deco(fn):
        _KL[(type_p, type_q)] = fn
        return fn
    return deco


def kl_divergence(p, q):
    """KL(p || q), elementwise over the batch shape."""
    for (tp, tq), fn in _KL.items():
        if isinstance(p, tp) and isinstance(q, tq):
            return fn(p, q)
    raise NotImplementedError(f"kl_divergence: no KL registered for {type(p).__name__} || {type(q).__name__}")


@register_kl(Normal, Normal)
def _kl_normal_normal(p, q):
    var_ratio = (p.scale / q.scale) ** 2
    t1 = ((p.loc - q.loc) / q.scale) ** 2
    return 0.5 * (var_ratio + t1 - 1 - var_ratio.log())


@register_kl(Categorical, Categorical)
def _kl_categorical_categorical(p, q):
    t = p.probs * (p.logits - q.logits)
    t = where(q.probs == 0, full_like(t, float("inf")), t)
    t = where(p.probs == 0, zeros_like(t), t)
    return t.sum(dim=-1)


@register_kl(Bernoulli, Bernoulli)
def _kl_bernoulli_bernoulli(p, q):
    softplus = F.softplus
    t1 = p.probs * (softplus(-q.logits) - softplus(-p.logits))
    t2 = (1 - p.probs) * (softplus(q.logits) - softplus(p.logits))
    return t1 + t2


@register_kl(Uniform, Uniform)
def _kl_uniform_uniform(p, q):
    result = ((q.high - q.low) / (p.high - p.low)).log()
    outside = (q.low > p.low) | (q.high < p.high)
    return where(outside, full_like(result, float("inf")), result)
