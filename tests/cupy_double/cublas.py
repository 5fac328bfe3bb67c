"""The engine's direct cuBLAS calls (engine/backend/cublas.py) in the CuPy double.

`DoubleCublas` stands where libcublas would: `gemm` computes what cublasGemmEx /
cublasGemmStridedBatchedEx define (column-major op(A) op(B), leading dimensions, batch strides,
alpha 1 and beta 0 read from their host pointers) on the double's memory, found by address as a
raw kernel's would be. So the CPU suite runs the engine's products on CUDA through the same
plans, pointers and offsets a GPU gets, and a plan that reads or writes outside its operands
fails here. A launch is counted as one; a call with the current stream capturing is allowed (it
is why the engine calls cuBLAS itself: CuPy's wrappers refuse it) and recorded for the graph.
"""
import ctypes

import numpy as np

from . import _double

_TYPES = {0: np.float32, 1: np.float64, 2: np.float16}
_COMPUTE = {68: np.float32, 77: np.float32, 70: np.float64}
# (A/B type, C type, compute type) combinations cublasGemmEx takes (cuBLAS docs, "cublasGemmEx"),
# of those the engine may pass; anything else is an error a GPU would return
_SUPPORTED = {(2, 2, 68), (2, 0, 68), (0, 0, 68), (0, 0, 77), (1, 1, 70)}


def _matrix(ptr, dtype, rows, cols, ld, trans):
    """op(X) of a column-major matrix at `ptr` (X is rows x cols as stored when not transposed)."""
    stored_rows, stored_cols = (rows, cols) if trans == 0 else (cols, rows)
    count = (stored_cols - 1) * ld + stored_rows
    flat = _double.view(ptr, dtype, count)
    x = np.lib.stride_tricks.as_strided(flat, (stored_rows, stored_cols), (dtype.itemsize, ld * dtype.itemsize))
    return x if trans == 0 else x.T


class DoubleCublas:
    def __init__(self):
        self.calls = 0

    def handle(self, cp):
        return "double-handle"

    def gemm(self, handle, ta, tb, m, n, k, alpha, a, atype, lda, sa, b, btype, ldb, sb, beta, c, ctype, ldc, sc,
             batch, compute, algo):
        dt, out, acc = np.dtype(_TYPES[atype]), np.dtype(_TYPES[ctype]), _COMPUTE[compute]
        assert atype == btype and (atype, ctype, compute) in _SUPPORTED, \
            f"cuBLAS does not take A/B type {atype}, C type {ctype}, compute type {compute}"
        one = ctypes.cast(alpha, ctypes.POINTER(ctypes.c_float if acc == np.float32 else ctypes.c_double))[0]
        zero = ctypes.cast(beta, ctypes.POINTER(ctypes.c_float if acc == np.float32 else ctypes.c_double))[0]
        assert one == 1 and zero == 0, "the engine passes alpha 1 and beta 0"
        if not (lda >= max(1, m if ta == 0 else k) and ldb >= max(1, k if tb == 0 else n) and ldc >= max(1, m)):
            raise ValueError(f"cuBLAS would refuse the leading dimensions lda {lda} ldb {ldb} ldc {ldc} "
                             f"for m {m} n {n} k {k}")
        # the operands resolved now (a replay of a captured call uses these same arrays)
        mats = [(_matrix(a + p * sa * dt.itemsize, dt, m, k, lda, ta), _matrix(b + p * sb * dt.itemsize, dt, k, n, ldb, tb),
                 _matrix(c + p * sc * out.itemsize, out, m, n, ldc, 0)) for p in range(batch)]

        def run():
            for opa, opb, cm in mats:
                cm[...] = (opa.astype(acc) @ opb.astype(acc)).astype(out)

        run()
        _double.record(run)
        self.calls += 1
        _double.stats.launches += 1
        _double.stats.by_name["cublasGemm"] += 1
