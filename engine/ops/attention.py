"""Attention as fused ops: `packed_qkv_attention` (below, the core of the project's Transformer
layers) and torch's `scaled_dot_product_attention` (the last section: a tiled, flash-attention
style kernel that never holds more than one tile of scores).

The attention core of a Transformer layer as one op, on the packed QKV projection.

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
import math
import os

import numpy as np

from ..backend import cublas, deterministic, mkl, xp_of
from ..backend.fpenv import flush_denormals
from ..backend.parallel import parallel_map
from ..backend.random import default_generator
from ._core import NoDoubleBackward, broadcast_shapes, check_float, shape_str, sum_to_array
from ._kernels import (as_float32, empty, fill_where, ignore_fp_errors, low_precision, row_dot, row_max, row_sum,
                       select_bits)
from .dropout import scaled_keep_mask
from .op import Op, autocast_dtype, autocast_unifies
from ..kernels import flash_attention as flash
from ..kernels import scatter_add
from ..kernels import softmax as fused_softmax
from .softmax import _softmax_grad_rows, _softmax_rows

__all__ = ["packed_qkv_attention", "scaled_dot_product_attention"]


def _bmm_into(a, b, out):
    """out[...] = a @ b for stacked matrices, in place. `out` may be a strided view into a bigger
    array (the per-head parts of the context or of dqkv): then the products go to a contiguous
    block first (it stays in cache) and are copied into place."""
    xp = xp_of(a)
    if xp is not np:
        if not cublas.gemm_batched(a, b, out):  # the views read and written in place
            xp.matmul(a, b, out=out)
    elif not (mkl.use_for(a, b) and mkl.gemm_batched(a, b, out)):
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
    groups = math.prod(lead[1:])
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


# Float16 attention computed in float16 on CUDA (float16 probabilities, float32 accumulation in
# the products and the fused softmax, as PyTorch's autocast keeps them). None (the default): when
# the batched products go through engine.backend.cublas (real CuPy with cuBLAS). Through CuPy's
# matmul they ran at 13 TFLOP/s on an H200 against 27 for float32 (q k^T, 8 x 12 heads of
# 1024 x 64 x 1024), so without cuBLAS the float32 path is the faster one
# (tools/benchmarks/gpu_attention.py measures both).
HALF_ATTENTION_ON_GPU = None


def _half_on_gpu(xp, qkv, bias):
    """Whether float16 attention computes in float16 itself (HALF_ATTENTION_ON_GPU): on CUDA
    without a bias. Otherwise, and always on the CPU, it runs in float32."""
    if xp is np or bias is not None or qkv.dtype != np.float16:
        return False
    return cublas.available() if HALF_ATTENTION_ON_GPU is None else HALF_ATTENTION_ON_GPU


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
        self.groups = math.prod(self.lead[1:])
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
        xp = xp_of(qkv)
        if low is not None and not _half_on_gpu(xp, qkv, bias):
            # float16/bfloat16 (autocast) on the CPU: computed in float32, the output cast back
            out, probs, drop = PackedQKVAttention.forward(ctx, qkv.astype(np.float32), mask, as_float32(bias), heads,
                                                          scale, fill, dropout_p, generator)
            return out.astype(low), probs, drop
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
            # gradient (they are constants of the masked fill), as in scale_mask_softmax. Done
            # whatever the mask holds (where no row is fully masked the masked probabilities are
            # exactly 0, so zeroing their gradient changes nothing): the mask is not read back on
            # a GPU, and what the backward does does not depend on the data (a replayed graph)
            zero_mask = bool(np.isfinite(fill))
            if xp is np:
                bits = select_bits(lay.mask, fill, dt)
        ctx.layout, ctx.scale, ctx.zero_mask = lay, scale, zero_mask
        ctx.bias_shape = None if bias is None else bias.shape

        def rows(i0, i1):
            blk = lay.block(qkv4, i0, i1)
            p = lay.block(probs, i0, i1)
            _bmm_into(_heads(blk, d, 0), _heads(blk, d, 1).transpose(0, 1, 3, 2), p)
            p5 = lay.scores(p, i0, i1)
            if xp is not np and lay.bias is None:  # CUDA: scale, mask and softmax in one kernel
                m = None if mask is None else xp.broadcast_to(_rows_at(lay.mask, i0, i1, lay.n), p5.shape)
                fused_softmax.softmax_forward(p5, m, scale, fill, out=p5)
                pd = p * lay.block(drop, i0, i1) if drop is not None else p
                _bmm_into(pd, _heads(blk, d, 2), lay.block(out, i0, i1).transpose(0, 2, 1, 3))
                return
            p *= dt.type(scale)
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
        if low is not None and probs.dtype != qkv.dtype:
            # the forward ran in float32 (probs are float32); dqkv in qkv's dtype
            dqkv, dbias = PackedQKVAttentionGrad.forward(ctx, g.astype(np.float32), qkv.astype(np.float32), probs,
                                                         drop, layout, scale, zero_mask, bias_shape)
            return dqkv.astype(low), dbias
        ctx.op_name = "packed_qkv_attention"
        xp = xp_of(qkv)
        g = g.astype(qkv.dtype, copy=False)
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
            if xp is not np and bias5 is None:  # CUDA: the fused softmax backward, one kernel
                fused_softmax.softmax_backward(dp5, p5, zm, scale, out=dp5)
            else:
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
                         generator=None, bias=None, causal=False):
    """Attention core on a packed QKV projection (see the module docstring).

    qkv:   [*batch, s, heads * 3 * d] (one or more batch axes), each head's [q | k | v] side by side.
    mask:  bool, broadcastable to [*batch, heads, s, s]; True entries are masked out (filled with
           `fill` before the softmax, as `scale_mask_softmax` does). None: no mask.
    scale: multiplies the scores (default 1 / sqrt(d)).
    bias:  float, of qkv's dtype, broadcastable to [*batch, heads, s, s]: added to the scaled
           scores before the mask (a relative position bias, an additive mask); it gets a
           gradient. Swin passes qkv as [images, windows, s, ...] and a [windows, heads, s, s] bias.
    causal: also mask key j for query i where j > i (with `mask`, either one masks). Flash
           attention on CUDA (FLASH_ATTENTION_ON_GPU) then skips the tiles above the diagonal.
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
    if bias is None and _flash_on(qkv, d, fill):
        return FlashQKVAttention.apply(qkv, mask, heads=int(heads), scale=scale, fill=float(fill),
                                       causal=bool(causal), dropout_p=p,
                                       generator=generator or default_generator)[0]
    if causal:
        from .creation import arange
        pos = arange(s, device=qkv.device)
        future = (pos.view(1, s) > pos.view(s, 1)).view(1, 1, s, s)  # [1, 1, q, k]: key after query
        mask = future if mask is None else (future | mask)
    return PackedQKVAttention.apply(qkv, mask, bias, heads=int(heads), scale=scale, fill=float(fill), dropout_p=p,
                                    generator=generator or default_generator)[0]


