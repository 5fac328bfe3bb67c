"""Emulators of engine/kernels/flash_attention.py: each checks the launch as the kernels read it
(geometry, scalar C types, buffer sizes, the mask's strides) and writes what the kernel writes
from the numpy references: the forward ctx and lse; `dq` the q third of dqkv and D; `dkdv` the
k and v thirds from the D in memory (so dq's launch must come first, as on a GPU). The fused
backward: `bwd_pre` D and a zeroed float32 dq sum, `bwd` the k and v thirds from that D and the dq
sums added to memory, `bwd_dq` the q third from them."""
import numpy as np

from engine.kernels import dropout_add
from engine.kernels import flash_attention as flash

from .. import _double
from . import emulates
from .norm_act import _buf, _scalars, stream_position

_TAIL = (np.int32, np.int32, np.float32, np.float32, np.int32, np.int32, np.int64, np.int64, np.int64, np.int64,
         np.uint64, np.uint64, np.float32, np.float32)


def _aligned16(name, what, view):
    """The kernels copy rows of qkv and of dout to shared memory in 16-byte pieces (cp.async),
    which fault on a GPU unless the buffer starts on a 16-byte boundary."""
    at = _double.address(view)
    if at % 16:
        raise ValueError(f"{name}: {what} starts at {at:#x}, not on a 16-byte boundary (the kernel copies 16 bytes "
                         "at a time)")
    return view


