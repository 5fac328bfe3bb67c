"""GELU with an optional bias over the last dim: y = gelu(x + b), and dx = g * gelu'(x + b).

Exact (approximate="none"): gelu(v) = v * Phi(v) = 0.5 v (1 + erf(v / sqrt 2)).
tanh (approximate="tanh"): 0.5 v (1 + tanh(sqrt(2/pi) (v + 0.044715 v^3))).

CUDA: one launch forward and one backward, computed in float (double for float64); x + b is
never written out, so a Linear that leaves its bias to this kernel saves a pass over its output
(LiBai's bias_gelu_fusion). The bias gradient is the column sum of dx, left to the caller.
C-contiguous operands take a raw kernel moving 16 bytes per thread (8 halves: a [8192, 3072]
float16 GELU ran at ~0.8 TB/s as an ElementwiseKernel on an H200, ~a quarter of the copy
bandwidth; the same chunking took the bias add from 0.78 to 2.7 TB/s, engine/kernels/bias_add.py);
other layouts keep the ElementwiseKernel, which broadcasts and follows strides.
"""
import math

import numpy as np

from .. import backend
from ._cuda import CHUNK_BYTES, CHUNKS, COMMON, THREADS, acc_dtype, blocks, elementwise_kernel, i32, instantiate, \
    kernel_name, raw_kernel, rows_chunked

APPROXIMATIONS = ("none", "tanh")
_K0 = math.sqrt(2 / math.pi)
_K1 = 0.044715

FUNCTIONS = r"""
__device__ __forceinline__ float gelu_erf(float v) { return 0.5f * v * (1.0f + erff(v * 0.70710678118654752f)); }
__device__ __forceinline__ double gelu_erf(double v) { return 0.5 * v * (1.0 + erf(v * 0.70710678118654752)); }

// d/dv v Phi(v) = Phi(v) + v phi(v)
__device__ __forceinline__ float gelu_erf_grad(float v) {
  return 0.5f * (1.0f + erff(v * 0.70710678118654752f)) + v * 0.39894228040143268f * expf(-0.5f * v * v);
}
__device__ __forceinline__ double gelu_erf_grad(double v) {
  return 0.5 * (1.0 + erf(v * 0.70710678118654752)) + v * 0.39894228040143268 * exp(-0.5 * v * v);
}

__device__ __forceinline__ float gelu_tanh(float v) {
  return 0.5f * v * (1.0f + tanhf(0.79788456080286536f * (v + 0.044715f * v * v * v)));
}
__device__ __forceinline__ double gelu_tanh(double v) {
  return 0.5 * v * (1.0 + tanh(0.79788456080286536 * (v + 0.044715 * v * v * v)));
}

// 0.5 (1 + t) + 0.5 v (1 - t^2) k0 (1 + 3 k1 v^2), t = tanh(k0 (v + k1 v^3))
__device__ __forceinline__ float gelu_tanh_grad(float v) {
  const float t = tanhf(0.79788456080286536f * (v + 0.044715f * v * v * v));
  return 0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * 0.79788456080286536f * (1.0f + 0.134145f * v * v);
}
__device__ __forceinline__ double gelu_tanh_grad(double v) {
  const double t = tanh(0.79788456080286536 * (v + 0.044715 * v * v * v));
  return 0.5 * (1.0 + t) + 0.5 * v * (1.0 - t * t) * 0.79788456080286536 * (1.0 + 0.134145 * v * v);
}
"""
# the ElementwiseKernels' preamble: the accumulation type (COMMON has it for the raw kernels)
PREAMBLE = r"""
template <typename T> struct Acc { typedef float type; };
template <> struct Acc<double> { typedef double type; };
""" + FUNCTIONS


