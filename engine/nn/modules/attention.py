"""`MultiheadAttention`, torch's layer (parameter names, masks, shapes and return values), and the
functional `multi_head_attention_forward` it runs.

The attention itself goes two ways, as in torch: with need_weights=False (what the Transformer
layers ask for) through the fused tiled `F.scaled_dot_product_attention`, which never holds the
[batch * heads, L, S] probabilities; with need_weights=True through explicit scores, softmax and
dropout, because the caller wants those probabilities back.

Masks follow torch's conventions, which differ from SDPA's: here a boolean True means "may not
attend". Boolean masks are turned into additive float masks (-inf where True) and a key padding
mask is added to the attention mask, exactly as torch's `_canonical_mask` and merge do, so fully
masked rows behave as in torch too (NaN with need_weights=True, zeros through SDPA).
"""
import math
import warnings

from ...ops.creation import empty, zeros, zeros_like
from ...ops.shape import cat
from ...tensor import Parameter
from .. import functional as F
from .. import init
from ..module import Module
from .linear import Linear

__all__ = ["MultiheadAttention", "multi_head_attention_forward"]


class NonDynamicallyQuantizableLinear(Linear):
    """torch's name for MultiheadAttention.out_proj's class (a plain Linear; the name shows in reprs)."""


def canonical_mask(mask, name, target_dtype, other=None, other_name=""):
    """torch's `_canonical_mask`: a bool mask as an additive float mask of `target_dtype` (-inf
    where True), a float mask as it is; other dtypes are refused. A mask whose dtype differs from
    the `other` mask it will be combined with gets torch's deprecation warning."""
    if mask is None:
        return None
    if other is not None and other.dtype != mask.dtype:
        warnings.warn(f"Support for mismatched {name} and {other_name} is deprecated. Use same type for both "
                      "instead.", UserWarning, stacklevel=3)
    if mask.dtype.name == "bool":
        return zeros_like(mask, dtype=target_dtype).masked_fill_(mask, float("-inf"))
    if not mask.is_floating_point():
        raise AssertionError(f"only bool and floating types of {name} are supported, got {mask.dtype.name}")
    return mask


def _shape_check(query, key, value, key_padding_mask, attn_mask, num_heads):
    """torch's `_mha_shape_check`: whether the input is batched (3-D) or not (2-D)."""
    if query.ndim == 3:
        if key.ndim != 3 or value.ndim != 3:
            raise AssertionError(f"For batched (3-D) `query`, expected `key` and `value` to be 3-D but found "
                                 f"{key.ndim}-D and {value.ndim}-D tensors respectively")
        if key_padding_mask is not None and key_padding_mask.ndim != 2:
            raise AssertionError(f"For batched (3-D) `query`, expected `key_padding_mask` to be `None` or 2-D but "
                                 f"found {key_padding_mask.ndim}-D tensor instead")
        if attn_mask is not None and attn_mask.ndim not in (2, 3):
            raise AssertionError(f"For batched (3-D) `query`, expected `attn_mask` to be `None`, 2-D or 3-D but "
                                 f"found {attn_mask.ndim}-D tensor instead")
        return True
    if query.ndim == 2:
        if key.ndim != 2 or value.ndim != 2:
            raise AssertionError(f"For unbatched (2-D) `query`, expected `key` and `value` to be 2-D but found "
                                 f"{key.ndim}-D and {value.ndim}-D tensors respectively")
        if key_padding_mask is not None and key_padding_mask.ndim != 1:
            raise AssertionError(f"For unbatched (2-D) `query`, expected `key_padding_mask` to be `None` or 1-D but "
                                 f"found {key_padding_mask.ndim}-D tensor instead")
        if attn_mask is not None:
            if attn_mask.ndim not in (2, 3):
                raise AssertionError(f"For unbatched (2-D) `query`, expected `attn_mask` to be `None`, 2-D or 3-D "
                                     f"but found {attn_mask.ndim}-D tensor instead")
            expected = (num_heads, query.shape[0], key.shape[0])
            if attn_mask.ndim == 3 and tuple(attn_mask.shape) != expected:
                raise AssertionError(f"Expected `attn_mask` shape to be {expected} but got {tuple(attn_mask.shape)}")
        return False
    raise AssertionError(f"query should be unbatched 2D or batched 3D tensor but received {query.ndim}-D query tensor")


