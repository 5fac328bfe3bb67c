"""`MultiheadAttention` on global tensors, heads split over the tensor-parallel ranks.

Layout (Megatron / LiBai):

* `query_key_value`: one column-parallel Linear hidden -> 3 * hidden whose output features are
  ordered per head, [num_heads, 3, head_size] (q, k and v of head 0, then of head 1, ...). A
  tensor-parallel shard of the weight (S(0) on the output features) therefore holds whole
  heads with their q, k and v: rank r of tp owns heads [r * H/tp, (r + 1) * H/tp).
* The attention itself (scores, mask, softmax, dropout, context) is per head, so it runs on
  each rank's shard with no communication: the [S(0), S(-1)] qkv tensor is read as its local
  shard (`to_local`) and the context goes back with `to_global(sbp=[S(0), S(-1)])` (the
  gradients of both casts are the same splits, so backward needs no communication either).
* `dense`: the row-parallel output projection (partial sums all-reduced, then the bias).

Masks: `attn_mask_type="causal"` masks future keys (with a KV cache, the query at position
past + i sees keys 0..past + i); an `attention_mask` (1/True = attend, 0/False = masked),
broadcastable to [batch, heads, q_len, k_len] — e.g. [batch, 1, 1, k_len] padding, or
[batch, k_len] — is combined with it. Scores are scaled by 1/sqrt(head_size) and masked with
-10000 before the softmax (the engine's fused `scale_mask_softmax`).

KV cache: `forward(..., past_key_value=(k, v), use_cache=True)` returns `(output, (k, v))`,
k and v local tensors [batch_shard, heads_shard, past + q_len, head_size] (this rank's shard).
"""
import math

import engine as flow
import engine.nn as nn
import engine.nn.functional as F
from libai.utils import distributed as dist

from .linear import Linear
from .utils import dropout, note_kernel_flags, split_on_dp

__all__ = ["MultiheadAttention", "AttnMaskType"]

B = flow.sbp.broadcast
S = flow.sbp.split


class AttnMaskType:
    padding = "padding"
    causal = "causal"


def _mask_type(value):
    value = getattr(value, "value", value)
    value = getattr(value, "name", value) if not isinstance(value, str) else value
    if value not in ("padding", "causal"):
        raise ValueError(f"attn_mask_type must be 'padding' or 'causal', got {value!r}")
    return value


def _local_rows(mask, batch_global, batch_local):
    """The rows of a (local, whole-batch) mask that belong to this rank's batch shard."""
    if mask.shape[0] == 1 or batch_local == batch_global:
        return mask
    dp_rank = dist.get_data_parallel_rank()
    return mask[dp_rank * batch_local:(dp_rank + 1) * batch_local]