# the raw kernels: one per (kind, direction) and dtype, bias and chunking as arguments
RAW_SOURCE = COMMON + CHUNKS + FUNCTIONS + r"""
__device__ __forceinline__ float gelu_erf_fwd(float v, float) { return gelu_erf(v); }
__device__ __forceinline__ double gelu_erf_fwd(double v, double) { return gelu_erf(v); }
__device__ __forceinline__ float gelu_tanh_fwd(float v, float) { return gelu_tanh(v); }
__device__ __forceinline__ double gelu_tanh_fwd(double v, double) { return gelu_tanh(v); }
__device__ __forceinline__ float gelu_erf_bwd(float v, float g) { return g * gelu_erf_grad(v); }
__device__ __forceinline__ double gelu_erf_bwd(double v, double g) { return g * gelu_erf_grad(v); }
__device__ __forceinline__ float gelu_tanh_bwd(float v, float g) { return g * gelu_tanh_grad(v); }
__device__ __forceinline__ double gelu_tanh_bwd(double v, double g) { return g * gelu_tanh_grad(v); }

// out = F(x + b, g) elementwise (b over rows of d, optional; the forward's F ignores g, which is
// then x, and the compiler drops its loads);
// chunked: 16 bytes of each operand per thread (see the module doc), else one element
#define GELU_KERNEL(F)                                                                                      \
template <typename T>                                                                                       \
__device__ void F##_rows(const T* g, const T* x, const T* b, T* out, u64 n, int d, int has_b, int chunked) { \
  typedef typename Acc<T>::type A;                                                                          \
  if (chunked) {                                                                                            \
    const unsigned int per = 16 / sizeof(T), chunks = (unsigned int)(n / per), row = (unsigned int)d / per;  \
    for (unsigned int k = blockIdx.x * blockDim.x + threadIdx.x; k < chunks; k += gridDim.x * blockDim.x) {  \
      const Chunk xc = reinterpret_cast<const Chunk*>(x)[k];                                                \
      const Chunk gc = reinterpret_cast<const Chunk*>(g)[k];                                                \
      const Chunk bc = has_b ? reinterpret_cast<const Chunk*>(b)[k % row] : xc;                             \
      Chunk oc;                                                                                             \
      const T* xt = reinterpret_cast<const T*>(&xc);                                                        \
      const T* gt = reinterpret_cast<const T*>(&gc);                                                        \
      const T* bt = reinterpret_cast<const T*>(&bc);                                                        \
      T* ot = reinterpret_cast<T*>(&oc);                                                                    \
      _Pragma("unroll")                                                                                     \
      for (int j = 0; j < (int)(16 / sizeof(T)); ++j)                                                       \
        ot[j] = from_acc<T>(F(to_acc(xt[j]) + (has_b ? to_acc(bt[j]) : A(0)), to_acc(gt[j])));              \
      reinterpret_cast<Chunk*>(out)[k] = oc;                                                                \
    }                                                                                                       \
    return;                                                                                                 \
  }                                                                                                         \
  for (u64 e = blockIdx.x * (u64)blockDim.x + threadIdx.x; e < n; e += (u64)gridDim.x * blockDim.x)        \
    out[e] = from_acc<T>(F(to_acc(x[e]) + (has_b ? to_acc(b[e % d]) : A(0)), to_acc(g[e])));                \
}
GELU_KERNEL(gelu_erf_fwd)
GELU_KERNEL(gelu_tanh_fwd)
GELU_KERNEL(gelu_erf_bwd)
GELU_KERNEL(gelu_tanh_bwd)
""" + "\n".join(instantiate(f"engine_gelu_rows_{f}", "const {T}* g, const {T}* x, const {T}* b, {T}* out, "
                             "unsigned long long n, int d, int has_b, int chunked",
                             f"gelu_{f}_rows<{{T}}>(g, x, b, out, n, d, has_b, chunked)")
                 for f in ("erf_fwd", "tanh_fwd", "erf_bwd", "tanh_bwd"))


def raw_name(approximate, backward, dtype):
    """The raw kernel instantiation for C-contiguous operands."""
    kind = "erf" if approximate == "none" else "tanh"
    return kernel_name(f"engine_gelu_rows_{kind}_{'bwd' if backward else 'fwd'}", dtype)


def _raw_ok(arrays):
    """C-contiguous, non-empty operands of one dtype (the bias of the last dim) for the raw kernel."""
    x = arrays[0]
    return x.ndim >= 1 and x.size > 0 and all(a.flags.c_contiguous and a.dtype == x.dtype for a in arrays)


def _raw(approximate, backward, g, x, bias):
    """out = gelu(x + bias) or g * gelu'(x + bias) through the raw kernel."""
    out = backend.cupy().empty(x.shape, x.dtype)
    vec = rows_chunked(out, *(a for a in (g, x, bias) if a is not None))
    items = out.size * out.dtype.itemsize // CHUNK_BYTES if vec else out.size
    raw_kernel(RAW_SOURCE, raw_name(approximate, backward, x.dtype))(
        (blocks(items),), (THREADS,),
        (g if g is not None else x, x, bias if bias is not None else x, out, np.uint64(out.size), i32(x.shape[-1]),
         i32(bias is not None), i32(vec)))
    return out


