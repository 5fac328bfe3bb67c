"""`MLP`: Megatron's feed-forward block, column-parallel h -> ffn, GELU (tanh, as GPT-2),
row-parallel ffn -> h. The [S(0), S(-1)] intermediate stays on its tensor-parallel shard;
the only communication is the all-reduce of the row-parallel output.

LiBai's fusion flags take effect on CUDA placements (decided when the layer is built):
`bias_gelu_fusion` makes the first Linear leave its bias to the fused bias + GELU kernel, and
`bias_dropout_fusion` the second leave its bias to the fused bias + dropout (+ residual) kernel
(`forward(x, residual=r)` returns r + dropout(mlp(x)) in that kernel). On the CPU the bias rides
in the matmul already, so the flags change nothing there."""
import engine as flow
import engine.nn as nn
import engine.nn.functional as F
from engine.ops.dropout import bias_dropout_add
from engine.ops.unary import bias_gelu
from libai.utils import distributed as dist

from .linear import Linear
from .utils import dropout, note_kernel_flags

__all__ = ["MLP"]

_GELU_APPROXIMATION = {"gelu_tanh": "tanh", "gelu": "none"}


class MLP(nn.Module):
    def __init__(self, hidden_size, ffn_hidden_size, output_dropout_prob=0.0, init_method=nn.init.xavier_normal_,
                 output_layer_init_method=None, bias_gelu_fusion=False, bias_dropout_fusion=False, *,
                 layer_idx=0, activation="gelu_tanh"):
        super().__init__()
        if activation not in ("gelu_tanh", "gelu", "relu"):
            raise ValueError(f"MLP: activation must be 'gelu_tanh', 'gelu' or 'relu', got {activation!r}")
        self.activation = activation
        note_kernel_flags(bias_gelu_fusion=bias_gelu_fusion, bias_dropout_fusion=bias_dropout_fusion)
        on_cuda = dist.get_layer_placement(layer_idx).type == "cuda"
        self.bias_gelu_fusion = bool(bias_gelu_fusion) and on_cuda and activation in _GELU_APPROXIMATION
        self.bias_dropout_fusion = bool(bias_dropout_fusion) and on_cuda
        self.output_dropout_prob = float(output_dropout_prob)
        output_layer_init_method = output_layer_init_method or init_method
        self.dense_h_to_4h = Linear(hidden_size, ffn_hidden_size, parallel="col", init_method=init_method,
                                    skip_bias_add=self.bias_gelu_fusion, layer_idx=layer_idx)
        self.dense_4h_to_h = Linear(ffn_hidden_size, hidden_size, parallel="row",
                                    init_method=output_layer_init_method, skip_bias_add=self.bias_dropout_fusion,
                                    layer_idx=layer_idx)

    def forward(self, hidden_states, residual=None):
        """The block's output, or `residual` + it when a residual is given."""
        x = self.dense_h_to_4h(hidden_states)
        if self.bias_gelu_fusion:
            x, bias = x
            x = bias_gelu(x, bias.to(x.dtype), approximate=_GELU_APPROXIMATION[self.activation])
        elif self.activation == "relu":
            x = F.relu(x)
        else:
            x = F.gelu(x, approximate=_GELU_APPROXIMATION[self.activation])
        x = self.dense_4h_to_h(x)
        if self.bias_dropout_fusion:
            return _bias_dropout_add(*x, residual, self.output_dropout_prob, self.training)
        x = dropout(x, self.output_dropout_prob, self.training)
        return x if residual is None else residual + x


def _bias_dropout_add(x, bias, residual, p, training):
    """The fused residual + dropout(x + bias) in the dtypes of the separate ops: the bias in the
    Linear output's dtype (as autocast's linear takes it), then the wider of that and the
    residual's (a float16 branch added to a float32 residual stream is float32)."""
    bias = bias.to(x.dtype)
    if residual is not None and residual.dtype != x.dtype:
        dtype = flow.promote_types(x.dtype, residual.dtype)
        x, bias, residual = x.to(dtype), bias.to(dtype), residual.to(dtype)
    return bias_dropout_add(x, bias, residual, p, training)
