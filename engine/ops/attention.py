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
from ..backend.parallel import parallel_for
from ..backend.random import default_generator
from ._core import NoDoubleBackward, check_float, shape_str
from ._kernels import empty, fill_where, ignore_fp_errors, select_bits
from .dropout import scaled_keep_mask
from .op import Op
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


def _rows_at(arr, i0, i1, b):
    """Rows [i0:i1] of an array broadcast along the batch axis (size b or 1)."""
    return arr[i0:i1] if arr.shape[0] == b else arr


def _heads(qkv4, d, part):
    """[n, heads, s, d] view of q (part 0), k (1) or v (2) in a [n, s, heads, 3d] block."""
    return qkv4[..., part * d:(part + 1) * d].transpose(0, 2, 1, 3)


# scores per block of batch rows: measured on the BERT benchmark's attention (16 x 6 x 128 x 128),
# fwd + bwd 12.9 ms one row at a time, 11.3 ms at 2^17, 10.3 ms from 2^19 on (fewer, larger MKL
# calls; the blocks no longer fit L2 but the products and the softmax passes do not mind)
ROW_BLOCK_ELEMENTS = 1 << 19


def _for_batch_rows(xp, b, fn, work, row_elements):
    """fn(i0, i1) over blocks of batch rows (scores of about ROW_BLOCK_ELEMENTS), the rows split
    over the engine's threads on the CPU; on the GPU all rows in one call."""
    if xp is not np:
        fn(0, b)
        return
    step = max(1, ROW_BLOCK_ELEMENTS // max(1, row_elements))

    def run(s, e):
        for i in range(s, e, step):
            fn(i, min(i + step, e))

    parallel_for(run, b, work=work)


class PackedQKVAttention(Op):
    """Outputs (ctx, probs, drop): probs = softmax(scaled, masked scores) and drop, the scaled
    dropout mask (or None), are hidden outputs kept for the backward."""

    name = "PackedQKVAttention"
    save_inputs = (0,)
    save_outputs = (1, 2)

    @staticmethod
    def forward(ctx, qkv, mask, heads, scale, fill, dropout_p, generator):
        xp = xp_of(qkv)
        b, s = qkv.shape[:2]
        d = qkv.shape[2] // (3 * heads)
        dt = qkv.dtype
        qkv4 = qkv.reshape(b, s, heads, 3 * d)
        probs = empty(xp, (b, heads, s, s), dt)
        out = empty(xp, (b, s, heads, d), dt)
        # the scaled dropout mask, drawn as F.dropout on the probabilities would draw it
        drop = scaled_keep_mask(xp, probs.shape, dt, dropout_p, generator.rng(xp)) if dropout_p > 0 else None
        bits = None
        zero_mask = False
        if mask is not None:
            mask = mask.reshape((1,) * (4 - mask.ndim) + mask.shape)
            # a fully masked row with a finite fill is uniform; its masked entries get no
            # gradient (they are constants of the masked fill), as in scale_mask_softmax
            zero_mask = bool(np.isfinite(fill) and mask.all(axis=-1).any())
            if xp is np:
                bits = select_bits(mask, fill, dt)
        ctx.heads, ctx.d, ctx.scale, ctx.mask, ctx.zero_mask = heads, d, scale, mask, zero_mask

        def rows(i0, i1):
            blk = qkv4[i0:i1]
            p = probs[i0:i1]
            _bmm_into(_heads(blk, d, 0), _heads(blk, d, 1).transpose(0, 1, 3, 2), p)
            p *= dt.type(scale)
            if bits is not None:
                keep_bits = _rows_at(bits[0], i0, i1, b)
                fill_where(p, p, keep_bits, _rows_at(bits[1], i0, i1, b))
            elif mask is not None:
                xp.copyto(p, dt.type(fill), where=xp.broadcast_to(_rows_at(mask, i0, i1, b), p.shape))
            _softmax_rows(p, p, -1, log=False)
            pd = p * drop[i0:i1] if drop is not None else p
            _bmm_into(pd, _heads(blk, d, 2), out[i0:i1].transpose(0, 2, 1, 3))

        with ignore_fp_errors(xp):
            _for_batch_rows(xp, b, rows, work=b * heads * s * s * d, row_elements=heads * s * s)
        # (no dropout: an empty array stands for the mask, outputs are arrays)
        return out.reshape(b, s, heads * d), probs, drop if drop is not None else xp.empty(0, dt)

    @staticmethod
    def backward(ctx, g, *_):
        qkv, probs, drop = ctx.saved_tensors
        dqkv = PackedQKVAttentionGrad.apply(g, qkv, probs, drop, heads=ctx.heads, scale=ctx.scale,
                                            mask=ctx.mask, zero_mask=ctx.zero_mask)
        return dqkv, None


class PackedQKVAttentionGrad(NoDoubleBackward, Op):
    """dqkv of PackedQKVAttention, in the layout of qkv."""

    name = "PackedQKVAttentionGrad"

    @staticmethod
    def forward(ctx, g, qkv, probs, drop, heads, scale, mask, zero_mask):
        ctx.op_name = "packed_qkv_attention"
        xp = xp_of(qkv)
        b, s = qkv.shape[:2]
        d = qkv.shape[2] // (3 * heads)
        dt = qkv.dtype
        qkv4 = qkv.reshape(b, s, heads, 3 * d)
        g4 = g.reshape(b, s, heads, d)
        dqkv = empty(xp, (b, s, heads, 3 * d), dt)
        drop = drop if drop.size else None

        def rows(i0, i1):
            blk, dblk = qkv4[i0:i1], dqkv[i0:i1]
            p = probs[i0:i1]
            go = g4[i0:i1].transpose(0, 2, 1, 3)  # [n, heads, s, d]
            pd = p * drop[i0:i1] if drop is not None else p
            _bmm_into(pd.transpose(0, 1, 3, 2), go, _heads(dblk, d, 2))  # dv = pd^T g
            dp = xp.empty(p.shape, dt)
            _bmm_into(go, _heads(blk, d, 2).transpose(0, 1, 3, 2), dp)  # d(pd) = g v^T
            if drop is not None:
                dp *= drop[i0:i1]
            # the softmax's backward, times the scale, in place: ds = scale * p * (dp - sum(dp * p))
            zm = xp.broadcast_to(_rows_at(mask, i0, i1, b), dp.shape) if zero_mask else None
            _softmax_grad_rows(dp, p, dp, -1, scale, zm)
            _bmm_into(dp, _heads(blk, d, 1), _heads(dblk, d, 0))  # dq = ds k
            _bmm_into(dp.transpose(0, 1, 3, 2), _heads(blk, d, 0), _heads(dblk, d, 1))  # dk = ds^T q

        with ignore_fp_errors(xp):
            _for_batch_rows(xp, b, rows, work=2 * b * heads * s * s * d, row_elements=heads * s * s)
        return dqkv.reshape(qkv.shape)


def packed_qkv_attention(qkv, heads, mask=None, scale=None, fill=-10000.0, dropout_p=0.0, training=True,
                         generator=None):
    """Attention core on a packed QKV projection (see the module docstring).

    qkv:   [b, s, heads * 3 * d], each head's [q | k | v] side by side.
    mask:  bool, broadcastable to [b, heads, s, s]; True entries are masked out (filled with
           `fill` before the softmax, as `scale_mask_softmax` does). None: no mask.
    scale: multiplies the scores (default 1 / sqrt(d)).
    Returns ctx [b, s, heads * d].
    """
    check_float(qkv, "packed_qkv_attention")
    if qkv.ndim != 3 or heads <= 0 or qkv.shape[2] % (3 * heads):
        raise RuntimeError(f"packed_qkv_attention: expected qkv of shape [batch, seq, heads * 3 * head_size] "
                           f"with heads={heads}, got {shape_str(qkv.shape)}")
    b, s = qkv.shape[:2]
    d = qkv.shape[2] // (3 * heads)
    if mask is not None:
        if mask.dtype.name != "bool" or mask.ndim > 4 or any(
                m not in (1, full) for m, full in zip((1,) * (4 - mask.ndim) + tuple(mask.shape), (b, heads, s, s))):
            raise RuntimeError(f"packed_qkv_attention: mask must be bool and broadcastable to "
                               f"{shape_str((b, heads, s, s))}, got {mask.dtype.name} {shape_str(mask.shape)}")
    if not 0.0 <= dropout_p <= 1.0:
        raise ValueError(f"dropout probability has to be between 0 and 1, but got {dropout_p}")
    p = float(dropout_p) if training else 0.0
    scale = 1.0 / d ** 0.5 if scale is None else float(scale)
    return PackedQKVAttention.apply(qkv, mask, heads=int(heads), scale=scale, fill=float(fill), dropout_p=p,
                                    generator=generator or default_generator)[0]