def kernel_spec(approximate, backward, with_bias):
    """(name, in_params, out_params, operation) of one of the eight GELU kernels."""
    kind = "erf" if approximate == "none" else "tanh"
    name = f"engine_{'bias_' if with_bias else ''}gelu_{kind}_{'bwd' if backward else 'fwd'}"
    ins = (["T g"] if backward else []) + ["T x"] + (["T b"] if with_bias else [])
    v = "(A)x + (A)b" if with_bias else "(A)x"
    if backward:
        out, value = "T dx", f"(A)g * gelu_{kind}_grad(v)"
    else:
        out, value = "T y", f"gelu_{kind}(v)"
    operation = f"typedef Acc<T>::type A; const A v = {v}; {out[2:]} = (T)({value});"
    return name, ", ".join(ins), out, operation


def _kernel(approximate, backward, with_bias):
    name, ins, out, operation = kernel_spec(approximate, backward, with_bias)
    return elementwise_kernel(ins, out, operation, name, preamble=PREAMBLE)


# ------------------------------------------------------------------ numpy reference
def _check(approximate):
    if approximate not in APPROXIMATIONS:
        raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")


def _v(x, bias):
    acc = acc_dtype(x.dtype)
    v = x.astype(acc)
    if bias is not None:
        v += bias.astype(acc)
    return v


def _erf(v):
    import scipy.special

    return scipy.special.erf(v)


def gelu_reference(x, bias=None, approximate="none"):
    """gelu(x + bias) in float (double for float64), in x's dtype."""
    _check(approximate)
    v = _v(x, bias)
    if approximate == "none":
        y = 0.5 * v * (1 + _erf(v * v.dtype.type(1 / math.sqrt(2))))
    else:
        y = 0.5 * v * (1 + np.tanh(v.dtype.type(_K0) * (v + v.dtype.type(_K1) * v * v * v)))
    return y.astype(x.dtype)


def gelu_grad_reference(g, x, bias=None, approximate="none"):
    """g * gelu'(x + bias), in x's dtype."""
    _check(approximate)
    v = _v(x, bias)
    f = v.dtype.type
    if approximate == "none":
        d = 0.5 * (1 + _erf(v * f(1 / math.sqrt(2)))) + v * f(1 / math.sqrt(2 * math.pi)) * np.exp(f(-0.5) * v * v)
    else:
        t = np.tanh(f(_K0) * (v + f(_K1) * v * v * v))
        d = 0.5 * (1 + t) + 0.5 * v * (1 - t * t) * f(_K0) * (1 + f(3 * _K1) * v * v)
    return (g.astype(v.dtype) * d).astype(x.dtype)


# ------------------------------------------------------------------ CUDA launchers
def _check_bias(x, bias):
    if bias is not None and (bias.shape != x.shape[-1:] or bias.dtype != x.dtype):
        raise ValueError(f"bias_gelu: bias must be [{x.shape[-1]}] {x.dtype} as the input's last dim, "
                         f"got {list(bias.shape)} {bias.dtype}")


def gelu_cuda(x, bias=None, approximate="none"):
    """gelu_reference's result, one launch."""
    _check(approximate)
    _check_bias(x, bias)
    args = (x,) if bias is None else (x, bias)
    if _raw_ok(args):
        return _raw(approximate, False, None, x, bias)
    return _kernel(approximate, False, bias is not None)(*args)


def gelu_grad_cuda(g, x, bias=None, approximate="none"):
    """gelu_grad_reference's result, one launch."""
    _check(approximate)
    _check_bias(x, bias)
    g = g.astype(x.dtype, copy=False)
    args = (g, x) if bias is None else (g, x, bias)
    if g.shape == x.shape and _raw_ok(args):
        return _raw(approximate, True, g, x, bias)
    return _kernel(approximate, True, bias is not None)(*args)


# ------------------------------------------------------------------ dispatch
def gelu(x, bias=None, approximate="none"):
    """gelu(x + bias) (bias [d] over the last dim, or None): the CUDA kernel for CuPy arrays,
    the reference otherwise."""
    if isinstance(x, np.ndarray):
        return gelu_reference(x, bias, approximate)
    return gelu_cuda(x, bias, approximate)


def gelu_grad(g, x, bias=None, approximate="none"):
    """g * gelu'(x + bias): the CUDA kernel for CuPy arrays, the reference otherwise."""
    if isinstance(x, np.ndarray):
        return gelu_grad_reference(g, x, bias, approximate)
    return gelu_grad_cuda(g, x, bias, approximate)