class MultiheadAttention(nn.Module):
    def __init__(self, hidden_size, num_attention_heads, is_cross_attention=False,
                 attention_dropout_prob=0.0, output_dropout_prob=0.0, init_method=nn.init.xavier_normal_,
                 output_layer_init_method=None, bias_dropout_fusion=False, scale_mask_softmax_fusion=False,
                 apply_query_key_layer_scaling=False, attn_mask_type="padding", *, layer_idx=0):
        super().__init__()
        if is_cross_attention:
            raise NotImplementedError("MultiheadAttention: cross attention is not implemented")
        self.hidden_size = int(hidden_size)
        self.num_heads = int(num_attention_heads)
        if self.hidden_size % self.num_heads != 0:
            raise ValueError(f"MultiheadAttention: hidden_size ({hidden_size}) must be divisible by "
                             f"num_attention_heads ({num_attention_heads})")
        dist.check_tensor_parallel_divisible(self.num_heads, "MultiheadAttention: num_attention_heads")
        self.head_size = self.hidden_size // self.num_heads
        self.attention_dropout_prob = float(attention_dropout_prob)
        self.output_dropout_prob = float(output_dropout_prob)
        self.attn_mask_type = _mask_type(attn_mask_type)
        # apply_query_key_layer_scaling (Megatron: divide by layer_number before an fp16
        # softmax, multiply back inside it) gives the same values in float32; noted in the log
        self.apply_query_key_layer_scaling = apply_query_key_layer_scaling
        note_kernel_flags(bias_dropout_fusion=bias_dropout_fusion, scale_mask_softmax_fusion=scale_mask_softmax_fusion,
                          apply_query_key_layer_scaling=apply_query_key_layer_scaling)
        self.norm_factor = 1.0 / math.sqrt(self.head_size)
        self.layer_idx = layer_idx
        output_layer_init_method = output_layer_init_method or init_method
        self.query_key_value = Linear(self.hidden_size, 3 * self.hidden_size, parallel="col",
                                      init_method=init_method, layer_idx=layer_idx)
        self.dense = Linear(self.hidden_size, self.hidden_size, parallel="row",
                            init_method=output_layer_init_method, layer_idx=layer_idx)

    def _core(self, qkv, attention_mask, past_key_value, batch_global, use_cache):
        """Attention on this rank's shard: qkv local [b, s, heads_l * 3 * d]."""
        b, s = qkv.shape[0], qkv.shape[1]
        heads = qkv.shape[2] // (3 * self.head_size)
        if past_key_value is None:
            # the engine's fused core: same arithmetic as the separate ops below, one op; the causal
            # part of the mask goes as a flag (flash attention on CUDA skips the masked tiles)
            causal = self.attn_mask_type == "causal"
            masked = self._mask(s, s, 0, attention_mask, batch_global, b, qkv.device, causal=not causal)
            ctx = F.packed_qkv_attention(qkv, heads, masked, scale=self.norm_factor, fill=-10000.0,
                                         dropout_p=self.attention_dropout_prob, training=self.training,
                                         causal=causal)
            present = None
            if use_cache:
                present = tuple(t.permute(0, 2, 1, 3)
                                for t in qkv.view(b, s, heads, 3 * self.head_size).chunk(3, dim=-1)[1:])
            return ctx, present
        # chunk first, then permute each part: the three [b, s, heads, d] views are permuted to
        # [b, heads, s, d] views (no copies), and in backward the chunk's concatenation of the
        # (permuted) gradients writes the [b, s, heads, 3d] qkv gradient directly in the layout
        # of the Linear output, so the view back to [b, s, heads * 3d] needs no second copy
        q, k, v = (t.permute(0, 2, 1, 3) for t in qkv.view(b, s, heads, 3 * self.head_size).chunk(3, dim=-1))
        if past_key_value is not None:
            pk, pv = past_key_value
            k = flow.cat([pk, k], dim=2)
            v = flow.cat([pv, v], dim=2)
        kv_len = k.shape[2]
        scores = flow.matmul(q, k.transpose(-1, -2))
        masked = self._mask(s, kv_len, kv_len - s, attention_mask, batch_global, b, scores.device)
        probs = F.scale_mask_softmax(scores, masked, scale=self.norm_factor, fill=-10000.0)
        if self.training and self.attention_dropout_prob > 0:
            probs = F.dropout(probs, self.attention_dropout_prob, training=True)
        ctx = flow.matmul(probs, v)  # [b, heads_l, s, d]
        ctx = ctx.permute(0, 2, 1, 3).reshape(b, s, heads * self.head_size)
        return ctx, (k, v)

    def _mask(self, s, kv_len, past, attention_mask, batch_global, b, device, causal=True):
        """The bool mask (True = masked out) of s queries over kv_len keys, the first `past` of
        them cached: causal (unless `causal` is False) and/or padding, broadcastable to
        [b, heads, s, kv_len]; or None. Built on the scores' `device`."""
        masked = None
        if causal and self.attn_mask_type == "causal":
            qpos = flow.arange(past, kv_len, device=device).view(s, 1)
            kpos = flow.arange(kv_len, device=device).view(1, kv_len)
            masked = (kpos > qpos).view(1, 1, s, kv_len)
        if attention_mask is not None:
            keep = attention_mask.to(device)  # a host mask given with device inputs is copied over
            if keep.ndim == 2:  # [batch, k_len]
                keep = keep.view(keep.shape[0], 1, 1, keep.shape[1])
            keep = _local_rows(keep, batch_global, b)
            pad = keep == 0 if keep.dtype != flow.bool else keep.logical_not()
            masked = pad if masked is None else (masked | pad)
        return masked

    def forward(self, hidden_states, attention_mask=None, past_key_value=None, use_cache=False):
        qkv = self.query_key_value(hidden_states)  # [S(0), S(-1)]: heads split over tp
        placement = qkv.placement
        dp_sbp = S(0) if split_on_dp(qkv.shape) else B
        sbp = dist.get_nd_sbp([dp_sbp, S(2)])
        qkv = qkv.to_global(sbp=sbp)
        if attention_mask is not None:
            if not isinstance(attention_mask, flow.Tensor):
                attention_mask = flow.tensor(attention_mask)
            if attention_mask._global is not None:
                attention_mask = attention_mask.to_global(sbp=[B] * attention_mask.placement.ndim).to_local()
        ctx, present = self._core(qkv.to_local(), attention_mask, past_key_value, qkv.shape[0], use_cache)
        ctx = ctx.to_global(placement=placement, sbp=sbp)
        out = self.dense(ctx)  # row-parallel: [S(0), B]
        out = dropout(out, self.output_dropout_prob, self.training)
        if use_cache:
            return out, present
        return out

    def extra_repr(self):
        return (f"hidden_size={self.hidden_size}, num_heads={self.num_heads}, "
                f"attn_mask_type={self.attn_mask_type}")
