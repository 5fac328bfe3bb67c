"""`LayerNorm`: normalise over the trailing `normalized_shape` dims, then scale and shift."""
import numbers

from ...ops.creation import empty
from ...tensor import Parameter
from .. import functional as F
from .. import init
from ..module import Module

__all__ = ["LayerNorm"]


class LayerNorm(Module):
    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, bias=True, device=None, dtype=None):
        super().__init__()
        if isinstance(normalized_shape, numbers.Integral):
            normalized_shape = (normalized_shape,)
        self.normalized_shape = tuple(normalized_shape)
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        if elementwise_affine:
            self.weight = Parameter(empty(self.normalized_shape, device=device, dtype=dtype))
            if bias:
                self.bias = Parameter(empty(self.normalized_shape, device=device, dtype=dtype))
            else:
                self.register_parameter("bias", None)
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self):
        if self.elementwise_affine:
            init.ones_(self.weight)
            if self.bias is not None:
                init.zeros_(self.bias)

    def forward(self, input):
        return F.layer_norm(input, self.normalized_shape, self.weight, self.bias, self.eps)

    def extra_repr(self):
        return ("{normalized_shape}, eps={eps}, elementwise_affine={elementwise_affine}".format(**self.__dict__)
                + f", bias={self.bias is not None}")
