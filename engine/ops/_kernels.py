"""Array-level building blocks shared by several op families (CPU fast paths)."""
import contextlib
import functools

import numpy as np

from ..backend import cublas, dtypes, xp_of
from ..backend import buffers
from ..backend.parallel import matmul as parallel_matmul, parallel_map
from ..kernels import bias_add

# computed in float32 and cast back, as PyTorch accumulates them in float
LOW_PRECISION = (np.dtype(np.float16), dtypes.bfloat16.np)


def empty(xp, shape, dtype):
    """xp.empty, from the CPU buffer pool for large arrays (engine.backend.buffers)."""
    return buffers.empty(shape, dtype) if xp is np else xp.empty(shape, dtype)


def work_array(a):
    """float16/bfloat16 arrays in float32 (PyTorch accumulates them in float); others as they are."""
    return a.astype(np.float32) if a.dtype in LOW_PRECISION else a


def ignore_fp_errors(xp):
    """Silence numpy's overflow/invalid/divide warnings (inf/nan results are silent, as in
    PyTorch); a no-op context on CuPy."""
    return np.errstate(all="ignore") if xp is np else contextlib.nullcontext()


def rsqrt_array(xp, x):
    """1 / sqrt(x) with one temporary."""
    y = xp.empty_like(x)
    xp.sqrt(x, out=y)
    return xp.reciprocal(y, out=y)


def row_sum(a, axis):
    """Sum over `axis`, keepdims. The last axis goes through einsum, about twice as fast as
    `a.sum(-1)` on the CPU and, unlike a BLAS `a @ ones`, immune to BLAS thread contention."""
    if axis == a.ndim - 1 and a.size:
        return xp_of(a).einsum("...i->...", a)[..., None]
    return a.sum(axis=axis, keepdims=True, dtype=a.dtype)


# numpy's max over a short last axis runs a slow loop per row (measured on rows of 16: 4.0 ms for
# 786k elements against 1.4 ms halving; rows of 49 and more are faster as one reduction)
SHORT_ROW = 32


def row_max(a):
    """Max over the last axis, keepdims: halving for short rows (elementwise maxima of the two
    halves until one column is left; nan propagates as in max)."""
    n = a.shape[-1] if a.ndim else 0
    if n > SHORT_ROW or n < 2 or xp_of(a) is not np or a.size == 0:
        return a.max(axis=-1, keepdims=True)
    m = a
    while m.shape[-1] > 1:
        n = m.shape[-1]
        half = n // 2
        r = np.maximum(m[..., :half], m[..., half:2 * half])
        if n % 2:
            np.maximum(r[..., :1], m[..., 2 * half:], out=r[..., :1])
        m = r
    return m


def row_dot(a, b, axis):
    """sum(a * b) over `axis`, keepdims, without materialising a * b on the last axis (numpy's
    einsum). Not on CuPy: its two-operand einsum calls cuBLAS, which a CUDA graph capture refuses
    (found on an H200 in Swin's attention backward)."""
    xp = xp_of(a)
    if xp is np and axis == a.ndim - 1 and a.shape == b.shape:
        return xp.einsum("...i,...i->...", a, b)[..., None]
    return (a * b).sum(axis=axis, keepdims=True, dtype=a.dtype)


_UINT_OF_SIZE = {2: np.uint16, 4: np.uint32, 8: np.uint64}


def select_bits(mask, value, dtype):
    """Bit masks for `fill_where`: (keep, fill) at the mask's own (often small, broadcast) shape."""
    uint = _UINT_OF_SIZE[np.dtype(dtype).itemsize]
    ones = np.negative(mask.astype(uint))  # False -> 0, True -> all bits set
    fill = np.bitwise_and(np.asarray(value, dtype=dtype).view(uint), ones)
    return np.invert(ones), fill


def fill_where(out, x, keep, fill):
    """out = where(mask, value, x) for float arrays, given `select_bits(mask, value)`.

    Two SIMD bitwise passes (`x & ~M | value & M`): exact for every x, inf and nan included, and
    several times faster than numpy's `where`, whose select loop is not vectorised. `out` may
    be `x` itself."""
    uint = keep.dtype
    bits = out.view(uint)
    np.bitwise_and(x.view(uint), keep, out=bits)
    np.bitwise_or(bits, fill, out=bits)
    return out


def can_fill_where(x, value):
    return isinstance(x, np.ndarray) and x.dtype.kind == "f" and x.dtype.itemsize in _UINT_OF_SIZE \
        and np.ndim(value) == 0


# elements per block of a blocked kernel: 256 KiB of float32, so the few temporaries of a fused
# chain stay in L2 (the chain then reads and writes main memory once instead of once per step)
BLOCK_ELEMENTS = 1 << 16


def row_blocks(shape, target=BLOCK_ELEMENTS):
    """Selectors (tuples of ints and one slice) that tile an array of `shape` into blocks of
    about `target` elements without ever splitting the last axis, so row-wise reductions
    (softmax, layer_norm) can run block by block. Works on broadcast views too.

    A tuple, computed once per (shape, target): a step asks for the same few shapes on every
    call, and building the list took 8-45 us (softmax on [8, 6, 256, 256]: 48 blocks)."""
    return _row_blocks(tuple(int(d) for d in shape), int(target))