# Flash attention on CUDA (engine/kernels/flash_attention.py): float16 attention without a bias,
# one batch axis, a head size that is a multiple of 16 up to 128 and |fill| < 2^15 runs as three
# tensor-core kernels that never write the [b, heads, s, s] scores, instead of two cuBLAS batched
# products around the fused softmax. Dropout is drawn inside the kernels from the generator's
# device stream: the same elements are dropped as by the unfused core from the same generator
# state (the stream moves past the same numbers), and the backward draws them again. On by
# default: on an H200 the kernels match PyTorch's attention and run 7.5x (forward) and 2.2x
# (backward) faster than the unfused core at GPT-2 124M's shape (docs/cuda.md).
# ENGINE_FLASH_ATTENTION=0 in the environment turns them off for a run (tools/train_net.py), as
# engine.backends.cuda.enable_flash_sdp(False) does in code.
def _flash_from_env():
    value = os.environ.get("ENGINE_FLASH_ATTENTION", "1")
    if value not in ("0", "1"):
        raise ValueError(f"ENGINE_FLASH_ATTENTION must be 0 or 1, got {value!r}")
    return value == "1"


FLASH_ATTENTION_ON_GPU = _flash_from_env()
FLASH_SDP_ENABLED = True  # engine.backends.cuda.enable_flash_sdp's switch


