"""Linear layers: `Identity` and `Linear` (y = x W^T + b), initialised like torch."""
from ...ops.creation import empty
from ...tensor import Parameter
from .. import functional as F
from .. import init
from ..module import Module

__all__ = ["Identity", "Linear"]


class Identity(Module):
    """Returns its input; accepts and ignores any constructor arguments (as torch does)."""

    def __init__(self, *args, **kwargs):
        super().__init__()

    def forward(self, input):
        return input


class Linear(Module):
    """`y = x @ weight.T + bias` with weight of shape (out_features, in_features).

    Initialisation is torch's: weight ~ kaiming_uniform(a=sqrt(5)), i.e. U(-1/sqrt(in), 1/sqrt(in)),
    and bias ~ U(-1/sqrt(in), 1/sqrt(in))."""

    def __init__(self, in_features, out_features, bias=True, device=None, dtype=None):
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.weight = Parameter(empty(out_features, in_features, device=device, dtype=dtype))
        if bias:
            self.bias = Parameter(empty(out_features, device=device, dtype=dtype))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self):
        init._reset_layer_(self.weight, self.bias, zero_fan_in_bound=0)  # fan_in 0: bias U(0, 0)

    def forward(self, input):
        return F.linear(input, self.weight, self.bias)

    def extra_repr(self):
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"