def _in_projection(query, key, value, w, b, separate):
    """q, k, v projected: with the packed [3E, E] weight (one product for self-attention, two when
    key is value), or with the three `separate` weights of different input sizes."""
    e = query.shape[-1]
    if separate is not None:
        bq, bk, bv = b.chunk(3) if b is not None else (None, None, None)
        return F.linear(query, separate[0], bq), F.linear(key, separate[1], bk), F.linear(value, separate[2], bv)
    if key is value:
        if query is key:
            return F.linear(query, w, b).chunk(3, dim=-1)
        w_q, w_kv = w.split([e, 2 * e])
        b_q, b_kv = b.split([e, 2 * e]) if b is not None else (None, None)
        return (F.linear(query, w_q, b_q),) + F.linear(key, w_kv, b_kv).chunk(2, dim=-1)
    bs = b.chunk(3) if b is not None else (None, None, None)
    return tuple(F.linear(x, wi, bi) for x, wi, bi in zip((query, key, value), w.chunk(3), bs))


def multi_head_attention_forward(query, key, value, embed_dim_to_check, num_heads, in_proj_weight, in_proj_bias,
                                 bias_k, bias_v, add_zero_attn, dropout_p, out_proj_weight, out_proj_bias,
                                 training=True, key_padding_mask=None, need_weights=True, attn_mask=None,
                                 use_separate_proj_weight=False, q_proj_weight=None, k_proj_weight=None,
                                 v_proj_weight=None, static_k=None, static_v=None, average_attn_weights=True,
                                 is_causal=False):
    """torch.nn.functional.multi_head_attention_forward on (L, N, E) / unbatched (L, E) inputs."""
    if static_k is not None or static_v is not None:
        raise NotImplementedError("multi_head_attention_forward: static_k / static_v are not implemented")
    batched = _shape_check(query, key, value, key_padding_mask, attn_mask, num_heads)
    if not batched:
        query, key, value = query.unsqueeze(1), key.unsqueeze(1), value.unsqueeze(1)
        if key_padding_mask is not None:
            key_padding_mask = key_padding_mask.unsqueeze(0)
    tgt_len, bsz, embed_dim = query.shape
    src_len = key.shape[0]
    key_padding_mask = canonical_mask(key_padding_mask, "key_padding_mask", query.dtype, attn_mask, "attn_mask")
    if is_causal and attn_mask is None:
        raise RuntimeError("Need attn_mask if specifying the is_causal hint. You may use the Transformer module "
                           "method `generate_square_subsequent_mask` to create this mask.")
    if is_causal and key_padding_mask is None and not need_weights:
        attn_mask = None  # the hint alone: SDPA applies the causal mask itself
    else:
        attn_mask = canonical_mask(attn_mask, "attn_mask", query.dtype)
        if key_padding_mask is not None:
            is_causal = False  # the merged mask is no longer causal
    if embed_dim != embed_dim_to_check:
        raise AssertionError(f"was expecting embedding dimension of {embed_dim_to_check}, but got {embed_dim}")
    head_dim = embed_dim // num_heads
    if head_dim * num_heads != embed_dim:
        raise AssertionError(f"embed_dim {embed_dim} not divisible by num_heads {num_heads}")
    if use_separate_proj_weight:
        if tuple(key.shape[:2]) != tuple(value.shape[:2]):
            raise AssertionError(f"key's sequence and batch dims {tuple(key.shape[:2])} do not match value's "
                                 f"{tuple(value.shape[:2])}")
        q, k, v = _in_projection(query, key, value, None, in_proj_bias, (q_proj_weight, k_proj_weight, v_proj_weight))
    else:
        if tuple(key.shape) != tuple(value.shape):
            raise AssertionError(f"key shape {tuple(key.shape)} does not match value shape {tuple(value.shape)}")
        q, k, v = _in_projection(query, key, value, in_proj_weight, in_proj_bias, None)

    if attn_mask is not None:
        if attn_mask.ndim == 2:
            if tuple(attn_mask.shape) != (tgt_len, src_len):
                raise RuntimeError(f"The shape of the 2D attn_mask is {list(attn_mask.shape)}, but should be "
                                   f"{(tgt_len, src_len)}.")
            attn_mask = attn_mask.unsqueeze(0)
        elif tuple(attn_mask.shape) != (bsz * num_heads, tgt_len, src_len):
            raise RuntimeError(f"The shape of the 3D attn_mask is {list(attn_mask.shape)}, but should be "
                               f"{(bsz * num_heads, tgt_len, src_len)}.")
    if (bias_k is None) != (bias_v is None):
        raise AssertionError("bias_k and bias_v must be given together")
    if bias_k is not None:  # one more key/value position, learnt
        k = cat([k, bias_k.expand(1, bsz, embed_dim)])
        v = cat([v, bias_v.expand(1, bsz, embed_dim)])
        attn_mask = F.pad(attn_mask, (0, 1)) if attn_mask is not None else None
        key_padding_mask = F.pad(key_padding_mask, (0, 1)) if key_padding_mask is not None else None

    q = q.reshape(tgt_len, bsz * num_heads, head_dim).transpose(0, 1)
    k = k.reshape(k.shape[0], bsz * num_heads, head_dim).transpose(0, 1)
    v = v.reshape(v.shape[0], bsz * num_heads, head_dim).transpose(0, 1)
    if add_zero_attn:  # one more key/value position of zeros
        k = cat([k, zeros(bsz * num_heads, 1, head_dim, dtype=k.dtype, device=k.device)], dim=1)
        v = cat([v, zeros(bsz * num_heads, 1, head_dim, dtype=v.dtype, device=v.device)], dim=1)
        attn_mask = F.pad(attn_mask, (0, 1)) if attn_mask is not None else None
        key_padding_mask = F.pad(key_padding_mask, (0, 1)) if key_padding_mask is not None else None
    src_len = k.shape[1]

    # the merged additive mask as [1 or bsz, 1 or heads, L or 1, S]: broadcast over what it does not
    # vary along, so the SDPA path never needs a [bsz * heads, L, S] copy of it
    if attn_mask is not None:
        rows = (1, 1) if attn_mask.shape[0] == 1 else (bsz, num_heads)  # a 2-D mask, or one per batch and head
        attn_mask = attn_mask.reshape(*rows, tgt_len, src_len)
    if key_padding_mask is not None:
        if tuple(key_padding_mask.shape) != (bsz, src_len):
            raise AssertionError(f"Expected key_padding_mask of shape {(bsz, src_len)}, got "
                                 f"{tuple(key_padding_mask.shape)}")
        kpm = key_padding_mask.reshape(bsz, 1, 1, src_len)
        attn_mask = kpm if attn_mask is None else attn_mask + kpm
    if not training:
        dropout_p = 0.0

    if need_weights:
        q_scaled = q * math.sqrt(1.0 / float(head_dim))
        weights = q_scaled.bmm(k.transpose(-2, -1))
        if attn_mask is not None:
            weights = (weights.reshape(bsz, num_heads, tgt_len, src_len) + attn_mask).reshape(
                bsz * num_heads, tgt_len, src_len)
        weights = F.softmax(weights, dim=-1)
        if dropout_p > 0.0:
            weights = F.dropout(weights, p=dropout_p)
        out = weights.bmm(v).transpose(0, 1).reshape(tgt_len * bsz, embed_dim)
        out = F.linear(out, out_proj_weight, out_proj_bias).reshape(tgt_len, bsz, embed_dim)
        weights = weights.reshape(bsz, num_heads, tgt_len, src_len)
        if average_attn_weights:
            weights = weights.mean(dim=1)
        if not batched:
            out, weights = out.squeeze(1), weights.squeeze(0)
        return out, weights

    q = q.reshape(bsz, num_heads, tgt_len, head_dim)
    k = k.reshape(bsz, num_heads, src_len, head_dim)
    v = v.reshape(bsz, num_heads, src_len, head_dim)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask, dropout_p, is_causal)
    out = out.permute(2, 0, 1, 3).reshape(bsz * tgt_len, embed_dim)
    out = F.linear(out, out_proj_weight, out_proj_bias).reshape(tgt_len, bsz, embed_dim)
    return (out if batched else out.squeeze(1)), None


