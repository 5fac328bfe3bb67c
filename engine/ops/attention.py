"""The attention core of a Transformer layer as one op, on the packed QKV projection.

    ctx = dropout(softmax(q k^T * scale, masked_fill(mask, fill))) @ v

with q, k, v read from `qkv` [b, s, heads * 3 * d], each head's [q | k | v] side by side (the
packed layout of Megatron-LM and LiBai), and ctx written as [b, s, heads * d], ready for the
output projection. Its gradient is one array in the layout of `qkv`.

Why one op: written as separate ops (two matmuls over permuted views, the fused softmax, dropout,
a permute-and-copy of the context, and in backward the concatenation of the q/k/v gradients), the
core of a BERT layer at sequence 128 streams its [b, heads, s, s] score tensors through memory
once per op and copies the context and the QKV gradient once more each. Here the work runs a
block of batch rows at a time, the blocks spread over the engine's threads; the products are MKL
batched calls (engine.backend.mkl) that read q, k, v in place and write the context and the
gradients straight into their final layouts. BERT benchmark (6 layers, batch 16, sequence 128):
attention forward + backward ~104 ms per step as separate ops, ~58 ms fused. The arithmetic is
the separate ops' (same products, same softmax kernels): tests/test_attention_op.py checks the
two against each other, forward and backward, with masks, dropout and fully masked rows.

Dropout draws one uniform array of the scores' shape from the generator, as F.dropout on the
probabilities would, so a run keeps its random stream whether the core is fused or not.
"""
import numpy as np

from ..backend import mkl, xp_of
from ..backend.parallel import parallel_map
from ..backend.random import default_generator
from ._core import NoDoubleBackward, check_float, shape_str, sum_to_array
from ._kernels import as_float32, empty, fill_where, ignore_fp_errors, low_precision, select_bits
from .dropout import scaled_keep_mask
from .op import Op, autocast_unifies
from .softmax import _softmax_grad_rows, _softmax_rows

__all__ = ["packed_qkv_attention"]


def _bmm_into(a, b, out):
    """out[...] = a @ b for stacked matrices, in place. `out` may be a strided view into a bigger
    array (the per-head parts of the context or of dqkv): then the products go to a contiguous
    block first (it stays in cache) and are copied into place."""
    xp = xp_of(a)
    if xp is not np:
        xp.matmul(a, b, out=out)
    elif not mkl.gemm_batched(a, b, out):
        if out.flags.c_contiguous:
            np.matmul(a, b, out=out)
        else:
            tmp = np.empty(out.shape, out.dtype)
            if not mkl.gemm_batched(a, b, tmp):
                np.matmul(a, b, out=tmp)
            out[...] = tmp


def _heads(qkv4, d, part):
    """[rows, heads, s, d] view of q (part 0), k (1) or v (2) in a [rows, s, heads, 3d] block."""
    return qkv4[..., part * d:(part + 1) * d].transpose(0, 2, 1, 3)


def _as_groups(arr, lead):
    """A mask or bias broadcastable to [*lead, heads, s, s] as [n or 1, G or 1, ...3 dims]: the
    batch seen as n outer rows (lead[0]) of G = prod(lead[1:]) inner ones. Only a mask or bias
    that varies along the inner axes is copied (broadcast over them, e.g. Swin's [windows, ...]
    bias under [images, windows]); that copy is G times the bias, never the scores' size. A
    strided one (a permuted bias table) is made contiguous: the per-block passes over the scores
    read it many times, and a strided innermost axis makes each pass several times slower."""
    full = len(lead) + 3
    arr = xp_of(arr).ascontiguousarray(arr).reshape((1,) * (full - arr.ndim) + tuple(arr.shape))
    a0, inner, tail = arr.shape[0], arr.shape[1:len(lead)], arr.shape[len(lead):]
    if all(m == 1 for m in inner):
        return arr.reshape((a0, 1) + tail)
    groups = int(np.prod(lead[1:]))
    return xp_of(arr).broadcast_to(arr, (a0,) + tuple(lead[1:]) + tail).reshape((a0, groups) + tail)


def _rows_at(arr, i0, i1, n):
    """Outer rows [i0:i1] of an array broadcast along them (size n or 1)."""
    return arr[i0:i1] if arr.shape[0] == n else arr