@functools.lru_cache(maxsize=512)
def _row_blocks(shape, target):
    ndim = len(shape)
    if ndim <= 1:
        return ((slice(None),),) if ndim else ((),)
    k, inner = ndim - 1, shape[-1]
    while k > 0 and inner * shape[k - 1] <= target:
        k -= 1
        inner *= shape[k]
    if k == 0:
        return ((slice(None),),)
    axis = k - 1  # split this axis into chunks; iterate over the axes before it
    # equal chunks, a power of two of them: rows 682 + 682 + 682 + 34 of a [2080, 384] array on
    # two threads gave one thread twice the other's work (layer_norm: 1.25x faster on two
    # threads than on one, instead of ~1.9x)
    chunks = -(-shape[axis] // max(1, target // inner))
    chunks = min(shape[axis], 1 << (chunks - 1).bit_length())
    step = -(-shape[axis] // chunks)
    blocks = []
    for idx in np.ndindex(*shape[:axis]):
        for s in range(0, shape[axis], step):
            blocks.append(tuple(int(i) for i in idx) + (slice(s, min(s + step, shape[axis])),))
    return tuple(blocks)


def blocked(fn, shape, target=BLOCK_ELEMENTS):
    """Run `fn(sel)` for every block selector of `shape` (blocks of about `target` elements), the
    blocks spread over threads, and return the results of `fn` in block order.

    The blocks depend on `shape` only (not on the thread count), so a reduction that combines
    the per-block results in this list's order gives the same bits on every run and with any
    number of threads. `fn` must only write its own block's outputs: combining results in a
    shared accumulator (or a list appended to) from `fn` would follow the threads' timing."""
    blocks = row_blocks(shape, target)
    size = 1
    for d in shape:
        size *= d
    return parallel_map(lambda i: fn(blocks[i]), len(blocks), size)


# column sums of at least this many elements go by fixed blocks of rows over the threads
# (a [16384, 384] bias gradient: 0.87 ms as one einsum, ~0.6 ms on two threads)
PARALLEL_COLUMN_SUM = 1 << 21


def column_sum(x2, out_dtype=None):
    """x2 [m, n] summed over its rows, in x2's dtype. einsum (1.3x faster than `sum(axis=0)`,
    same order, same bits); large arrays by fixed blocks of rows summed in block order, so the
    bits do not depend on the thread count. `out_dtype` float32 for a float16/bfloat16 x2: the
    sum accumulated and returned in float32 (a master weight's bias gradient)."""
    if xp_of(x2) is not np:
        out = cublas.column_sum(x2, out_dtype)  # a product with a ones vector: CuPy's axis-0 sum is slow here
        return out if out is not None else x2.sum(axis=0, dtype=out_dtype)
    if out_dtype is not None and out_dtype != x2.dtype:
        x2 = x2.astype(out_dtype)
    if x2.size < PARALLEL_COLUMN_SUM:
        return np.einsum("ij->j", x2)
    parts = blocked(lambda sel: np.einsum("ij->j", x2[sel]), x2.shape, PARALLEL_COLUMN_SUM // 2)
    total = parts[0]
    for p in parts[1:]:
        total += p
    return total


def rows_of(a, shape):
    """`a` broadcast to `shape` (a view), so that `rows_of(a, shape)[s:e]` is always valid."""
    return a if a.shape == tuple(shape) else np.broadcast_to(a, shape)


def matmul(xp, a, b, bias=None, out_dtype=None):
    """xp.matmul (+ bias over the last axis), split over the engine's threads on the CPU (see
    engine.backend.parallel). On the CPU float16/bfloat16 products run as float32 BLAS products
    rounded to the low dtype (a half-precision GEMM's float32 accumulation; numpy has no
    float16 BLAS and its own float16 matmul is ~50x slower). `out_dtype` float32 (with no bias)
    keeps that float32 accumulator instead of rounding it, on the CPU and through cuBLAS."""
    if xp is np:
        low = low_precision(a) if a.dtype == b.dtype else None
        if low is not None:
            out = parallel_matmul(a.astype(np.float32), b.astype(np.float32), as_float32(bias))
            return out if out_dtype == np.float32 else out.astype(low)
        return parallel_matmul(a, b, bias)
    wide = out_dtype is not None and out_dtype != a.dtype
    out = cublas.matmul(a, b, out_dtype if wide else None)  # cuBLAS called by the engine: CUDA-graph capturable
    if out is None:
        out = xp.matmul(a.astype(out_dtype), b.astype(out_dtype)) if wide else xp.matmul(a, b)
    if bias is not None:
        if bias_add.supported(out, bias):
            bias_add.bias_add_cuda_(out, bias)  # ~4x CuPy's broadcast add (engine/kernels/bias_add.py)
        else:
            out += bias
    return out


_BFLOAT16 = np.dtype(dtypes.bfloat16.np)


def low_precision(a):
    """The dtype of `a` when it is float16 or bfloat16 (kernels that accumulate, such as the
    fused attention, compute those in float32 and cast the result back), else None."""
    dt = a.dtype
    return dt if dt == np.float16 or dt == _BFLOAT16 else None


def as_float32(a):
    return None if a is None or a.dtype == np.float32 else a.astype(np.float32)
