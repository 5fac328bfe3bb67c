"""`MLP`: Megatron's feed-forward block, column-parallel h -> ffn, GELU (tanh, as GPT-2),
row-parallel ffn -> h. The [S(0), S(-1)] intermediate stays on its tensor-parallel shard;
the only communication is the all-reduce of the row-parallel output."""
import engine.nn as nn
import engine.nn.functional as F

from .linear import Linear
from .utils import dropout, note_kernel_flags

__all__ = ["MLP"]


class MLP(nn.Module):
    def __init__(self, hidden_size, ffn_hidden_size, output_dropout_prob=0.0, init_method=nn.init.xavier_normal_,
                 output_layer_init_method=None, bias_gelu_fusion=False, bias_dropout_fusion=False, *,
                 layer_idx=0, activation="gelu_tanh"):
        super().__init__()
        if activation not in ("gelu_tanh", "gelu", "relu"):
            raise ValueError(f"MLP: activation must be 'gelu_tanh', 'gelu' or 'relu', got {activation!r}")
        self.activation = activation
        note_kernel_flags(bias_gelu_fusion=bias_gelu_fusion, bias_dropout_fusion=bias_dropout_fusion)
        self.output_dropout_prob = float(output_dropout_prob)
        output_layer_init_method = output_layer_init_method or init_method
        self.dense_h_to_4h = Linear(hidden_size, ffn_hidden_size, parallel="col", init_method=init_method,
                                    layer_idx=layer_idx)
        self.dense_4h_to_h = Linear(ffn_hidden_size, hidden_size, parallel="row",
                                    init_method=output_layer_init_method, layer_idx=layer_idx)

    def forward(self, hidden_states):
        x = self.dense_h_to_4h(hidden_states)
        if self.activation == "gelu_tanh":
            x = F.gelu(x, approximate="tanh")
        elif self.activation == "gelu":
            x = F.gelu(x)
        else:
            x = F.relu(x)
        x = self.dense_4h_to_h(x)
        return dropout(x, self.output_dropout_prob, self.training)
