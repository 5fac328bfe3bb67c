"""Intel MKL through ctypes: the CPU backend's matrix products and a few vector-math functions.

Why: numpy's OpenBLAS reaches ~360 GFLOP/s on the transformer shapes of the benchmarks
(2048x384 @ 384x1536, two threads, cold caches) where MKL, which PyTorch links, reaches ~415;
and numpy has no vectorised erf, so exact GELU cost ~20 numpy passes where MKL's vector math
(VML) computes the normal CDF in one. Both are ~15% and ~5x of a BERT step's largest costs.

How: `libmkl_rt` from the `mkl` wheel (x86-64; installed with the project there), loaded with
ctypes, so nothing is compiled. MKL runs *sequentially*: the engine's own thread pool splits a
product by rows or columns exactly as it does for OpenBLAS (engine.backend.parallel explains why
one pool), and a second OpenMP pool would fight it and PyTorch's in the benchmarks. Conditional
numerical reproducibility is set to AUTO, so a product gives the same bits from run to run
whatever the memory alignment of its operands (without it MKL may pick kernels by alignment).

Off switch: `ENGINE_MKL=0` (or MKL missing, or any other machine): everything runs on numpy, and
the results agree to rounding. `available()` says which is in use; the numpy kernels stay the
reference the MKL ones are tested against (tests/engine/test_mkl.py).
"""
import ctypes
import glob
import os
import sys

import numpy as np

_SEQUENTIAL = 1  # MKL_THREADING_SEQUENTIAL
_CBWR_AUTO = 2  # MKL_CBWR_AUTO
_ROW_MAJOR, _NO_TRANS, _TRANS = 101, 111, 112
_VML_HA_IGNORE_ERRORS = 0x2 | 0x100  # VML_HA | VML_ERRMODE_IGNORE: full accuracy, no errno/stderr
_INT_MAX = 2 ** 31 - 1  # MKL_INT of the LP64 interface

_lib = None
_why_not = "not loaded yet"


def _candidates():
    env = os.environ.get("ENGINE_MKL_LIBRARY")
    if env:
        return [env]
    found = []
    for prefix in dict.fromkeys((sys.prefix, sys.base_prefix, os.environ.get("CONDA_PREFIX") or "")):
        if prefix:
            found += sorted(glob.glob(os.path.join(prefix, "lib", "libmkl_rt.so*")), reverse=True)
    return found + ["libmkl_rt.so.3", "libmkl_rt.so.2"]


def _load():
    """Load and configure libmkl_rt once; on any failure leave `_lib` None and say why."""
    global _lib, _why_not
    if os.environ.get("ENGINE_MKL", "1").strip().lower() in ("0", "false", "no", "off"):
        _why_not = "turned off by ENGINE_MKL=0"
        return
    for path in _candidates():
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        break
    else:
        _why_not = "libmkl_rt not found (pip install mkl; x86-64 only)"
        return
    try:
        lib.MKL_Set_Threading_Layer(ctypes.c_int(_SEQUENTIAL))
        # must precede every other MKL call to take effect; 0 is MKL_CBWR_SUCCESS
        if lib.MKL_CBWR_Set(ctypes.c_int(_CBWR_AUTO)) != 0:
            _why_not = f"{path}: MKL_CBWR_Set(AUTO) failed (MKL already in use by another library?)"
            return
        c_int, c_f, c_d, vp = ctypes.c_int, ctypes.c_float, ctypes.c_double, ctypes.c_void_p
        for name, scalar in (("cblas_sgemm", c_f), ("cblas_dgemm", c_d)):
            fn = getattr(lib, name)
            fn.restype = None
            fn.argtypes = [c_int] * 6 + [scalar, vp, c_int, vp, c_int, scalar, vp, c_int]
        for name, scalar in (("cblas_sgemm_batch_strided", c_f), ("cblas_dgemm_batch_strided", c_d)):
            fn = getattr(lib, name)
            fn.restype = None
            fn.argtypes = ([c_int] * 6 + [scalar, vp, c_int, ctypes.c_longlong, vp, c_int, ctypes.c_longlong,
                                          scalar, vp, c_int, ctypes.c_longlong, c_int])
        for prec in "sd":
            for fn_name in _VML_FUNCTIONS:
                fn = getattr(lib, f"vm{prec}{fn_name}")
                fn.restype = None
                fn.argtypes = [c_int, vp, vp, ctypes.c_longlong]
    except AttributeError as e:
        _why_not = f"{path}: {e}"
        return
    _lib = lib
    _why_not = None


_VML_FUNCTIONS = ("CdfNorm", "Erf", "Exp", "Tanh")


def available():
    return _lib is not None


def why_unavailable():
    """None when MKL is in use, else the reason (for the benchmark scripts and error messages)."""
    return _why_not


