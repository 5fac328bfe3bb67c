"""`LayerNorm` on global tensors: replicated parameters ([B, B]); rows of x may be split (the
activations are [S(0), B]), so it needs no communication.

`autocast_output=True` is for a layer norm whose output only matrix products read (a pre-LN
block's branch inputs, GPT-2's last norm before the LM head): under autocast the output comes in
the autocast dtype, the cast those products would make (F.layer_norm_into_autocast: on CUDA in
float16, folded into the layer norm's kernels). Same values and gradients either way."""
import engine as flow
import engine.nn as nn
import engine.nn.functional as F
from libai.utils import distributed as dist

from .utils import make_parameter, to_placement

__all__ = ["LayerNorm"]

B = flow.sbp.broadcast


class LayerNorm(nn.Module):
    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, bias=True, *, layer_idx=0,
                 dtype=None, autocast_output=False):
        super().__init__()
        self.autocast_output = autocast_output
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
        norm = F.layer_norm_into_autocast if self.autocast_output else F.layer_norm
        return norm(x, self.normalized_shape, self.weight, self.bias, self.eps)

    def extra_repr(self):
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"