def _layout(name, grid, block, mask, scalars, rows=flash.ROWS):
    """(b, s, heads, d, mask or None, scale, fill, causal, dropout (p, seed, offset) or None) of a
    launch whose blocks take `rows` rows each, checked."""
    *scalars, state = scalars
    s, heads, scale, fill, causal, has_mask, *strides, seed, offset, p, keep_scale = _scalars(name, scalars, _TAIL)
    seed, offset = stream_position(name, seed, offset, state)
    d = int(name.rsplit("__hd", 1)[1])
    b = grid[1]
    if block != (flash.THREADS, 1, 1):
        raise ValueError(f"{name}: block {block}; the kernels are written for {flash.THREADS} threads (4 warps)")
    if grid[0] != heads or grid[2] != -(-s // rows):  # (heads, batch, tiles)
        raise ValueError(f"{name}: grid {grid} is not one block per {rows} rows of {s} for {heads} heads")
    m = None
    if has_mask:
        shape = (b, heads, s, s)
        reach = sum((n - 1) * t for n, t in zip(shape, strides))
        if min(strides) < 0 or reach >= mask.size:
            raise ValueError(f"{name}: mask strides {strides} reach element {reach} of a mask of {mask.size}")
        if mask.dtype != np.bool_:
            raise TypeError(f"{name}: mask is {mask.dtype}, the kernel reads bytes of bool")
        m = np.lib.stride_tricks.as_strided(mask, shape, [t * mask.itemsize for t in strides])
    if not 0.0 <= p <= 1.0 or keep_scale != np.float32(dropout_add.keep_scale(p)):
        raise ValueError(f"{name}: dropout p {p} with keep scale {keep_scale}")
    dropout = (float(p), int(seed), int(offset)) if p > 0 else None
    return b, s, heads, d, m, scale, fill, bool(causal), dropout


def _flash_fwd(name, grid, block, args, shared_mem):
    """flash_fwd_m{1,2}: blocks of 64 queries per m-tile of each warp"""
    qkv, mask, out, lse, *scalars = args
    m_tiles = int(name.split("__")[0].rsplit("_m", 1)[1])
    b, s, heads, d, m, scale, fill, causal, dropout = _layout(name, grid, block, mask, scalars, flash.ROWS * m_tiles)
    qkv = _aligned16(name, "qkv", qkv)
    qkv4 = _buf(name, "qkv", qkv, b * s * heads * 3 * d, np.float16).reshape(b, s, heads, 3 * d)
    o, l = flash.forward_reference(qkv4, m, scale, fill, causal, dropout)
    _buf(name, "out", out, o.size, np.float16)[:] = o.reshape(-1)
    _buf(name, "lse", lse, l.size, np.float32)[:] = l.reshape(-1)


for _m in (1, 2):
    emulates(f"flash_fwd_m{_m}")(_flash_fwd)


def _backward(name, grid, block, qkv, mask, out, g, lse, scalars):
    b, s, heads, d, m, scale, fill, causal, dropout = _layout(name, grid, block, mask, scalars)
    qkv = _aligned16(name, "qkv", qkv)
    qkv4 = _buf(name, "qkv", qkv, b * s * heads * 3 * d, np.float16).reshape(b, s, heads, 3 * d)
    o = None if out is None else _buf(name, "out", out, b * s * heads * d, np.float16).reshape(b, s, heads, d)
    g4 = _buf(name, "dout", _aligned16(name, "dout", g), b * s * heads * d, np.float16).reshape(b, s, heads, d)
    lse3 = _buf(name, "lse", lse, b * heads * s, np.float32).reshape(b, heads, s)
    return qkv4, o, g4, lse3, m, scale, fill, causal, dropout, d


@emulates("flash_dq")
def _flash_dq(name, grid, block, args, shared_mem):
    qkv, mask, out, g, lse, dsum, dqkv, *scalars = args
    qkv4, o, g4, lse3, m, scale, fill, causal, dropout, d = _backward(name, grid, block, qkv, mask, out, g, lse,
                                                                      scalars)
    dq, dd = flash.backward_reference(g4, qkv4, o, lse3, m, scale, fill, causal, dropout)
    _buf(name, "dqkv", dqkv, dq.size, np.float16).reshape(dq.shape)[..., :d] = dq[..., :d]
    _buf(name, "dsum", dsum, dd.size, np.float32)[:] = dd.reshape(-1)


@emulates("flash_dkdv")
def _flash_dkdv(name, grid, block, args, shared_mem):
    qkv, mask, g, lse, dsum, dqkv, *scalars = args
    qkv4, _, g4, lse3, m, scale, fill, causal, dropout, d = _backward(name, grid, block, qkv, mask, None, g, lse,
                                                                      scalars)
    b, s, heads = qkv4.shape[:3]
    dd = _buf(name, "dsum", dsum, b * heads * s, np.float32).reshape(b, heads, s)
    # the D that flash_dq wrote (a launch in the wrong order reads whatever the memory held)
    ref, _ = flash.backward_reference(g4, qkv4, None, lse3, m, scale, fill, causal, dropout, dsum=dd)
    _buf(name, "dqkv", dqkv, ref.size, np.float16).reshape(ref.shape)[..., d:] = ref[..., d:]


def _rows(name, grid, block, s, heads, rows):
    """b of a launch with one thread per row of [b, heads, s], checked."""
    if block != (flash.THREADS, 1, 1) or grid != (-(-rows // flash.THREADS), 1, 1):
        raise ValueError(f"{name}: grid {grid} x block {block} is not one thread per row of {rows}")
    if rows % (s * heads):
        raise ValueError(f"{name}: {rows} rows are not batch rows of {heads} heads x {s} tokens")
    return rows // (s * heads)


@emulates("flash_bwd_pre")
def _flash_bwd_pre(name, grid, block, args, shared_mem):
    out, g, dsum, dq_acc, *scalars = args
    s, heads, rows = _scalars(name, scalars, (np.int32, np.int32, np.int64))
    b, d = _rows(name, grid, block, s, heads, rows), int(name.rsplit("__hd", 1)[1])
    o, go = (_buf(name, what, _aligned16(name, what, a), rows * d, np.float16).reshape(b, s, heads, d).astype(np.float32)
             for what, a in (("out", out), ("dout", g)))
    _buf(name, "dsum", dsum, rows, np.float32)[:] = (o * go).sum(-1).transpose(0, 2, 1).reshape(-1)
    _buf(name, "dq_acc", _aligned16(name, "dq_acc", dq_acc), rows * d, np.float32)[:] = 0


@emulates("flash_bwd")
def _flash_bwd(name, grid, block, args, shared_mem):
    qkv, mask, g, lse, dsum, dqkv, dq_acc, *scalars = args
    qkv4, _, g4, lse3, m, scale, fill, causal, dropout, d = _backward(name, grid, block, qkv, mask, None, g, lse,
                                                                      scalars)
    b, s, heads = qkv4.shape[:3]
    dd = _buf(name, "dsum", dsum, b * heads * s, np.float32).reshape(b, heads, s)  # flash_bwd_pre's
    dq_sums, dk, dv, _ = flash.backward_parts(g4, qkv4, None, lse3, m, scale, fill, causal, dropout, dsum=dd)
    acc = _buf(name, "dq_acc", dq_acc, dq_sums.size, np.float32)
    acc += dq_sums.reshape(-1)  # added to what flash_bwd_pre zeroed, as the atomics add
    both = np.concatenate([t.transpose(0, 2, 1, 3) for t in (dk, dv)], axis=-1).astype(np.float16)
    _buf(name, "dqkv", dqkv, b * s * heads * 3 * d, np.float16).reshape(b, s, heads, 3 * d)[..., d:] = both


@emulates("flash_bwd_dq")
def _flash_bwd_dq(name, grid, block, args, shared_mem):
    dq_acc, dqkv, *scalars = args
    s, heads, scale, rows = _scalars(name, scalars, (np.int32, np.int32, np.float32, np.int64))
    b, d = _rows(name, grid, block, s, heads, rows), int(name.rsplit("__hd", 1)[1])
    sums = _buf(name, "dq_acc", _aligned16(name, "dq_acc", dq_acc), rows * d, np.float32).reshape(b, heads, s, d)
    _aligned16(name, "dqkv", dqkv)  # rows of q written 8 bytes at a time
    dq = (sums * np.float32(scale)).transpose(0, 2, 1, 3).astype(np.float16)
    _buf(name, "dqkv", dqkv, rows * 3 * d, np.float16).reshape(b, s, heads, 3 * d)[..., :d] = dq
