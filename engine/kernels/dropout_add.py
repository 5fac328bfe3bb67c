"""Bias + dropout + residual add: y = residual + dropout(x + bias), and the gradient g * mask.

The uniforms come from the engine's CUDA generator stream (engine/kernels/philox.py) at the
stream's (seed, offset), drawn inside the kernel: element e uses the same Philox word as element
e of `generator.random(x.shape)` would (`uniform_float`, four per Philox block, for float16 and
float32; `uniform_double`, two per block, for float64), and is kept when u >= p, as
engine.ops.dropout's mask is. So the fused op drops exactly the elements the separate ops would,
nothing is drawn into memory, and no mask is stored: the backward recomputes it from (seed,
offset). The caller advances the stream's offset by the blocks used (philox.groups).

CUDA: one launch forward (bias and residual optional), one backward (the residual's gradient
is g itself, the bias's the column sum of dx, left to the caller). Each thread takes one Philox
block and its 4 (or 2) elements, grid-stride.
"""
import numpy as np

from .. import backend
from . import philox
from ._cuda import COMMON, THREADS, acc_dtype, blocks, f64, i32, instantiate, kernel_name, raw_kernel

SOURCE = COMMON + philox.SOURCE + r"""
// whether value k of Philox block w is kept (per: values per block, 4 floats or 2 doubles)
__device__ __forceinline__ bool dropout_keep(const u32 w[4], int k, int per, double p) {
  return per == 4 ? u24(w[k]) >= (float)p : u53(w[2 * k], w[2 * k + 1]) >= p;
}

template <typename T>
__device__ void bias_dropout_add(const T* x, const T* b, const T* r, T* y, u64 n, int d, u64 seed, u64 offset,
                                 const u64* state, double p, double scale, int has_b, int has_r) {
  typedef typename Acc<T>::type A;
  stream_position(state, seed, offset);
  const int per = sizeof(T) == 8 ? 2 : 4;  // uniform_double or uniform_float values per Philox block
  const u64 groups = (n + per - 1) / per;
  for (u64 g = blockIdx.x * (u64)blockDim.x + threadIdx.x; g < groups; g += (u64)gridDim.x * blockDim.x) {
    u32 w[4];
    philox(seed, offset + g, w);
    for (int k = 0; k < per; ++k) {
      const u64 e = g * per + k;
      if (e >= n) break;
      const bool keep = dropout_keep(w, k, per, p);
      A v = to_acc(x[e]);
      if (has_b) v += to_acc(b[e % d]);
      v *= keep ? A(scale) : A(0);
      if (has_r) v += to_acc(r[e]);
      y[e] = from_acc<T>(v);
    }
  }
}

template <typename T>
__device__ void dropout_grad(const T* g, T* dx, u64 n, u64 seed, u64 offset, const u64* state, double p,
                             double scale) {
  typedef typename Acc<T>::type A;
  stream_position(state, seed, offset);
  const int per = sizeof(T) == 8 ? 2 : 4;
  const u64 groups = (n + per - 1) / per;
  for (u64 q = blockIdx.x * (u64)blockDim.x + threadIdx.x; q < groups; q += (u64)gridDim.x * blockDim.x) {
    u32 w[4];
    philox(seed, offset + q, w);
    for (int k = 0; k < per; ++k) {
      const u64 e = q * per + k;
      if (e >= n) break;
      const bool keep = dropout_keep(w, k, per, p);
      dx[e] = from_acc<T>(to_acc(g[e]) * (keep ? A(scale) : A(0)));
    }
  }
}
""" + instantiate(
    "engine_bias_dropout_add",
    "const {T}* x, const {T}* b, const {T}* r, {T}* y, u64 n, int d, u64 seed, u64 offset, const u64* state, "
    "double p, double scale, int has_b, int has_r",
    "bias_dropout_add<{T}>(x, b, r, y, n, d, seed, offset, state, p, scale, has_b, has_r)",
) + "\n" + instantiate(
    "engine_dropout_grad",
    "const {T}* g, {T}* dx, u64 n, u64 seed, u64 offset, const u64* state, double p, double scale",
    "dropout_grad<{T}>(g, dx, n, seed, offset, state, p, scale)",
)


uniform_kind = philox.uniform_kind  # the generator draw whose values the kernels use for elements of a dtype


def groups(dtype, n):
    """Philox blocks the kernels use for `n` elements: the generator's offset advance."""
    return philox.groups(uniform_kind(dtype), n)


