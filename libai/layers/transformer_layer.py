"""`TransformerLayer`: self-attention + MLP with residuals, pre-LN (GPT-2, default) or post-LN
(the original BERT).

    pre-LN:  h = x + attn(ln1(x));  out = h + mlp(ln2(h))   (each branch through DropPath when
             drop_path_prob > 0: stochastic depth, ViT/Swin)
             (apply_residual_post_layernorm: the residuals start from ln1(x) / ln2(h))
    post-LN: h = ln1(x + attn(x));  out = ln2(h + mlp(h))

The input is moved to the layer's placement first (its pipeline stage).
"""
import engine.nn as nn
from libai.utils import distributed as dist

from .attention import MultiheadAttention
from .layer_norm import LayerNorm
from .mlp import MLP
from .utils import Recomputable, to_placement
from .vision import DropPath

__all__ = ["TransformerLayer"]


class TransformerLayer(Recomputable, nn.Module):
    def __init__(self, hidden_size, ffn_hidden_size, num_attention_heads, is_decoder=False,
                 attention_dropout_prob=0.0, output_dropout_prob=0.0, drop_path_prob=0.0,
                 layernorm_epsilon=1e-5, init_method=nn.init.xavier_normal_, output_layer_init_method=None,
                 bias_gelu_fusion=False, bias_dropout_fusion=False, scale_mask_softmax_fusion=False,
                 apply_query_key_layer_scaling=False, apply_residual_post_layernorm=False,
                 attn_mask_type="padding", *, layer_idx=0, layernorm_position="pre", activation="gelu_tanh"):
        super().__init__()
        if is_decoder:
            raise NotImplementedError("TransformerLayer: decoder layers (cross attention) are not implemented")
        if layernorm_position not in ("pre", "post"):
            raise ValueError(f"layernorm_position must be 'pre' or 'post', got {layernorm_position!r}")
        self.layernorm_position = layernorm_position
        self.apply_residual_post_layernorm = apply_residual_post_layernorm
        self.layer_idx = layer_idx
        self.drop_path = DropPath(drop_path_prob) if drop_path_prob > 0.0 else None
        output_layer_init_method = output_layer_init_method or init_method
        # pre-LN, the residuals from x and h: the norms' outputs feed only the attention's and the
        # MLP's first products (autocast_output: in the autocast dtype, the cast folded in)
        branch_only = layernorm_position == "pre" and not apply_residual_post_layernorm
        self.input_layernorm = LayerNorm(hidden_size, eps=layernorm_epsilon, layer_idx=layer_idx,
                                         autocast_output=branch_only)
        self.self_attention = MultiheadAttention(
            hidden_size, num_attention_heads, attention_dropout_prob=attention_dropout_prob,
            output_dropout_prob=output_dropout_prob, init_method=init_method,
            output_layer_init_method=output_layer_init_method, bias_dropout_fusion=bias_dropout_fusion,
            scale_mask_softmax_fusion=scale_mask_softmax_fusion,
            apply_query_key_layer_scaling=apply_query_key_layer_scaling, attn_mask_type=attn_mask_type,
            layer_idx=layer_idx)
        self.post_attention_layernorm = LayerNorm(hidden_size, eps=layernorm_epsilon, layer_idx=layer_idx,
                                                  autocast_output=branch_only)
        self.mlp = MLP(hidden_size, ffn_hidden_size, output_dropout_prob=output_dropout_prob,
                       init_method=init_method, output_layer_init_method=output_layer_init_method,
                       bias_gelu_fusion=bias_gelu_fusion, bias_dropout_fusion=bias_dropout_fusion,
                       layer_idx=layer_idx, activation=activation)

    def _branch(self, y):
        """A residual branch's output, through stochastic depth when drop_path_prob > 0."""
        return self.drop_path(y) if self.drop_path is not None else y

    def _mlp_residual(self, x, residual):
        """residual + branch(mlp(x)); with bias_dropout_fusion on CUDA (and no stochastic depth)
        the residual is added in the MLP's fused bias + dropout + residual kernel."""
        if self.mlp.bias_dropout_fusion and self.drop_path is None:
            return self.mlp(x, residual=residual)
        return residual + self._branch(self.mlp(x))

    def forward(self, hidden_states, attention_mask=None, past_key_value=None, use_cache=False):
        x = to_placement(hidden_states, dist.get_layer_placement(self.layer_idx))
        present = None
        if self.layernorm_position == "pre":
            ln = self.input_layernorm(x)
            attn = self.self_attention(ln, attention_mask, past_key_value=past_key_value, use_cache=use_cache)
            if use_cache:
                attn, present = attn
            h = (ln if self.apply_residual_post_layernorm else x) + self._branch(attn)
            ln = self.post_attention_layernorm(h)
            out = self._mlp_residual(ln, ln if self.apply_residual_post_layernorm else h)
        else:
            attn = self.self_attention(x, attention_mask, past_key_value=past_key_value, use_cache=use_cache)
            if use_cache:
                attn, present = attn
            h = self.input_layernorm(x + self._branch(attn))
            out = self.post_attention_layernorm(self._mlp_residual(h, h))
        if use_cache:
            return out, present
        return out
