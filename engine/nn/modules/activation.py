"""Activation modules: thin wrappers over engine.nn.functional, with torch's reprs."""
from .. import functional as F
from ..module import Module

__all__ = ["ReLU", "GELU", "Tanh", "Sigmoid", "SiLU", "Softmax", "LogSoftmax"]


class ReLU(Module):
    def __init__(self, inplace=False):
        super().__init__()
        self.inplace = inplace

    def forward(self, input):
        return F.relu(input, inplace=True) if self.inplace else F.relu(input)

    def extra_repr(self):
        return "inplace=True" if self.inplace else ""


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


class SiLU(Module):
    def __init__(self, inplace=False):
        super().__init__()
        self.inplace = inplace

    def forward(self, input):
        return F.silu(input, inplace=True) if self.inplace else F.silu(input)

    def extra_repr(self):
        return "inplace=True" if self.inplace else ""


class Softmax(Module):
    def __init__(self, dim=None):
        super().__init__()
        self.dim = dim

    def forward(self, input):
        dim = self.dim
        if dim is None:  # torch's legacy implicit choice
            dim = 0 if input.dim() in (0, 1, 3) else 1
        return F.softmax(input, dim)

    def extra_repr(self):
        return f"dim={self.dim}"


class LogSoftmax(Module):
    def __init__(self, dim=None):
        super().__init__()
        self.dim = dim

    def forward(self, input):
        dim = self.dim
        if dim is None:
            dim = 0 if input.dim() in (0, 1, 3) else 1
        return F.log_softmax(input, dim)

    def extra_repr(self):
        return f"dim={self.dim}"
