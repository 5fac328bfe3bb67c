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
reference the MKL ones are tested against (tests/test_mkl_backend.py).
"""
import ctypes
import os

import numpy as np

from ._native import library_candidates, switched_off

_SEQUENTIAL = 1  # MKL_THREADING_SEQUENTIAL
_CBWR_AUTO = 2  # MKL_CBWR_AUTO
_ROW_MAJOR, _NO_TRANS, _TRANS = 101, 111, 112
_VML_HA_IGNORE_ERRORS = 0x2 | 0x100  # VML_HA | VML_ERRMODE_IGNORE: full accuracy, no errno/stderr
_INT_MAX = 2 ** 31 - 1  # MKL_INT of the LP64 interface

_lib = None
_why_not = "not loaded yet"


def _candidates():
    return library_candidates("ENGINE_MKL_LIBRARY", "libmkl_rt.so*", ["libmkl_rt.so.3", "libmkl_rt.so.2"])


def _load():
    """Load and configure libmkl_rt once; on any failure leave `_lib` None and say why."""
    global _lib, _why_not
    if switched_off("ENGINE_MKL"):
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
        for name in ("cblas_sgemm_batch", "cblas_dgemm_batch"):
            fn = getattr(lib, name)
            fn.restype = None
            fn.argtypes = [c_int] + [vp] * 13 + [c_int, vp]
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
    global _xerbla_keepalive
    _xerbla_keepalive = _XERBLA(_on_parameter_error)
    lib.mkl_set_xerbla(_xerbla_keepalive)
    _lib = lib
    _why_not = None


# MKL reports a bad argument through xerbla, by default a message on stdout and a silent return
# with the output unwritten; here it becomes an exception instead (the checks above should make
# it unreachable: it would mean a layout they wrongly accepted)
_XERBLA = ctypes.CFUNCTYPE(None, ctypes.c_char_p, ctypes.POINTER(ctypes.c_int), ctypes.c_int)
_xerbla_keepalive = None
_errors = []


def _on_parameter_error(name, info, length):
    _errors.append(f"{name[:length].decode(errors='replace')}: parameter {info[0]} rejected")


def _check():
    if _errors:
        msg = _errors.pop()
        _errors.clear()
        raise RuntimeError(f"engine.backend.mkl: MKL {msg} (a layout engine.backend.mkl should have refused; "
                           "ENGINE_MKL=0 avoids MKL)")


_VML_FUNCTIONS = ("CdfNorm", "Erf", "Exp", "Tanh")


def available():
    return _lib is not None


def why_unavailable():
    """None when MKL is in use, else the reason (for the benchmark scripts and error messages)."""
    return _why_not


# ------------------------------------------------------------------ matrix products
def _operand(a):
    """(transpose flag, leading dimension) of a's trailing 2-D matrices for a row-major cblas
    call, or None when neither axis has unit stride (then numpy does the product)."""
    isz = a.itemsize
    rows, cols = a.shape[-2:]
    s0, s1 = a.strides[-2:]
    if s1 == isz and s0 % isz == 0 and (s0 // isz >= max(1, cols) or rows == 1):
        return _NO_TRANS, max(s0 // isz, cols, 1)
    if s0 == isz and s1 % isz == 0 and (s1 // isz >= max(1, rows) or cols == 1):
        return _TRANS, max(s1 // isz, rows, 1)
    return None


# Below this many multiply-adds (all matrices of a call together) numpy's own call is faster than
# this ctypes call (its pointer work costs ~10-20 us; [8,32]x[32,96]: 4.6 us numpy, 27 us here).
SMALL_PRODUCT = 1 << 18


def _cpu_vendor():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("vendor_id"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def _products_preferred():
    """Whether the engine's matrix products go to MKL: on Intel CPUs (MKL's sgemm beat OpenBLAS
    there, ~415 vs ~360 GFLOP/s on the benchmark shapes); not on others, where MKL takes generic
    code paths (measured on an AMD EPYC VM: [2048,384]x[384,1536] one thread 33.7 ms in MKL, 30.0
    in OpenBLAS; the GPT-2 benchmark step 12% faster on OpenBLAS). ENGINE_MKL_GEMM=1 or 0 decides
    instead. The choice depends on the machine only, so a run's bits do not change between runs."""
    env = os.environ.get("ENGINE_MKL_GEMM", "").strip().lower()
    if env in ("0", "false", "no", "off"):
        return False
    if env in ("1", "true", "yes", "on"):
        return True
    return _cpu_vendor() == "GenuineIntel"


_PRODUCTS = _products_preferred()


