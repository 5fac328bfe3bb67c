"""`Distribution`, the base class of engine.distributions' classes: batch and event shapes,
`sample` as a detached `rsample`, the value check and the repr (its own module, so that the
classes in multivariate.py subclass it without importing the package)."""
from ..autograd.grad_mode import no_grad
from ..tensor import Size

__all__ = ["Distribution"]


class Distribution:
    """Base class: `batch_shape` (independent distributions side by side), `event_shape` (the
    shape of one draw), `sample(sample_shape)` of shape sample_shape + batch_shape + event_shape."""

    has_rsample = False
    has_enumerate_support = False

    def __init__(self, batch_shape=(), event_shape=()):
        self._batch_shape, self._event_shape = Size(batch_shape), Size(event_shape)

    @property
    def batch_shape(self):
        return self._batch_shape

    @property
    def event_shape(self):
        return self._event_shape

    @property
    def stddev(self):
        return self.variance.sqrt()

    def _extended_shape(self, sample_shape=()):
        return tuple(sample_shape) + tuple(self._batch_shape) + tuple(self._event_shape)

    def sample(self, sample_shape=()):
        with no_grad():
            return self.rsample(sample_shape).detach()

    def rsample(self, sample_shape=()):
        raise NotImplementedError(f"{type(self).__name__} has no reparameterised sample (rsample)")

    def sample_n(self, n):
        return self.sample((n,))

    def _check_value(self, value, ok, what):
        if not bool(ok.all()):
            raise ValueError(f"{type(self).__name__}.log_prob: expected a value {what}, got {value}")

    def __repr__(self):
        params = ", ".join(f"{k}: {v.shape if v.numel() > 1 else v}" for k, v in self._params().items())
        return f"{type(self).__name__}({params})"