class MultiheadAttention(Module):
    """torch.nn.MultiheadAttention: in_proj_weight [3E, E] (or q/k/v_proj_weight when kdim / vdim
    differ from embed_dim), in_proj_bias [3E], out_proj (a Linear), optional bias_k / bias_v.

    forward(query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
    average_attn_weights=True, is_causal=False) -> (output, weights or None). Inputs are (L, N, E),
    (N, L, E) with batch_first, or unbatched (L, E). torch's inference fast path
    (`torch._native_multi_head_attention`) computes the same values and is not reproduced."""

    def __init__(self, embed_dim, num_heads, dropout=0.0, bias=True, add_bias_kv=False, add_zero_attn=False,
                 kdim=None, vdim=None, batch_first=False, device=None, dtype=None):
        if embed_dim <= 0 or num_heads <= 0:
            raise ValueError(f"embed_dim and num_heads must be greater than 0, got embed_dim={embed_dim} and "
                             f"num_heads={num_heads} instead")
        super().__init__()
        factory = {"device": device, "dtype": dtype}
        self.embed_dim = embed_dim
        self.kdim = kdim if kdim is not None else embed_dim
        self.vdim = vdim if vdim is not None else embed_dim
        self._qkv_same_embed_dim = self.kdim == embed_dim and self.vdim == embed_dim
        self.num_heads = num_heads
        self.dropout = dropout
        self.batch_first = batch_first
        self.head_dim = embed_dim // num_heads
        if self.head_dim * num_heads != embed_dim:
            raise AssertionError("embed_dim must be divisible by num_heads")
        if not self._qkv_same_embed_dim:
            self.q_proj_weight = Parameter(empty(embed_dim, embed_dim, **factory))
            self.k_proj_weight = Parameter(empty(embed_dim, self.kdim, **factory))
            self.v_proj_weight = Parameter(empty(embed_dim, self.vdim, **factory))
            self.register_parameter("in_proj_weight", None)
        else:
            self.in_proj_weight = Parameter(empty(3 * embed_dim, embed_dim, **factory))
            self.register_parameter("q_proj_weight", None)
            self.register_parameter("k_proj_weight", None)
            self.register_parameter("v_proj_weight", None)
        if bias:
            self.in_proj_bias = Parameter(empty(3 * embed_dim, **factory))
        else:
            self.register_parameter("in_proj_bias", None)
        self.out_proj = NonDynamicallyQuantizableLinear(embed_dim, embed_dim, bias=bias, **factory)
        if add_bias_kv:
            self.bias_k = Parameter(empty(1, 1, embed_dim, **factory))
            self.bias_v = Parameter(empty(1, 1, embed_dim, **factory))
        else:
            self.bias_k = self.bias_v = None
        self.add_zero_attn = add_zero_attn
        self._reset_parameters()

    def _reset_parameters(self):
        if self._qkv_same_embed_dim:
            init.xavier_uniform_(self.in_proj_weight)
        else:
            init.xavier_uniform_(self.q_proj_weight)
            init.xavier_uniform_(self.k_proj_weight)
            init.xavier_uniform_(self.v_proj_weight)
        if self.in_proj_bias is not None:
            init.constant_(self.in_proj_bias, 0.0)
            init.constant_(self.out_proj.bias, 0.0)
        if self.bias_k is not None:
            init.xavier_normal_(self.bias_k)
        if self.bias_v is not None:
            init.xavier_normal_(self.bias_v)

    def forward(self, query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
                average_attn_weights=True, is_causal=False):
        batched = query.ndim == 3
        if self.batch_first and batched:
            if key is value:
                if query is key:
                    query = key = value = query.transpose(1, 0)
                else:
                    query, key = (x.transpose(1, 0) for x in (query, key))
                    value = key
            else:
                query, key, value = (x.transpose(1, 0) for x in (query, key, value))
        separate = not self._qkv_same_embed_dim
        out, weights = multi_head_attention_forward(
            query, key, value, self.embed_dim, self.num_heads, self.in_proj_weight, self.in_proj_bias,
            self.bias_k, self.bias_v, self.add_zero_attn, self.dropout, self.out_proj.weight, self.out_proj.bias,
            training=self.training, key_padding_mask=key_padding_mask, need_weights=need_weights,
            attn_mask=attn_mask, use_separate_proj_weight=separate, q_proj_weight=self.q_proj_weight,
            k_proj_weight=self.k_proj_weight, v_proj_weight=self.v_proj_weight,
            average_attn_weights=average_attn_weights, is_causal=is_causal)
        if self.batch_first and batched:
            out = out.transpose(1, 0)
        return out, weights