def use_for(a, b):
    """Whether the engine's products send a @ b (stacked or not) to MKL: MKL in use, preferred on
    this CPU, and the product big enough for its call to pay; callers use numpy if not."""
    if _lib is None or not _PRODUCTS:
        return False
    n = a.shape[-2] * a.shape[-1] * b.shape[-1]
    for d in a.shape[:-2]:
        n *= d
    return n >= SMALL_PRODUCT


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
    _check()
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
    """out[i] = a[i] @ b[i] over equal leading (batch) shapes in one MKL call; returns whether it
    did. Attention's per-head products are this shape: 96 small products in one call instead
    of numpy's loop over them. `out` may be a strided view (unit stride along its rows)."""
    if _lib is None or a.ndim < 3 or a.shape[:-2] != b.shape[:-2] or out.shape[:-2] != a.shape[:-2]:
        return False
    dt = out.dtype
    if dt not in (np.float32, np.float64) or a.dtype != dt or b.dtype != dt:
        return False
    m, k = a.shape[-2:]
    n = b.shape[-1]
    count = 1
    for d in a.shape[:-2]:
        count *= d
    if count == 0 or m == 0 or n == 0 or k == 0 or max(m, n, k, count) > _INT_MAX:
        return False
    if count == 1:
        first = (0,) * (a.ndim - 2)
        return gemm(a[first], b[first], out[first])
    pa, pb, pc = _operand(a), _operand(b), _operand(out)
    if pa is None or pb is None or pc is None or pc[0] != _NO_TRANS:
        return False
    if any(st == 0 and size > 1 for size, st in zip(out.shape[:-2], out.strides[:-2])):
        return False  # a broadcast output: its matrices would be written more than once
    sa, sb, sc = _batch_stride(a), _batch_stride(b), _batch_stride(out)
    scalar = ctypes.c_float if dt == np.float32 else ctypes.c_double
    if None not in (sa, sb, sc) and sc >= pc[1] * m:
        fn = _lib.cblas_sgemm_batch_strided if dt == np.float32 else _lib.cblas_dgemm_batch_strided
        fn(_ROW_MAJOR, pa[0], pb[0], m, n, k, 1.0, _ptr(a), pa[1], sa, _ptr(b), pb[1], sb, 0.0, _ptr(out),
           pc[1], sc, count)
    else:
        # batch axes that do not merge into one stride (per-head views of a [batch, seq, heads,
        # dim] array), interleaved outputs (per-head parts of one), or a matrix repeated along
        # the batch: MKL's pointer-array interface takes any set of disjoint output matrices
        ints = (ctypes.c_int * 1)
        ptr_a, ptr_b, ptr_c = _pointers(a), _pointers(b), _pointers(out)  # alive through the call
        fn = _lib.cblas_sgemm_batch if dt == np.float32 else _lib.cblas_dgemm_batch
        fn(_ROW_MAJOR, ints(pa[0]), ints(pb[0]), ints(m), ints(n), ints(k), (scalar * 1)(1.0),
           _ptr(ptr_a), ints(pa[1]), _ptr(ptr_b), ints(pb[1]), (scalar * 1)(0.0), _ptr(ptr_c), ints(pc[1]), 1,
           ints(count))
    _check()
    return True


def _pointers(x):
    """The addresses of the trailing matrices of x, in C order over its leading axes."""
    batch = x.shape[:-2]
    offsets = np.zeros(batch, np.int64)
    for axis, (size, stride) in enumerate(zip(batch, x.strides[:-2])):
        shape = [1] * len(batch)
        shape[axis] = size
        offsets += (np.arange(size, dtype=np.int64) * stride).reshape(shape)
    return (offsets.reshape(-1) + _ptr(x)).astype(np.uint64)


# ------------------------------------------------------------------ vector math
def vml(name, x, out):
    """out = f(x) elementwise with MKL's vector math, f one of "CdfNorm", "Erf", "Exp", "Tanh",
    for contiguous float32/float64 arrays (in place allowed); returns whether it did (False: use
    numpy). Not for a softmax's exp: every input whose result underflows takes a slow path
    (~100x), with or without MKL's flush-to-zero mode (engine.backend.fpenv)."""
    if _lib is None or x.dtype != out.dtype or x.dtype not in (np.float32, np.float64):
        return False
    if x.size != out.size or x.size > _INT_MAX or not (x.flags.c_contiguous and out.flags.c_contiguous):
        return False
    if x.size:
        fn = getattr(_lib, ("vms" if x.dtype == np.float32 else "vmd") + name)
        fn(x.size, _ptr(x), _ptr(out), _VML_HA_IGNORE_ERRORS)
        _check()
    return True


_load()
