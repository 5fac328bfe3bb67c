"""Activation modules: thin wrappers over engine.nn.functional, with torch's reprs."""
from ...ops.softmax import implicit_softmax_dim
from .. import functional as F
from ..module import Module

__all__ = ["ReLU", "GELU", "Tanh", "Sigmoid", "SiLU", "Softmax", "LogSoftmax"]


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
