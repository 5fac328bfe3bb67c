"""Activation modules: thin wrappers over engine.nn.functional, with torch's reprs."""
import warnings

from ...ops.creation import empty
from ...ops.softmax import implicit_softmax_dim
from ...tensor import Parameter
from .. import functional as F
from .. import init
from ..module import Module

__all__ = ["ReLU", "GELU", "Tanh", "Sigmoid", "SiLU", "Softmax", "LogSoftmax", "Hardtanh", "ReLU6", "LeakyReLU",
           "Hardswish", "Hardsigmoid", "ELU", "SELU", "CELU", "Softplus", "Mish", "GLU", "PReLU", "LogSigmoid",
           "Softsign", "Tanhshrink"]


class _InplaceActivation(Module):
    """An activation `function(input, inplace=...)` with torch's `inplace` flag and repr."""

    function = None

    def __init__(self, inplace=False):
        super().__init__()
        self.inplace = inplace

    def forward(self, input):
        return type(self).function(input, inplace=True) if self.inplace else type(self).function(input)

    def extra_repr(self):
        return "inplace=True" if self.inplace else ""


class ReLU(_InplaceActivation):
    function = staticmethod(F.relu)


class GELU(Module):
    """GELU(x) = x * Phi(x); approximate='tanh' uses the tanh approximation."""

    def __init__(self, approximate="none"):
        super().__init__()
        if approximate not in ("none", "tanh"):
            raise ValueError(f"GELU: approximate must be 'none' or 'tanh', got {approximate!r}")
        self.approximate = approximate

    def forward(self, input):
        return F.gelu(input, approximate=self.approximate)

    def extra_repr(self):
        return f"approximate={self.approximate!r}"


class Tanh(Module):
    def forward(self, input):
        return F.tanh(input)


class Sigmoid(Module):
    def forward(self, input):
        return F.sigmoid(input)


class SiLU(_InplaceActivation):
    function = staticmethod(F.silu)


class _SoftmaxModule(Module):
    """`function(input, dim)` (softmax or log_softmax); dim=None is torch's legacy implicit choice."""

    function = None

    def __init__(self, dim=None):
        super().__init__()
        self.dim = dim

    def forward(self, input):
        dim = self.dim
        if dim is None:
            dim = implicit_softmax_dim(input.dim())
        return type(self).function(input, dim)

    def extra_repr(self):
        return f"dim={self.dim}"


class Softmax(_SoftmaxModule):
    function = staticmethod(F.softmax)


class LogSoftmax(_SoftmaxModule):
    function = staticmethod(F.log_softmax)


# ---------------------------------------------------------------------- piecewise-linear and elu family
def _inplace_suffix(inplace):
    """torch's ", inplace=True" after other options (nothing when False)."""
    return ", inplace=True" if inplace else ""


class Hardtanh(Module):
    """clamp(x, min_val, max_val) with zero gradient at and beyond the edges. `min_value` /
    `max_value` are torch's deprecated spellings of min_val / max_val."""

    def __init__(self, min_val=-1.0, max_val=1.0, inplace=False, min_value=None, max_value=None):
        super().__init__()
        for old, new in (("min_value", min_value), ("max_value", max_value)):
            if new is not None:
                warnings.warn(f"keyword argument `{old}` is deprecated and renamed to `{old[:3]}_val`", FutureWarning,
                              stacklevel=2)
        self.min_val = min_val if min_value is None else min_value
        self.max_val = max_val if max_value is None else max_value
        self.inplace = inplace
        if self.max_val <= self.min_val:
            raise AssertionError(f"max_val ({self.max_val}) must be greater than min_val ({self.min_val})")

    def forward(self, input):
        return F.hardtanh(input, self.min_val, self.max_val, self.inplace)

    def extra_repr(self):
        return f"min_val={self.min_val}, max_val={self.max_val}{_inplace_suffix(self.inplace)}"


class ReLU6(Hardtanh):
    """Hardtanh(0, 6), as in torch (a subclass, so isinstance checks agree)."""

    def __init__(self, inplace=False):
        super().__init__(0.0, 6.0, inplace)

    def forward(self, input):
        return F.relu6(input, self.inplace)

    def extra_repr(self):
        return "inplace=True" if self.inplace else ""


class LeakyReLU(Module):
    def __init__(self, negative_slope=1e-2, inplace=False):
        super().__init__()
        self.negative_slope = negative_slope
        self.inplace = inplace

    def forward(self, input):
        return F.leaky_relu(input, self.negative_slope, self.inplace)

    def extra_repr(self):
        return f"negative_slope={self.negative_slope}{_inplace_suffix(self.inplace)}"


class Hardswish(_InplaceActivation):
    function = staticmethod(F.hardswish)

    def extra_repr(self):  # torch prints no options for Hardswish / Hardsigmoid
        return ""


class Hardsigmoid(_InplaceActivation):
    function = staticmethod(F.hardsigmoid)

    def extra_repr(self):
        return ""


class Mish(_InplaceActivation):
    function = staticmethod(F.mish)


class SELU(_InplaceActivation):
    function = staticmethod(F.selu)


class ELU(Module):
    def __init__(self, alpha=1.0, inplace=False):
        super().__init__()
        self.alpha = alpha
        self.inplace = inplace

    def forward(self, input):
        return F.elu(input, self.alpha, self.inplace)

    def extra_repr(self):
        return f"alpha={self.alpha}{_inplace_suffix(self.inplace)}"


class CELU(ELU):
    def forward(self, input):
        return F.celu(input, self.alpha, self.inplace)


# ---------------------------------------------------------------------- smooth and gated
class Softplus(Module):
    """log(1 + exp(beta x)) / beta, linear where beta x > threshold."""

    def __init__(self, beta=1.0, threshold=20.0):
        super().__init__()
        self.beta = beta
        self.threshold = threshold

    def forward(self, input):
        return F.softplus(input, self.beta, self.threshold)

    def extra_repr(self):
        return f"beta={self.beta}, threshold={self.threshold}"


class GLU(Module):
    def __init__(self, dim=-1):
        super().__init__()
        self.dim = dim

    def forward(self, input):
        return F.glu(input, self.dim)

    def extra_repr(self):
        return f"dim={self.dim}"


class PReLU(Module):
    """x for x > 0, weight * x otherwise, with a learnable `weight` of `num_parameters` entries
    (1, or one per input channel, dim 1), all initialised to `init`."""

    def __init__(self, num_parameters=1, init=0.25, device=None, dtype=None):
        super().__init__()
        self.num_parameters = num_parameters
        self.init = init
        self.weight = Parameter(empty(num_parameters, device=device, dtype=dtype))
        self.reset_parameters()

    def reset_parameters(self):
        init.constant_(self.weight, self.init)

    def forward(self, input):
        return F.prelu(input, self.weight)

    def extra_repr(self):
        return f"num_parameters={self.num_parameters}"


class LogSigmoid(Module):
    def forward(self, input):
        return F.logsigmoid(input)


class Softsign(Module):
    def forward(self, input):
        return F.softsign(input)


class Tanhshrink(Module):
    def forward(self, input):
        return F.tanhshrink(input)