# ------------------------------------------------------------------ matrix products
def _operand(a):
    """(transpose flag, leading dimension) of a 2-D operand for a row-major cblas call, or None
    when neither axis has unit stride (then numpy does the product)."""
    isz = a.itemsize
    rows, cols = a.shape
    s0, s1 = a.strides
    if s1 == isz and s0 % isz == 0 and (s0 // isz >= max(1, cols) or rows == 1):
        return _NO_TRANS, max(s0 // isz, cols, 1)
    if s0 == isz and s1 % isz == 0 and (s1 // isz >= max(1, rows) or cols == 1):
        return _TRANS, max(s1 // isz, rows, 1)
    return None


def _ptr(a):
    return a.__array_interface__["data"][0]


def gemm(a, b, out):
    """out[...] = a @ b for 2-D float32/float64 arrays if MKL can take them; returns whether it
    did (False: the caller uses numpy). `out` must have unit stride along its rows."""
    if _lib is None or a.ndim != 2 or b.ndim != 2 or out.ndim != 2:
        return False
    dt = out.dtype
    if dt not in (np.float32, np.float64) or a.dtype != dt or b.dtype != dt:
        return False
    m, k = a.shape
    n = b.shape[1]
    if m == 0 or n == 0 or k == 0 or max(m, n, k) > _INT_MAX:
        return False
    if out.strides[1] != dt.itemsize or out.strides[0] % dt.itemsize or out.strides[0] // dt.itemsize < n:
        return False
    pa, pb = _operand(a), _operand(b)
    if pa is None or pb is None:
        return False
    fn = _lib.cblas_sgemm if dt == np.float32 else _lib.cblas_dgemm
    fn(_ROW_MAJOR, pa[0], pb[0], m, n, k, 1.0, _ptr(a), pa[1], _ptr(b), pb[1], 0.0, _ptr(out),
       out.strides[0] // dt.itemsize)
    return True


def _batch_stride(x):
    """The one element stride between consecutive matrices of a (..., r, c) array whose leading
    axes collapse into one evenly strided axis, or None."""
    lead_shape, lead_strides = x.shape[:-2], x.strides[:-2]
    stride = None
    expect = None
    for size, st in zip(reversed(lead_shape), reversed(lead_strides)):
        if size == 1:
            continue
        if stride is None:
            stride = st
        elif st != expect:
            return None
        expect = st * size
    if stride is None:
        stride = 0
    if stride % x.itemsize:
        return None
    return stride // x.itemsize


def gemm_batched(a, b, out):
    """out[i] = a[i] @ b[i] over equal leading (batch) shapes, one MKL call; returns whether it
    did. Attention's per-head products are this shape: 96 small products in one call instead
    of numpy's loop over them."""
    if _lib is None or a.ndim < 3 or a.shape[:-2] != b.shape[:-2] or out.shape[:-2] != a.shape[:-2]:
        return False
    dt = out.dtype
    if dt not in (np.float32, np.float64) or a.dtype != dt or b.dtype != dt or not out.flags.c_contiguous:
        return False
    count = out.size // max(1, out.shape[-1] * out.shape[-2]) if out.size else 0
    m, k = a.shape[-2:]
    n = b.shape[-1]
    if count == 0 or m == 0 or n == 0 or k == 0 or max(m, n, k, count) > _INT_MAX:
        return False
    sa, sb = _batch_stride(a), _batch_stride(b)
    if sa is None or sb is None or (count > 1 and (sa == 0 or sb == 0)):
        # e.g. per-head views (batch, heads, seq, dim) of a (batch, seq, heads, dim) array: the
        # two batch axes do not merge, so one call per leading index (all alike: the first
        # one's answer is everyone's). A matrix repeated along the batch is left to numpy.
        if a.ndim > 3 and a.shape[0] > 1 and gemm_batched(a[0], b[0], out[0]):
            for i in range(1, a.shape[0]):
                gemm_batched(a[i], b[i], out[i])
            return True
        return False
    pa = _operand(np.lib.stride_tricks.as_strided(a, (m, k), a.strides[-2:]))
    pb = _operand(np.lib.stride_tricks.as_strided(b, (k, n), b.strides[-2:]))
    if pa is None or pb is None:
        return False
    fn = _lib.cblas_sgemm_batch_strided if dt == np.float32 else _lib.cblas_dgemm_batch_strided
    fn(_ROW_MAJOR, pa[0], pb[0], m, n, k, 1.0, _ptr(a), pa[1], sa, _ptr(b), pb[1], sb, 0.0, _ptr(out), n,
       m * n, count)
    return True


# ------------------------------------------------------------------ vector math
def vml(name, x, out):
    """out = f(x) elementwise with MKL's vector math, f one of "CdfNorm", "Erf", "Exp", "Tanh",
    for contiguous float32/float64 arrays; returns whether it did (False: use numpy)."""
    if _lib is None or x.dtype != out.dtype or x.dtype not in (np.float32, np.float64):
        return False
    if x.size != out.size or x.size > _INT_MAX or not (x.flags.c_contiguous and out.flags.c_contiguous):
        return False
    if x.size:
        fn = getattr(_lib, ("vms" if x.dtype == np.float32 else "vmd") + name)
        fn(x.size, _ptr(x), _ptr(out), _VML_HA_IGNORE_ERRORS)
    return True


_load()