# scores per block of batch rows: measured on the BERT benchmark's attention (16 x 6 x 128 x 128),
# fwd + bwd 12.9 ms one row at a time, 11.3 ms at 2^17, 10.3 ms from 2^19 on (fewer, larger MKL
# calls; the blocks no longer fit L2 but the products and the softmax passes do not mind)
ROW_BLOCK_ELEMENTS = 1 << 19
# Each block costs some 25 numpy and MKL calls (~0.2 ms fwd + bwd with two threads taking turns
# at the GIL), so small calls are cut in as few blocks as can keep two threads busy: measured on
# Swin's window attention (16 images, windows of 16 tokens), fwd + bwd of a [16, 16 windows,
# 6 heads] call 7.6 ms in one block, 5.1 in two, 6.0 in four, 8.5 in eight; of a [16, 1, 24 heads]
# call (98K scores) 2.2 ms in one, 2.7 in two. So: one block below SPLIT_MIN_ELEMENTS scores, else
# at least two, and a power of two of them (even shares for 2 or 4 threads; 3 blocks on 2
# threads left one thread twice the work). The count depends on the shapes only, never on the
# thread count, so neither does a sum over the blocks' results.
SPLIT_MIN_ELEMENTS = 1 << 17


def _for_row_blocks(xp, n, fn, work, row_elements):
    """[fn(i0, i1) for each block of outer rows] (see ROW_BLOCK_ELEMENTS) spread over the
    engine's threads on the CPU; on the GPU all rows in one call."""
    if xp is not np:
        return [fn(0, n)]
    total = n * row_elements
    blocks = max(-(-total // ROW_BLOCK_ELEMENTS), 2 if total >= SPLIT_MIN_ELEMENTS else 1)
    blocks = min(n, 1 << (blocks - 1).bit_length())
    step = -(-n // blocks)
    starts = range(0, n, step)
    return parallel_map(lambda j: fn(starts[j], min(starts[j] + step, n)), len(starts), work)


class _Layout:
    """Shapes of one call: the batch [*lead] as n outer rows of G inner ones (b = n * G rows of
    [heads, s, s] scores), and the mask and bias in that grouping (see _as_groups)."""

    def __init__(self, qkv, heads, mask, bias):
        self.lead = tuple(qkv.shape[:-2])
        self.s = qkv.shape[-2]
        self.heads = heads
        self.d = qkv.shape[-1] // (3 * heads)
        self.n = self.lead[0]
        self.groups = int(np.prod(self.lead[1:]))
        self.rows = self.n * self.groups
        self.mask = _as_groups(mask, self.lead) if mask is not None else None
        self.bias = _as_groups(bias, self.lead) if bias is not None else None

    def scores(self, arr, i0, i1):
        """The [rows, heads, s, s] array of outer rows i0:i1 as [i1 - i0, G, heads, s, s]."""
        return arr.reshape((i1 - i0, self.groups) + arr.shape[1:])

    def block(self, arr, i0, i1):
        """Rows of outer rows i0:i1 of a [rows, ...] array."""
        return arr[i0 * self.groups:i1 * self.groups]


class PackedQKVAttention(Op):
    """Outputs (ctx, probs, drop): probs = softmax(scaled, biased, masked scores) and drop, the
    scaled dropout mask (or None), are hidden outputs kept for the backward."""

    name = "PackedQKVAttention"
    autocast = "lower"
    save_inputs = (0,)
    save_outputs = (1, 2)

    @staticmethod
    def forward(ctx, qkv, mask, bias, heads, scale, fill, dropout_p, generator):
        low = low_precision(qkv)
        if low is not None:  # float16/bfloat16 (autocast): computed in float32, the output cast back
            out, probs, drop = PackedQKVAttention.forward(ctx, qkv.astype(np.float32), mask, as_float32(bias), heads,
                                                          scale, fill, dropout_p, generator)
            return out.astype(low), probs, drop
        xp = xp_of(qkv)
        lay = _Layout(qkv, heads, mask, bias)
        s, d, b = lay.s, lay.d, lay.rows
        dt = qkv.dtype
        qkv4 = qkv.reshape(b, s, heads, 3 * d)
        probs = empty(xp, (b, heads, s, s), dt)
        out = empty(xp, (b, s, heads, d), dt)
        # the scaled dropout mask, drawn as F.dropout on the probabilities would draw it
        drop = scaled_keep_mask(xp, probs.shape, dt, dropout_p, generator.rng(xp)) if dropout_p > 0 else None
        bits = None
        zero_mask = False
        if mask is not None:
            # a fully masked row with a finite fill is uniform; its masked entries get no
            # gradient (they are constants of the masked fill), as in scale_mask_softmax
            zero_mask = bool(np.isfinite(fill) and lay.mask.all(axis=-1).any())
            if xp is np:
                bits = select_bits(lay.mask, fill, dt)
        ctx.layout, ctx.scale, ctx.zero_mask = lay, scale, zero_mask
        ctx.bias_shape = None if bias is None else bias.shape

        def rows(i0, i1):
            blk = lay.block(qkv4, i0, i1)
            p = lay.block(probs, i0, i1)
            _bmm_into(_heads(blk, d, 0), _heads(blk, d, 1).transpose(0, 1, 3, 2), p)
            p *= dt.type(scale)
            p5 = lay.scores(p, i0, i1)
            if lay.bias is not None:
                p5 += _rows_at(lay.bias, i0, i1, lay.n)
            if bits is not None:
                fill_where(p5, p5, _rows_at(bits[0], i0, i1, lay.n), _rows_at(bits[1], i0, i1, lay.n))
            elif mask is not None:
                xp.copyto(p5, dt.type(fill), where=xp.broadcast_to(_rows_at(lay.mask, i0, i1, lay.n), p5.shape))
            _softmax_rows(p, p, -1, log=False)
            pd = p * lay.block(drop, i0, i1) if drop is not None else p
            _bmm_into(pd, _heads(blk, d, 2), lay.block(out, i0, i1).transpose(0, 2, 1, 3))

        with ignore_fp_errors(xp):
            _for_row_blocks(xp, lay.n, rows, work=b * heads * s * s * d, row_elements=lay.groups * heads * s * s)
        # (no dropout: an empty array stands for the mask, outputs are arrays)
        ctx_out = out.reshape(lay.lead + (s, heads * d))
        return ctx_out, probs, drop if drop is not None else xp.empty(0, dt)

    @staticmethod
    def backward(ctx, g, *_):
        qkv, probs, drop = ctx.saved_tensors
        want_bias = ctx.bias_shape is not None and ctx.needs_input_grad[2]
        dqkv, dbias = PackedQKVAttentionGrad.apply(g, qkv, probs, drop, layout=ctx.layout, scale=ctx.scale,
                                                   zero_mask=ctx.zero_mask,
                                                   bias_shape=ctx.bias_shape if want_bias else None)
        return dqkv, None, dbias if want_bias else None


class PackedQKVAttentionGrad(NoDoubleBackward, Op):
    """(dqkv in the layout of qkv, dbias in the shape of the bias or empty) of PackedQKVAttention."""

    name = "PackedQKVAttentionGrad"

    @staticmethod
    def forward(ctx, g, qkv, probs, drop, layout, scale, zero_mask, bias_shape):
        low = low_precision(qkv)
        if low is not None:  # the forward ran in float32 (probs are float32); dqkv in qkv's dtype
            dqkv, dbias = PackedQKVAttentionGrad.forward(ctx, g.astype(np.float32), qkv.astype(np.float32), probs,
                                                         drop, layout, scale, zero_mask, bias_shape)
            return dqkv.astype(low), dbias
        ctx.op_name = "packed_qkv_attention"
        xp = xp_of(qkv)
        lay = layout
        s, d, heads, b = lay.s, lay.d, lay.heads, lay.rows
        dt = qkv.dtype
        qkv4 = qkv.reshape(b, s, heads, 3 * d)
        g4 = g.reshape(b, s, heads, d)
        dqkv = empty(xp, (b, s, heads, 3 * d), dt)
        drop = drop if drop.size else None
        # the bias's gradient is the softmax's input gradient summed over what the bias was
        # broadcast along: per outer row when it has them, else one partial sum per block
        bias5 = lay.bias.shape if bias_shape is not None else None
        per_row = bias5 is not None and bias5[0] == lay.n and lay.n > 1
        dbias5 = empty(xp, bias5, dt) if per_row else None

        def rows(i0, i1):
            blk, dblk = lay.block(qkv4, i0, i1), lay.block(dqkv, i0, i1)
            p = lay.block(probs, i0, i1)
            go = lay.block(g4, i0, i1).transpose(0, 2, 1, 3)  # [rows, heads, s, d]
            pd = p * lay.block(drop, i0, i1) if drop is not None else p
            _bmm_into(pd.transpose(0, 1, 3, 2), go, _heads(dblk, d, 2))  # dv = pd^T g
            dp = xp.empty(p.shape, dt)
            _bmm_into(go, _heads(blk, d, 2).transpose(0, 1, 3, 2), dp)  # d(pd) = g v^T
            if drop is not None:
                dp *= lay.block(drop, i0, i1)
            # the softmax's backward in place: ds = p * (dp - sum(dp * p)), times the scale
            # here unless the bias needs ds itself first
            dp5, p5 = lay.scores(dp, i0, i1), lay.scores(p, i0, i1)
            zm = xp.broadcast_to(_rows_at(lay.mask, i0, i1, lay.n), dp5.shape) if zero_mask else None
            _softmax_grad_rows(dp5, p5, dp5, -1, 1.0 if bias5 is not None else scale, zm)
            part = None
            if bias5 is not None:
                if per_row:
                    dbias5[i0:i1] = sum_to_array(dp5, (i1 - i0,) + bias5[1:])
                else:
                    part = sum_to_array(dp5, bias5)
                    part = part.copy() if part is dp5 else part  # dp is scaled in place next
                dp *= dt.type(scale)
            _bmm_into(dp, _heads(blk, d, 1), _heads(dblk, d, 0))  # dq = ds k
            _bmm_into(dp.transpose(0, 1, 3, 2), _heads(blk, d, 0), _heads(dblk, d, 1))  # dk = ds^T q
            return part

        with ignore_fp_errors(xp):
            parts = _for_row_blocks(xp, lay.n, rows, work=2 * b * heads * s * s * d,
                                    row_elements=lay.groups * heads * s * s)
        if bias5 is None:
            dbias = xp.empty(0, dt)
        else:
            if not per_row:
                dbias5 = parts[0]
                for part in parts[1:]:
                    dbias5 = dbias5 + part
            dbias = _from_groups(dbias5, lay.lead, bias_shape)
        return dqkv.reshape(qkv.shape), dbias


def _from_groups(arr5, lead, shape):
    """The inverse of _as_groups for a gradient: [n or 1, G or 1, ...] summed back to `shape`."""
    tail = arr5.shape[2:]
    if arr5.shape[1] == 1:
        full = (arr5.shape[0],) + (1,) * (len(lead) - 1) + tail
    else:
        full = (arr5.shape[0],) + tuple(lead[1:]) + tail
    return sum_to_array(arr5.reshape(full), tuple(shape))


def packed_qkv_attention(qkv, heads, mask=None, scale=None, fill=-10000.0, dropout_p=0.0, training=True,
                         generator=None, bias=None):
    """Attention core on a packed QKV projection (see the module docstring).

    qkv:   [*batch, s, heads * 3 * d] (one or more batch axes), each head's [q | k | v] side by side.
    mask:  bool, broadcastable to [*batch, heads, s, s]; True entries are masked out (filled with
           `fill` before the softmax, as `scale_mask_softmax` does). None: no mask.
    scale: multiplies the scores (default 1 / sqrt(d)).
    bias:  float, of qkv's dtype, broadcastable to [*batch, heads, s, s]: added to the scaled
           scores before the mask (a relative position bias, an additive mask); it gets a
           gradient. Swin passes qkv as [images, windows, s, ...] and a [windows, heads, s, s] bias.
    Returns ctx [*batch, s, heads * d].
    """
    check_float(qkv, "packed_qkv_attention")
    if qkv.ndim < 3 or heads <= 0 or qkv.shape[-1] % (3 * heads):
        raise RuntimeError(f"packed_qkv_attention: expected qkv of shape [*batch, seq, heads * 3 * head_size] "
                           f"with heads={heads}, got {shape_str(qkv.shape)}")
    s = qkv.shape[-2]
    full = tuple(qkv.shape[:-2]) + (heads, s, s)

    def broadcastable(t):
        return t.ndim <= len(full) and all(m in (1, f) for m, f in zip((1,) * (len(full) - t.ndim) + tuple(t.shape),
                                                                          full))

    if mask is not None and (mask.dtype.name != "bool" or not broadcastable(mask)):
        raise RuntimeError(f"packed_qkv_attention: mask must be bool and broadcastable to "
                           f"{shape_str(full)}, got {mask.dtype.name} {shape_str(mask.shape)}")
    if bias is not None and ((bias.dtype != qkv.dtype and not autocast_unifies(qkv, bias)) or not broadcastable(bias)):
        raise RuntimeError(f"packed_qkv_attention: bias must be {qkv.dtype.name} (the dtype of qkv) and "
                           f"broadcastable to {shape_str(full)}, got {bias.dtype.name} {shape_str(bias.shape)}")
    if not 0.0 <= dropout_p <= 1.0:
        raise ValueError(f"dropout probability has to be between 0 and 1, but got {dropout_p}")
    p = float(dropout_p) if training else 0.0
    d = qkv.shape[-1] // (3 * heads)
    scale = 1.0 / d ** 0.5 if scale is None else float(scale)
    return PackedQKVAttention.apply(qkv, mask, bias, heads=int(heads), scale=scale, fill=float(fill), dropout_p=p,
                                    generator=generator or default_generator)[0]