def keep_scale(p):
    return 0.0 if p >= 1 else 1.0 / (1.0 - p)


def _check(x, bias, residual, p):
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
    if bias is not None and (bias.shape != x.shape[-1:] or bias.dtype != x.dtype):
        raise ValueError(f"bias_dropout_add: bias must be [{x.shape[-1]}] {x.dtype} as the input's last dim, "
                         f"got {list(bias.shape)} {bias.dtype}")
    if residual is not None and (residual.shape != x.shape or residual.dtype != x.dtype):
        raise ValueError(f"bias_dropout_add: residual must be {list(x.shape)} {x.dtype} as the input, "
                         f"got {list(residual.shape)} {residual.dtype}")


# ------------------------------------------------------------------ numpy reference
def scaled_mask(shape, dtype, p, seed, offset):
    """The keep-mask times 1 / (1 - p), in the accumulation dtype of `dtype`, for the stream at
    (seed, offset): as engine.ops.dropout.scaled_keep_mask computes it from the same draw."""
    kind = uniform_kind(dtype)
    u = philox.reference(kind, int(np.prod(shape)), seed, offset).reshape(shape)
    acc = acc_dtype(dtype)
    return (u >= u.dtype.type(p)) * acc.type(keep_scale(p))


def bias_dropout_add_reference(x, bias, residual, p, seed, offset):
    """residual + dropout(x + bias) (bias [d] and residual like x, each optional), in x's dtype."""
    _check(x, bias, residual, p)
    acc = acc_dtype(x.dtype)
    v = x.astype(acc)
    if bias is not None:
        v += bias.astype(acc)
    v *= scaled_mask(x.shape, x.dtype, p, seed, offset)
    if residual is not None:
        v += residual.astype(acc)
    return v.astype(x.dtype)


def dropout_grad_reference(g, p, seed, offset):
    """g times the scaled keep-mask of the forward at (seed, offset)."""
    return (g.astype(acc_dtype(g.dtype)) * scaled_mask(g.shape, g.dtype, p, seed, offset)).astype(g.dtype)


# ------------------------------------------------------------------ CUDA launchers
def _u64(v):
    return np.uint64(int(v) & philox.MASK64)


def bias_dropout_add_cuda(x, bias, residual, p, seed, offset):
    """bias_dropout_add_reference's result, one launch."""
    _check(x, bias, residual, p)
    cp = backend.cupy()
    x = cp.ascontiguousarray(x)
    y = cp.empty(x.shape, x.dtype)
    n = x.size
    if n:
        b = x if bias is None else cp.ascontiguousarray(bias)
        r = x if residual is None else cp.ascontiguousarray(residual)
        kernel = raw_kernel(SOURCE, kernel_name("engine_bias_dropout_add", x.dtype))
        kernel((blocks(groups(x.dtype, n)),), (THREADS,),
               (x, b, r, y, np.uint64(n), i32(x.shape[-1]), _u64(seed), _u64(offset), philox.state_arg(offset), f64(p),
                f64(keep_scale(p)), i32(bias is not None), i32(residual is not None)))
    return y


def dropout_grad_cuda(g, p, seed, offset):
    """dropout_grad_reference's result, one launch."""
    cp = backend.cupy()
    g = cp.ascontiguousarray(g)
    dx = cp.empty(g.shape, g.dtype)
    if g.size:
        kernel = raw_kernel(SOURCE, kernel_name("engine_dropout_grad", g.dtype))
        kernel((blocks(groups(g.dtype, g.size)),), (THREADS,),
               (g, dx, np.uint64(g.size), _u64(seed), _u64(offset), philox.state_arg(offset), f64(p),
                f64(keep_scale(p))))
    return dx


# ------------------------------------------------------------------ dispatch
def bias_dropout_add(x, bias, residual, p, seed, offset):
    """residual + dropout(x + bias) with the uniforms of the generator stream at (seed, offset)
    (module doc): the CUDA kernel for CuPy arrays, the reference otherwise."""
    if isinstance(x, np.ndarray):
        return bias_dropout_add_reference(x, bias, residual, p, seed, offset)
    return bias_dropout_add_cuda(x, bias, residual, p, seed, offset)


def dropout_grad(g, p, seed, offset):
    """The gradient of bias_dropout_add's x from its output's gradient g."""
    if isinstance(g, np.ndarray):
        return dropout_grad_reference(g, p, seed, offset)
    return dropout_grad_cuda(g, p, seed, offset)
