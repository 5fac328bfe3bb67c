"""`LayerNorm` on global tensors: replicated parameters ([B, B]); rows of x may be split (the
activations are [S(0), B]), so it needs no communication."""
import engine as flow
import engine.nn as nn
import engine.nn.functional as F
from libai.utils import distributed as dist

from .utils import make_parameter, to_placement

__all__ = ["LayerNorm"]

B = flow.sbp.broadcast


class LayerNorm(nn.Module):
    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, bias=True, *, layer_idx=0,
                 dtype=None):
        super().__init__()
        if isinstance(normalized_shape, int):
            normalized_shape = (normalized_shape,)
        self.normalized_shape = tuple(int(n) for n in normalized_shape)
        self.eps = float(eps)
        self.elementwise_affine = elementwise_affine
        self.layer_idx = layer_idx
        placement = dist.get_layer_placement(layer_idx)
        sbp = dist.get_nd_sbp([B, B])
        if elementwise_affine:
            self.weight = make_parameter(self.normalized_shape, 1.0, placement, sbp, dtype)
            self.bias = make_parameter(self.normalized_shape, 0.0, placement, sbp, dtype) if bias else None
        else:
            self.weight = None
            self.bias = None
        self._placement = placement

    def forward(self, x):
        x = to_placement(x, self._placement)
        return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)

    def extra_repr(self):
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"