# The flash backward: "split" (the default), a dq kernel and a dkdv kernel, deterministic; or
# "fused", one pass over the key tiles that adds dq with float32 atomics (FlashAttention-2's
# scheme: 5 tile products where split does 7, but the sums' order, so the last bits of dq, vary
# from run to run), up to head size 80. ENGINE_FLASH_BACKWARD=fused in the environment, or this
# attribute in code. Which is faster on a GPU is not yet measured (tools/benchmarks/gpu_flash.py).
def _flash_backward_from_env():
    value = os.environ.get("ENGINE_FLASH_BACKWARD", "split")
    if value not in ("split", "fused"):
        raise ValueError(f"ENGINE_FLASH_BACKWARD must be split or fused, got {value!r}")
    return value


FLASH_BACKWARD = _flash_backward_from_env()


def _flash_on(qkv, head_size, fill):
    """Whether packed_qkv_attention of this qkv runs as flash attention (see above)."""
    if not (FLASH_ATTENTION_ON_GPU and FLASH_SDP_ENABLED) or qkv._device.type != "cuda" or qkv.ndim != 3:
        return False
    return flash.supports(autocast_dtype(qkv), head_size, fill)


class FlashQKVAttention(Op):
    """Outputs (ctx, lse): lse [b, heads, s], the rows' log-sum-exp, is a hidden output kept with
    ctx for the backward, which recomputes the probabilities tile by tile from them (and their
    dropout from the stream position the forward drew from)."""

    name = "FlashQKVAttention"
    autocast = "lower"
    save_inputs = (0,)
    save_outputs = (0, 1)

    @staticmethod
    def forward(ctx, qkv, mask, heads, scale, fill, causal, dropout_p, generator):
        b, s = qkv.shape[:2]
        dropout = None
        if dropout_p > 0:  # the draw of the unfused core's [b, heads, s, s] dropout uniforms
            stream = generator.rng(xp_of(qkv))
            dropout = (dropout_p, *stream.reserve("uniform_float", b * heads * s * s, "attention dropout"))
        out, lse = flash.flash_forward(qkv.reshape(b, s, heads, -1), mask, scale, fill, causal, dropout)
        ctx.mask, ctx.heads, ctx.scale, ctx.fill, ctx.causal, ctx.dropout = mask, heads, scale, fill, causal, dropout
        return out.reshape(b, s, -1), lse

    @staticmethod
    def backward(ctx, g, _):
        qkv, out, lse = ctx.saved_tensors
        dqkv = FlashQKVAttentionGrad.apply(g, qkv, out, lse, mask=ctx.mask, heads=ctx.heads, scale=ctx.scale,
                                           fill=ctx.fill, causal=ctx.causal, dropout=ctx.dropout)
        return dqkv, None


class FlashQKVAttentionGrad(NoDoubleBackward, Op):
    """dqkv of FlashQKVAttention, in the layout of qkv."""

    name = "FlashQKVAttentionGrad"

    @staticmethod
    def forward(ctx, g, qkv, out, lse, mask, heads, scale, fill, causal, dropout):
        ctx.op_name = "packed_qkv_attention"
        b, s = qkv.shape[:2]
        if FLASH_BACKWARD not in ("split", "fused"):
            raise ValueError(f"engine.ops.attention.FLASH_BACKWARD must be 'split' or 'fused', got {FLASH_BACKWARD!r}")
        # the fused backward's atomics order its dq sums by timing: not under deterministic mode
        fused = FLASH_BACKWARD == "fused" and not deterministic.are_deterministic_algorithms_enabled()
        dqkv, _ = flash.flash_backward(g.reshape(b, s, heads, -1), qkv.reshape(b, s, heads, -1),
                                       out.reshape(b, s, heads, -1), lse, mask, scale, fill, causal, dropout,
                                       fused=fused)
        return dqkv.reshape(qkv.shape)


