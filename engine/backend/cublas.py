"""cuBLAS batched products on strided views: the attention core's products on CUDA.

Why: CuPy's `matmul` makes every operand that is not C-contiguous contiguous first (the q, k and
v heads of the packed QKV projection are strided views, k^T a transposed one), writes a strided
output through a temporary, and calls cublasGemmStridedBatchedEx with CUBLAS_GEMM_DEFAULT. On an
H200 its float16 q k^T (96 x 1024 x 64 x 1024) measured 13 TFLOP/s where PyTorch's bmm of the same
shapes measured 134 (tools/benchmarks/gpu_matmul.py), so the engine computed float16 attention
in float32. Here one cublasGemmStridedBatchedEx call per group of batch rows reads each operand
in place (any view whose matrices have a unit stride along their rows or their columns: the
transpose is cuBLAS's op flag, the row stride its leading dimension) and writes the output in
place (the context straight into its [b, s, heads, d] layout, the gradients into dqkv).

`plan` is the arithmetic of the call (flags, leading dimensions, batch strides, the offsets of
the calls when the batch axes do not merge into one stride) and needs no GPU: the tests run it
through a numpy model of the cuBLAS call against numpy's matmul on arbitrary views. `gemm_batched`
issues the calls on real CuPy for float16 (float32 accumulation, as PyTorch's bmm), and returns
False where it cannot (no cuBLAS, as under the CuPy double; another dtype: CuPy's float32 batched
products measured at PyTorch's rate; a layout it does not take): the caller uses CuPy's matmul.
"""
import itertools
from typing import NamedTuple

import numpy as np

_INT_MAX = 2 ** 31 - 1

# cuBLAS constants (cublas_api.h, library_types.h), as CuPy's cupy_backends wrappers take them
OP_N, OP_T = 0, 1
_CUDA_R_16F, _COMPUTE_32F = 2, 68
GEMM_DEFAULT, GEMM_DEFAULT_TENSOR_OP = -1, 99

# the algorithm asked for float16 products (float32 accumulation either way). CuPy's own batched
# call passes GEMM_DEFAULT; tools/benchmarks/gpu_matmul.py measures both on the GPU.
HALF_ALGO = GEMM_DEFAULT_TENSOR_OP

_lib = _ndarray = _get_handle = None
_why_not = None


class Plan(NamedTuple):
    """One cublasGemmStridedBatchedEx call per entry of `offsets` (element offsets of the first
    matrices of a, b and c). cuBLAS is column-major: it computes C^T = B^T A^T, so its first
    operand is our `b` and its second our `a`; m, n, k are cuBLAS's (n, m, k of the product)."""
    trans_b: int
    trans_a: int
    m: int
    n: int
    k: int
    ld_b: int
    ld_a: int
    ld_c: int
    stride_b: int
    stride_a: int
    stride_c: int
    batch: int
    offsets: tuple  # ((off_a, off_b, off_c), ...)


def _matrix(rows, cols, row_stride, col_stride):
    """(op, leading dimension) of a rows x cols matrix as cuBLAS's operand of C^T = B^T A^T:
    a row-major matrix (unit column stride) is its own transpose in column-major memory (OP_N), a
    column-major one (unit row stride) needs OP_T. None when neither stride is 1."""
    if cols == 1 or col_stride == 1:
        ld = row_stride if rows > 1 else cols
        if ld >= max(1, cols):
            return OP_N, ld
    if rows == 1 or row_stride == 1:
        ld = col_stride if cols > 1 else rows
        if ld >= max(1, rows):
            return OP_T, ld
    return None


