"""Parity cases for engine/ops/attention.py: the attention core on a packed QKV projection,
against the same computation written with PyTorch's separate ops."""
import numpy as np
import torch

from harness import Input as I, OpCase

CASES = []


def _attention(m, qkv, mask=None, heads=2, scale=None, fill=-10000.0, bias=None):
    if m is not torch:
        return m.nn.functional.packed_qkv_attention(qkv, heads, mask, scale=scale, fill=fill, bias=bias)
    lead, s = tuple(qkv.shape[:-2]), qkv.shape[-2]
    d = qkv.shape[-1] // (3 * heads)
    q, k, v = (t.transpose(-3, -2) for t in qkv.reshape(*lead, s, heads, 3 * d).chunk(3, dim=-1))
    scores = (q @ k.transpose(-1, -2)) * (d ** -0.5 if scale is None else scale)
    if bias is not None:
        scores = scores + bias
    if mask is not None:
        scores = scores.masked_fill(mask, fill)
    return (scores.softmax(-1) @ v).transpose(-3, -2).reshape(*lead, s, heads * d)


def _mask(value):
    return I(value=np.asarray(value, bool), dtype="bool")


_CAUSAL = np.triu(np.ones((5, 5), bool), 1)
_PAD = np.array([[False] * 5, [False, False, False, True, True], [False] + [True] * 4])[:, None, None, :]
_ALL_MASKED_ROW = np.zeros((1, 1, 5, 5), bool)
_ALL_MASKED_ROW[..., 2, :] = True
CASES += [
    OpCase("packed_qkv_attention", _attention, [I((3, 5, 12))], name="nomask"),
    OpCase("packed_qkv_attention", _attention, [I((3, 5, 12)), _mask(_CAUSAL)], name="causal"),
    OpCase("packed_qkv_attention", _attention, [I((3, 5, 12)), _mask(_PAD)], name="padding"),
    OpCase("packed_qkv_attention", _attention, [I((3, 5, 12)), _mask(_PAD | _CAUSAL)], name="causal+padding"),
    OpCase("packed_qkv_attention", _attention, [I((2, 5, 12)), _mask(_ALL_MASKED_ROW)], name="fully-masked-row"),
    OpCase("packed_qkv_attention", lambda m, x, k: _attention(m, x, k, fill=float("-inf")),
           [I((2, 5, 12)), _mask(_CAUSAL)], name="neg-inf-fill"),
    OpCase("packed_qkv_attention", lambda m, x: _attention(m, x, heads=1, scale=0.3), [I((2, 4, 9))],
           name="one-head-scale"),
    OpCase("packed_qkv_attention", _attention, [I((3, 5, 12), noncontig=True), _mask(_CAUSAL)], name="noncontig"),
    OpCase("packed_qkv_attention", lambda m, x: _attention(m, x, heads=3), [I((2, 1, 18))], name="seq1"),
    OpCase("packed_qkv_attention", lambda m, x: _attention(m, x, heads=4), [I((5, 7, 24), dtype="float64")],
           name="float64"),
    # an additive bias with its gradient: shared, per row, Swin's windows (a second batch axis)
    OpCase("packed_qkv_attention", lambda m, x, bb: _attention(m, x, bias=bb), [I((3, 5, 12)), I((2, 5, 5))],
           name="bias-shared"),
    OpCase("packed_qkv_attention", lambda m, x, bb, k: _attention(m, x, k, bias=bb),
           [I((3, 5, 12)), I((3, 2, 5, 5)), _mask(_PAD)], name="bias-per-row+padding"),
    OpCase("packed_qkv_attention", lambda m, x, bb: _attention(m, x, bias=bb), [I((2, 4, 5, 12)), I((4, 2, 5, 5))],
           name="bias-windows"),
]


# ------------------------------------------------------------------ scaled_dot_product_attention
def _sdpa(**kw):
    return lambda m, q, k, v, *mask: m.nn.functional.scaled_dot_product_attention(
        q, k, v, *mask, **kw)


_SDPA_QKV = [I((2, 3, 5, 4)), I((2, 3, 6, 4)), I((2, 3, 6, 3))]
CASES += [
    OpCase("scaled_dot_product_attention", _sdpa(), _SDPA_QKV, name="plain"),
    OpCase("scaled_dot_product_attention", _sdpa(is_causal=True), _SDPA_QKV, name="causal"),
    OpCase("scaled_dot_product_attention", _sdpa(scale=0.5),
           _SDPA_QKV + [_mask(np.arange(6)[None, None, None, :] < np.array([6, 3])[:, None, None, None])],
           name="bool-padding-scale"),
    OpCase("scaled_dot_product_attention", _sdpa(), _SDPA_QKV + [I((3, 5, 6))], name="float-mask-grad"),
    OpCase("scaled_dot_product_attention", _sdpa(enable_gqa=True),
           [I((1, 4, 3, 4)), I((1, 2, 5, 4)), I((1, 1, 5, 2), noncontig=True)], name="gqa-noncontig"),
    OpCase("scaled_dot_product_attention", _sdpa(is_causal=True),
           [I((7, 3), "float64"), I((4, 3), "float64"), I((4, 2), "float64")], name="float64-L>S"),
]