# ====================================================================== scaled_dot_product_attention
# A flash-attention style kernel (Dao et al.): for each block of query rows the key/value blocks
# are visited in turn with an online softmax (a running row max m, row sum l and output
# accumulator rescaled by exp(m_old - m_new)), so at most one tile of scores exists at a time
# and a tile that the causal mask or a boolean mask removes entirely is never computed. The
# forward keeps only the output and the rows' log-sum-exp; the backward recomputes each tile's
# probabilities from them (p = exp(s - lse)) and uses D = rowsum(dO * O) for the softmax's
# gradient, as FlashAttention-2 does.
#
# Tiles: Q_BLOCK query rows x K_BLOCK keys, for as many (batch x heads) rows at once as keep a
# tile near SDPA_TILE_ELEMENTS scores (one MKL/numpy batched product per step instead of a
# Python loop over heads). Blocks of batch rows run on the engine's threads; each owns its rows
# of the output and of dq, dk, dv, so results do not depend on the thread count.
Q_BLOCK = 128
K_BLOCK = 128
SDPA_TILE_ELEMENTS = 1 << 17

# splitmix64's constants: dropout draws u(b, i, j) by hashing the score's position with the
# call's seed, so any tile's mask is computed on its own, in the forward and again in the
# backward, without a [batch, heads, L, S] mask ever being stored (the counter-based idea of the
# GPU flash kernels' Philox dropout)
_GOLDEN = 0x9E3779B97F4A7C15
_MIX1 = 0xBF58476D1CE4E5B9
_MIX2 = 0x94D049BB133111EB


def sdpa_dropout_seed(generator=None):
    """The one draw a scaled_dot_product_attention call with dropout takes from `generator`."""
    return int((generator or default_generator).rng(np).integers(0, 2 ** 63))


def sdpa_uniform(xp, seed, rows, q_range, k_range, L, S):
    """The dropout uniforms in [0, 1) of scores (b, i, j), b in rows, i in q_range, j in k_range
    (ranges (start, stop)) of a call with L queries and S keys: a pure function of the position."""
    u64 = xp.uint64
    b = xp.arange(rows[0], rows[1], dtype=u64)[:, None, None]
    i = xp.arange(q_range[0], q_range[1], dtype=u64)[None, :, None]
    j = xp.arange(k_range[0], k_range[1], dtype=u64)[None, None, :]
    z = (b * u64(L) + i) * u64(S) + j
    z *= u64(_GOLDEN)
    z += u64(seed)
    z ^= z >> u64(30)
    z *= u64(_MIX1)
    z ^= z >> u64(27)
    z *= u64(_MIX2)
    z ^= z >> u64(31)
    z >>= u64(11)
    return z.astype(np.float64) * (2.0 ** -53)


class _MaskTiles:
    """Tiles of an attention mask given as [M, Lm, Sm] (Lm in {1, L}, Sm in {1, S}) whose M rows
    are spread over the call's B batch rows by `midx` (None: M is 1, shared, or B, one per row)."""

    def __init__(self, xp, mask3, midx, dt):
        self.arr, self.midx = mask3, midx
        self.is_bool = mask3.dtype == np.bool_
        self.shared = mask3.shape[0] == 1
        self.full_l, self.full_s = mask3.shape[1] != 1, mask3.shape[2] != 1
        # bool: True takes part, so the fill goes where the mask is False
        self.bits = select_bits(~mask3, -np.inf, dt) if self.is_bool and xp is np else None

    def index(self, b0, b1, q0, q1, k0, k1):
        return (slice(q0, q1) if self.full_l else slice(0, 1)), (slice(k0, k1) if self.full_s else slice(0, 1))

    def rows(self, arr, b0, b1, qs, ks):
        if self.shared:
            return arr[0:1, qs, ks]
        if self.midx is None:
            return arr[b0:b1, qs, ks]
        return arr[:, qs, ks][self.midx[b0:b1]]

    def apply(self, xp, s, b0, b1, q0, q1, k0, k1):
        """Mask the score tile s in place; False when the tile is masked out entirely (skip it)."""
        qs, ks = self.index(b0, b1, q0, q1, k0, k1)
        tile = self.rows(self.arr, b0, b1, qs, ks)
        if not self.is_bool:
            if bool(xp.isneginf(tile).all()):
                return False
            s += tile
            return True
        if not bool(tile.any()):
            return False
        if not bool(tile.all()):
            if self.bits is not None:
                fill_where(s, s, self.rows(self.bits[0], b0, b1, qs, ks), self.rows(self.bits[1], b0, b1, qs, ks))
            else:
                xp.copyto(s, s.dtype.type(-np.inf), where=~tile)
        return True

    def add_grad(self, xp, dmask, ds, b0, b1, q0, q1, k0, k1):
        """dmask (the mask's [M, Lm, Sm] gradient) += ds summed over what the mask broadcasts along."""
        qs, ks = self.index(b0, b1, q0, q1, k0, k1)
        if not self.full_l:
            ds = ds.sum(axis=1, keepdims=True)
        if not self.full_s:
            ds = ds.sum(axis=2, keepdims=True)
        if self.shared:
            dmask[0:1, qs, ks] += ds.sum(axis=0, keepdims=True)
        elif self.midx is None:
            dmask[b0:b1, qs, ks] += ds
        else:
            scatter_add.add_at(dmask[:, qs, ks], self.midx[b0:b1], ds)