def plan(a_shape, a_strides, b_shape, b_strides, c_shape, c_strides):
    """The calls computing c = a @ b for arrays of equal rank >= 2 (batch axes of a and b equal
    to c's or broadcast with stride 0); strides in elements. None if cuBLAS cannot take them:
    c must be row-major (unit column stride), each of a and b have a unit stride on one axis."""
    nd = len(c_shape)
    if nd < 2 or len(a_shape) != nd or len(b_shape) != nd:
        return None
    m, n = c_shape[-2:]
    k = a_shape[-1]
    if a_shape[-2] != m or tuple(b_shape[-2:]) != (k, n):
        return None
    if min(m, n, k) < 1 or any(s < 0 for s in tuple(a_strides) + tuple(b_strides) + tuple(c_strides)):
        return None
    op_b = _matrix(k, n, *b_strides[-2:])
    op_a = _matrix(m, k, *a_strides[-2:])
    if op_a is None or op_b is None:
        return None
    if not (n == 1 or c_strides[-1] == 1):
        return None
    ld_c = c_strides[-2] if m > 1 else n
    if ld_c < max(1, n):
        return None
    # batch axes: drop size-1 ones, merge neighbours that step as one, loop over the outer rest
    axes = []
    for i in range(nd - 2):
        size = c_shape[i]
        if size == 0:
            return None
        if a_shape[i] not in (size, 1) or b_shape[i] not in (size, 1):
            return None
        if size == 1:
            continue
        sa = a_strides[i] if a_shape[i] == size else 0
        sb = b_strides[i] if b_shape[i] == size else 0
        axes.append([size, sa, sb, c_strides[i]])
    merged = []
    for ax in axes:
        if merged:
            last = merged[-1]
            if all(last[j] == ax[j] * ax[0] for j in (1, 2, 3)):
                last[0] *= ax[0]
                last[1:] = ax[1:]
                continue
        merged.append(list(ax))
    if merged:
        batch, stride_a, stride_b, stride_c = merged[-1]
        outer = merged[:-1]
    else:
        batch, stride_a, stride_b, stride_c, outer = 1, 0, 0, 0, []
    if max(m, n, k, batch, op_a[1], op_b[1], ld_c) > _INT_MAX:
        return None
    offsets = tuple(
        (sum(i * ax[1] for i, ax in zip(idx, outer)), sum(i * ax[2] for i, ax in zip(idx, outer)),
         sum(i * ax[3] for i, ax in zip(idx, outer)))
        for idx in itertools.product(*(range(ax[0]) for ax in outer)))
    return Plan(op_b[0], op_a[0], n, m, k, op_b[1], op_a[1], ld_c, stride_b, stride_a, stride_c, batch, offsets)


def _load():
    """CuPy's cuBLAS wrappers, once; None (and why) without real CuPy or its cuBLAS library (the
    CuPy double has neither: its arrays are numpy's, and the isinstance check in gemm_batched
    keeps them away from cuBLAS where a test swaps the double in beside real CuPy)."""
    global _lib, _why_not, _ndarray, _get_handle
    if _lib is None and _why_not is None:
        try:
            from cupy_backends.cuda.libs import cublas
            from cupy._core.core import _ndarray_base
            from cupy.cuda.device import get_cublas_handle
            cublas.gemmStridedBatchedEx  # loads libcublas: fails here when it is missing
        except Exception as e:  # ImportError, or the library loader's own error
            _why_not = f"{type(e).__name__}: {e}"
        else:
            _lib, _ndarray, _get_handle = cublas, _ndarray_base, get_cublas_handle
    return _lib


def available():
    return _load() is not None


def why_unavailable():
    _load()
    return _why_not


_plans = {}  # (shapes, byte strides, itemsize) -> Plan or None: a training step repeats its shapes
_PLAN_CACHE = 256
_ONE, _ZERO = np.ones(1, np.float32), np.zeros(1, np.float32)  # alpha, beta (host pointers)


def gemm_batched(a, b, out):
    """out[...] = a @ b on CUDA through cuBLAS, reading and writing the views in place; False
    (nothing written) where it cannot, and the caller uses CuPy's matmul. `out` must not overlap
    a or b."""
    dt = out.dtype
    if dt != np.float16 or a.dtype != dt or b.dtype != dt or a.ndim != out.ndim or b.ndim != out.ndim:
        return False
    if _load() is None or not all(isinstance(x, _ndarray) for x in (a, b, out)):
        return False
    item = dt.itemsize
    if any(s % item for x in (a, b, out) for s in x.strides):
        return False
    key = (a.shape, a.strides, b.shape, b.strides, out.shape, out.strides, item)
    p = _plans.get(key, False)
    if p is False:
        p = plan(a.shape, [s // item for s in a.strides], b.shape, [s // item for s in b.strides],
                 out.shape, [s // item for s in out.strides])
        if len(_plans) >= _PLAN_CACHE:
            _plans.clear()
        _plans[key] = p
    if p is None:
        return False
    handle = _get_handle()
    pa, pb, pc = a.data.ptr, b.data.ptr, out.data.ptr
    for off_a, off_b, off_c in p.offsets:
        _lib.gemmStridedBatchedEx(
            handle, p.trans_b, p.trans_a, p.m, p.n, p.k, _ONE.ctypes.data,
            pb + off_b * item, _CUDA_R_16F, p.ld_b, p.stride_b,
            pa + off_a * item, _CUDA_R_16F, p.ld_a, p.stride_a,
            _ZERO.ctypes.data, pc + off_c * item, _CUDA_R_16F, p.ld_c, p.stride_c,
            p.batch, _COMPUTE_32F, HALF_ALGO)
    return True