class _SDPAKernel:
    """One call's shapes, options and tiling; forward_rows / backward_rows do a block of batch rows."""

    def __init__(self, xp, dt, B, L, S, mask, midx, causal, scale, dropout_p, seed):
        self.xp, self.dt, self.B, self.L, self.S = xp, dt, B, L, S
        self.mask = _MaskTiles(xp, mask, midx, dt) if mask is not None else None
        self.causal, self.scale, self.p, self.seed = causal, scale, dropout_p, seed
        self.bq, self.bk = max(1, min(L, Q_BLOCK)), max(1, min(S, K_BLOCK))
        step = max(1, SDPA_TILE_ELEMENTS // (self.bq * self.bk))
        self.blocks = [(b0, min(b0 + step, B)) for b0 in range(0, B, step)]

    def run(self, fn, work, serial=False):
        """fn(b0, b1) over the blocks of batch rows: on the engine's threads (numpy), one after the
        other when `serial` (a shared accumulator), in one call on the GPU."""
        xp = self.xp
        if xp is not np:
            with ignore_fp_errors(xp):
                fn(0, self.B)
            return

        def block(j):
            with ignore_fp_errors(np), flush_denormals():
                fn(*self.blocks[j])

        if serial:
            for j in range(len(self.blocks)):
                block(j)
        else:
            parallel_map(block, len(self.blocks), work)

    def keep(self, b0, b1, q0, q1, k0, k1):
        """The scaled dropout mask of a tile (None without dropout)."""
        if not self.p:
            return None
        u = sdpa_uniform(self.xp, self.seed, (b0, b1), (q0, q1), (k0, k1), self.L, self.S)
        if self.p >= 1:
            return self.xp.zeros(u.shape, self.dt)
        return ((u >= self.p) * (1.0 / (1.0 - self.p))).astype(self.dt)

    def tiles(self, q, k, b0, b1, q0, q1):
        """(k0, k1, s) for the score tiles of query rows q0:q1 that are not masked out entirely:
        s = scale * q k^T with the causal and attention masks applied (-inf where masked)."""
        xp, dt = self.xp, self.dt
        qt = q[b0:b1, q0:q1]
        kend = min(self.S, q1) if self.causal else self.S  # top-left causal: key j <= query i
        for k0 in range(0, kend, self.bk):
            k1 = min(k0 + self.bk, kend)
            s = empty(xp, (b1 - b0, q1 - q0, k1 - k0), dt)
            _bmm_into(qt, k[b0:b1, k0:k1].transpose(0, 2, 1), s)
            s *= dt.type(self.scale)
            if self.causal and k1 - 1 > q0:
                above = xp.arange(k0, k1)[None, :] > xp.arange(q0, q1)[:, None]
                xp.copyto(s, dt.type(-np.inf), where=above)
            if self.mask is not None and not self.mask.apply(xp, s, b0, b1, q0, q1, k0, k1):
                continue
            yield k0, k1, s

    def forward_rows(self, q, k, v, out, lse, b0, b1):
        xp, dt = self.xp, self.dt
        n, ev = b1 - b0, v.shape[2]
        ninf = dt.type(-np.inf)
        for q0 in range(0, self.L, self.bq):
            q1 = min(q0 + self.bq, self.L)
            m = xp.full((n, q1 - q0, 1), ninf, dt)
            m_safe = xp.zeros((n, q1 - q0, 1), dt)
            lsum = xp.zeros((n, q1 - q0, 1), dt)
            acc = xp.zeros((n, q1 - q0, ev), dt)
            for k0, k1, s in self.tiles(q, k, b0, b1, q0, q1):
                m_new = xp.maximum(m, row_max(s))
                m_safe = xp.where(m_new == ninf, dt.type(0), m_new)  # a row masked so far stays 0
                s -= m_safe
                xp.exp(s, out=s)
                alpha = xp.exp(m - m_safe)
                lsum *= alpha
                lsum += row_sum(s, 2)
                drop = self.keep(b0, b1, q0, q1, k0, k1)
                if drop is not None:
                    s *= drop
                acc *= alpha
                acc += _bmm(s, v[b0:b1, k0:k1])
                m = m_new
            empty_rows = lsum == 0  # fully masked rows: output 0 and no gradient, as torch's
            out[b0:b1, q0:q1] = acc / xp.where(empty_rows, dt.type(1), lsum)
            lse[b0:b1, q0:q1] = xp.where(empty_rows, dt.type(np.inf), m_safe + xp.log(lsum))[..., 0]

    def backward_rows(self, g, q, k, v, out, lse, dq, dk, dv, dmask, b0, b1):
        xp, dt = self.xp, self.dt
        gb = g[b0:b1]
        dsum = row_dot(gb, out[b0:b1], 2)  # D = rowsum(dO * O) = rowsum(P * dP)
        dk[b0:b1] = 0
        dv[b0:b1] = 0
        for q0 in range(0, self.L, self.bq):
            q1 = min(q0 + self.bq, self.L)
            gt, qt = gb[:, q0:q1], q[b0:b1, q0:q1]
            lt, dt_sum = lse[b0:b1, q0:q1, None], dsum[:, q0:q1]
            dq_t = xp.zeros(qt.shape, dt)
            for k0, k1, s in self.tiles(q, k, b0, b1, q0, q1):
                s -= lt
                p = xp.exp(s, out=s)
                drop = self.keep(b0, b1, q0, q1, k0, k1)
                pd = p * drop if drop is not None else p
                dv[b0:b1, k0:k1] += _bmm(pd.transpose(0, 2, 1), gt)
                ds = _bmm(gt, v[b0:b1, k0:k1].transpose(0, 2, 1))  # dP
                if drop is not None:
                    ds *= drop
                ds -= dt_sum
                ds *= p
                if dmask is not None:
                    self.mask.add_grad(xp, dmask, ds, b0, b1, q0, q1, k0, k1)
                ds *= dt.type(self.scale)
                dq_t += _bmm(ds, k[b0:b1, k0:k1])
                dk[b0:b1, k0:k1] += _bmm(ds.transpose(0, 2, 1), qt)
            dq[b0:b1, q0:q1] = dq_t


def _bmm(a, b):
    """a @ b for stacks of matrices as a new array (MKL's batched product where it is in use)."""
    out = empty(xp_of(a), a.shape[:-1] + b.shape[-1:], a.dtype)
    _bmm_into(a, b, out)
    return out


def _f32(a):
    return None if a is None else (a.astype(np.float32) if a.dtype != np.bool_ else a)


class ScaledDotProductAttention(Op):
    """(out [B, L, Ev], lse [B, L]) of q [B, L, E], k [B, S, E], v [B, S, Ev] and a mask [M, Lm, Sm]
    (bool: True takes part; float: added) spread over the B rows by `midx`; lse is hidden."""

    name = "ScaledDotProductAttention"
    autocast = "lower"
    save_inputs = (0, 1, 2, 3)
    save_outputs = (0, 1)

    @staticmethod
    def forward(ctx, q, k, v, mask, midx, scale, causal, dropout_p, generator):
        low = low_precision(q)
        if low is not None:  # float16/bfloat16: computed in float32, the output rounded back
            out, lse = ScaledDotProductAttention.forward(ctx, _f32(q), _f32(k), _f32(v), _f32(mask), midx, scale,
                                                         causal, dropout_p, generator)
            return out.astype(low), lse
        # the dropout seed is drawn here, in the kernel, so that a replayed graph draws a new one
        seed = sdpa_dropout_seed(generator) if dropout_p > 0 else 0
        xp = xp_of(q)
        (b, length, e), s_len, ev = q.shape, k.shape[1], v.shape[2]
        kern = _SDPAKernel(xp, q.dtype, b, length, s_len, mask, midx, causal, scale, dropout_p, seed)
        out = empty(xp, (b, length, ev), q.dtype)
        lse = empty(xp, (b, length), q.dtype)
        kern.run(lambda b0, b1: kern.forward_rows(q, k, v, out, lse, b0, b1), work=b * length * s_len * (e + ev))
        ctx.kern = kern
        return out, lse

    @staticmethod
    def backward(ctx, g, *_):
        q, k, v, mask, out, lse = ctx.saved_tensors
        want_mask = mask is not None and mask.is_floating_point() and ctx.needs_input_grad[3]
        dq, dk, dv, dmask = ScaledDotProductAttentionGrad.apply(g, q, k, v, mask, out, lse, kern=ctx.kern,
                                                                want_mask=want_mask)
        return dq, dk, dv, (dmask if want_mask else None)


class ScaledDotProductAttentionGrad(NoDoubleBackward, Op):
    """(dq, dk, dv, dmask or empty) of ScaledDotProductAttention, tile by tile."""

    name = "ScaledDotProductAttentionGrad"

    @staticmethod
    def forward(ctx, g, q, k, v, mask, out, lse, kern, want_mask):
        low = low_precision(q)
        if low is not None:
            grads = ScaledDotProductAttentionGrad.forward(ctx, _f32(g), _f32(q), _f32(k), _f32(v), _f32(mask),
                                                          _f32(out), lse, kern, want_mask)
            return tuple(a.astype(low) for a in grads)
        ctx.op_name = "scaled_dot_product_attention"
        xp = xp_of(q)
        dt = q.dtype
        g = g.astype(dt, copy=False)
        dq, dk, dv = empty(xp, q.shape, dt), empty(xp, k.shape, dt), empty(xp, v.shape, dt)
        dmask = xp.zeros(mask.shape, dt) if want_mask else None
        (b, length, e), s_len = q.shape, k.shape[1]
        # a mask gradient sums over batch rows that share mask rows: one block after the other
        kern.run(lambda b0, b1: kern.backward_rows(g, q, k, v, out, lse, dq, dk, dv, dmask, b0, b1),
                 work=2 * b * length * s_len * (e + v.shape[2]), serial=want_mask)
        return dq, dk, dv, (dmask if want_mask else xp.empty(0, dt))


def _attention_batch(query, key, value):
    """The broadcast batch shape of q, k, v (all but their last two dims), with torch's error."""
    try:
        return broadcast_shapes(tuple(query.shape[:-2]), tuple(key.shape[:-2]), tuple(value.shape[:-2]))
    except RuntimeError as e:
        raise RuntimeError(f"scaled_dot_product_attention: the batch dims of query {shape_str(query.shape)}, key "
                           f"{shape_str(key.shape)} and value {shape_str(value.shape)} do not broadcast: {e}") from None


def _repeat_heads(t, groups):
    """t [..., H, S, E] with each head repeated `groups` times in a row (torch's repeat_interleave
    on dim -3, the grouped-query layout); its gradient sums each group back."""
    if groups == 1:
        return t
    shape = tuple(t.shape)
    wide = t.unsqueeze(-3).expand(*shape[:-2], groups, *shape[-2:])
    return wide.reshape(*shape[:-3], shape[-3] * groups, *shape[-2:])


def _check_sdpa(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa):
    if query.ndim < 2 or key.ndim < 2 or value.ndim < 2:
        raise RuntimeError(f"scaled_dot_product_attention: expected query, key, and value to all be at least 2 "
                           f"dimensional, but got query.dim: {query.ndim} key.dim: {key.ndim} and value.dim: "
                           f"{value.ndim} instead.")
    if not (query.dtype == key.dtype == value.dtype):
        raise RuntimeError(f"scaled_dot_product_attention: expected query, key, and value to have the same dtype, "
                           f"but got query.dtype: {query.dtype.name} key.dtype: {key.dtype.name} and value.dtype: "
                           f"{value.dtype.name} instead.")
    check_float(query, "scaled_dot_product_attention", "query")
    if attn_mask is not None and attn_mask.dtype.name != "bool" and attn_mask.dtype != query.dtype \
            and not autocast_unifies(query, attn_mask):
        raise RuntimeError(f"scaled_dot_product_attention: expected attn_mask dtype to be bool or to match query "
                           f"dtype, but got attn_mask.dtype: {attn_mask.dtype.name} and query.dtype: "
                           f"{query.dtype.name} instead.")
    if is_causal and attn_mask is not None:
        raise RuntimeError("scaled_dot_product_attention: Explicit attn_mask should not be set when is_causal=True")
    if not 0.0 <= dropout_p <= 1.0:
        raise RuntimeError(f"dropout probability has to be between 0 and 1, but got {dropout_p}")
    if key.shape[-1] != query.shape[-1]:
        raise RuntimeError(f"scaled_dot_product_attention: query {shape_str(query.shape)} and key "
                           f"{shape_str(key.shape)} must have the same embedding size (last dim)")
    if value.shape[-2] != key.shape[-2]:
        raise RuntimeError(f"scaled_dot_product_attention: key {shape_str(key.shape)} and value "
                           f"{shape_str(value.shape)} must have the same sequence length (dim -2)")
    if enable_gqa:
        if query.ndim < 3 or key.ndim < 3 or value.ndim < 3:
            raise IndexError("scaled_dot_product_attention: enable_gqa needs a heads dim (-3) in query, key and "
                             f"value, got {shape_str(query.shape)}, {shape_str(key.shape)}, {shape_str(value.shape)}")
        hq = query.shape[-3]
        if key.shape[-3] == 0 or value.shape[-3] == 0 or hq % key.shape[-3] or hq % value.shape[-3]:
            raise RuntimeError(f"scaled_dot_product_attention: number of heads in key ({key.shape[-3]}) and value "
                               f"({value.shape[-3]}) must divide the number of heads in query ({hq})")


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                                 enable_gqa=False):
    """softmax(q k^T * scale + mask) @ v, torch's F.scaled_dot_product_attention, as one fused
    tiled kernel (see the section comment above).

    query [*batch, L, E], key [*batch, S, E], value [*batch, S, Ev]: the batch dims broadcast.
    attn_mask: broadcastable to [*batch, L, S]; bool (True = takes part) or float of query's dtype
        (added to the scores; it gets a gradient if it requires one).
    is_causal: query i sees keys j <= i (top-left aligned when L != S); not with attn_mask.
    scale: default 1 / sqrt(E). dropout_p: dropout on the attention weights (always applied, as
        torch's: pass 0.0 in eval mode); its mask comes from one seed drawn from the default generator.
    enable_gqa: key/value heads (dim -3) shared by groups of query heads (grouped-query attention).
    Rows whose every key is masked give 0 and no gradient, as torch's.
    """
    _check_sdpa(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa)
    length, e = query.shape[-2:]
    s_len, ev = key.shape[-2], value.shape[-1]
    if enable_gqa:
        key = _repeat_heads(key, query.shape[-3] // key.shape[-3])
        value = _repeat_heads(value, query.shape[-3] // value.shape[-3])
    batch = _attention_batch(query, key, value)
    b = math.prod(batch)
    q3, k3, v3 = (t.expand(*batch, *t.shape[-2:]).reshape(b, *t.shape[-2:]) for t in (query, key, value))
    mask3, midx = None, None
    if attn_mask is not None:
        full = batch + (length, s_len)
        padded = (1,) * (len(full) - attn_mask.ndim) + tuple(attn_mask.shape)
        if len(padded) > len(full) or any(m not in (1, f) for m, f in zip(padded, full)):
            raise RuntimeError(f"scaled_dot_product_attention: attn_mask of shape {shape_str(attn_mask.shape)} does "
                               f"not broadcast to the scores' shape {shape_str(full)}")
        rows = math.prod(padded[:-2])
        mask3 = attn_mask.reshape(rows, *padded[-2:])
        if rows not in (1, b):
            midx = np.broadcast_to(np.arange(rows).reshape(padded[:-2]), batch).reshape(-1)
    if scale is None:
        scale = 1.0 / math.sqrt(e) if e else 1.0  # (E = 0: every score is 0 whatever the scale)
    out = ScaledDotProductAttention.apply(q3, k3, v3, mask3, midx=midx, scale=float(scale), causal=bool(is_causal),
                                          dropout_p=float(dropout_p), generator=default_generator)[0]
    return out.reshape(*batch, length, ev)
