"""layer_norm over the last dim of [m, d] rows: forward (y, mean, rstd) and backward (dx, dw, db).

float16 rows are accumulated in float32 and their mean/rstd are float32 (float64 rows in float64),
as PyTorch's CUDA kernels do. CUDA, per call:
  * forward, 1 launch: one block per row; two block reductions (mean, then the variance of the
    centred row: the two-pass formula, no cancellation), then y written; a row of up to 8
    elements per thread (2,048 at 256 threads) is read once, held in registers between passes;
  * backward, 2 launches: `engine_layer_norm_bwd` runs a fixed number of blocks over the rows
    (grid-stride), writes dx and adds each row's g * xhat and g into its block's row of a
    [blocks, d] float partial buffer (each thread owns its columns: no atomics; up to 8 columns
    per thread the row's g and x are read once and the partial sums kept in registers across
    the block's rows, written once);
    `engine_layer_norm_bwd_wb` sums those partials per column in block order, so dw and db have
    the same bits on every run. Without weight and bias the second launch is skipped.
"""
import numpy as np

from .. import backend
from ._cuda import (COMMON, THREADS, acc_dtype, blocks, f64, i32, instantiate, kernel_name, raw_kernel,
                    row_threads)

# blocks of the backward: enough to fill a GPU, few enough that the [blocks, d] float partials of
# dw and db stay small (2 x 4 MiB at d = 1024)
BWD_BLOCKS = 512

SOURCE = COMMON + r"""
// A row of at most CACHED * blockDim.x elements is read from memory once: each thread keeps its
// elements (columns threadIdx.x + k * blockDim.x) in registers between the passes, and the
// backward keeps its columns' dw, db partial sums there across rows. Same operations in the
// same order as the uncached loops below (longer rows), so the same results.
#define CACHED 8

template <typename T, typename TY = T>
__device__ void layer_norm_fwd(const T* x, const T* w, const T* b, TY* y, typename Acc<T>::type* mean,
                               typename Acc<T>::type* rstd, int m, int d, double eps, int has_w, int has_b) {
  typedef typename Acc<T>::type A;
  __shared__ A shared[32];
  const int row = blockIdx.x;
  if (row >= m) return;
  const T* xr = x + (long long)row * d;
  TY* yr = y + (long long)row * d;
  const bool cached = d <= CACHED * (int)blockDim.x;
  A xv[CACHED];
  A s = 0;
  if (cached) {
#pragma unroll
    for (int k = 0; k < CACHED; ++k) {
      const int j = threadIdx.x + k * blockDim.x;
      if (j < d) {
        xv[k] = to_acc(xr[j]);
        s += xv[k];
      }
    }
  } else {
    for (int j = threadIdx.x; j < d; j += blockDim.x) s += to_acc(xr[j]);
  }
  const A mu = block_sum(s, shared) / A(d);
  A v = 0;
  if (cached) {
#pragma unroll
    for (int k = 0; k < CACHED; ++k) {
      if (threadIdx.x + k * blockDim.x < d) {
        const A t = xv[k] - mu;
        v += t * t;
      }
    }
  } else {
    for (int j = threadIdx.x; j < d; j += blockDim.x) {
      const A t = to_acc(xr[j]) - mu;
      v += t * t;
    }
  }
  const A r = acc_rsqrt(block_sum(v, shared) / A(d) + A(eps));
  if (threadIdx.x == 0) {
    mean[row] = mu;
    rstd[row] = r;
  }
  if (cached) {
#pragma unroll
    for (int k = 0; k < CACHED; ++k) {
      const int j = threadIdx.x + k * blockDim.x;
      if (j < d) {
        A h = (xv[k] - mu) * r;
        if (has_w) h *= to_acc(w[j]);
        if (has_b) h += to_acc(b[j]);
        yr[j] = from_acc<TY>(h);
      }
    }
    return;
  }
  for (int j = threadIdx.x; j < d; j += blockDim.x) {
    A h = (to_acc(xr[j]) - mu) * r;
    if (has_w) h *= to_acc(w[j]);
    if (has_b) h += to_acc(b[j]);
    yr[j] = from_acc<TY>(h);
  }
}

// dx = rstd * (g*w - mean(g*w) - xhat * mean(g*w*xhat)) per row; the block's partial dw, db
// (rows blockIdx.x, blockIdx.x + gridDim.x, ...) in row blockIdx.x of part_w, part_b [gridDim.x, d]
template <typename T, typename TG = T>
__device__ void layer_norm_bwd(const TG* g, const T* x, const typename Acc<T>::type* mean,
                               const typename Acc<T>::type* rstd, const T* w, T* dx,
                               typename Acc<T>::type* part_w, typename Acc<T>::type* part_b,
                               int m, int d, int has_w, int has_b) {
  typedef typename Acc<T>::type A;
  __shared__ A shared[32];
  A* pw = part_w + (long long)blockIdx.x * d;
  A* pb = part_b + (long long)blockIdx.x * d;
  if (d <= CACHED * (int)blockDim.x) {
    A sw[CACHED], sb[CACHED], wv[CACHED], gv[CACHED], hv[CACHED];
#pragma unroll
    for (int k = 0; k < CACHED; ++k) {
      const int j = threadIdx.x + k * blockDim.x;
      sw[k] = A(0);
      sb[k] = A(0);
      wv[k] = has_w && j < d ? to_acc(w[j]) : A(1);
    }
    for (int row = blockIdx.x; row < m; row += gridDim.x) {
      const long long base = (long long)row * d;
      const A mu = mean[row], r = rstd[row];
      A c1 = 0, c2 = 0;
#pragma unroll
      for (int k = 0; k < CACHED; ++k) {
        const int j = threadIdx.x + k * blockDim.x;
        if (j < d) {
          gv[k] = to_acc(g[base + j]);
          hv[k] = (to_acc(x[base + j]) - mu) * r;
          const A gw = has_w ? gv[k] * wv[k] : gv[k];
          c1 += gw;
          c2 += gw * hv[k];
          if (has_w) sw[k] += gv[k] * hv[k];
          if (has_b) sb[k] += gv[k];
        }
      }
      c1 = block_sum(c1, shared) / A(d);
      c2 = block_sum(c2, shared) / A(d);
#pragma unroll
      for (int k = 0; k < CACHED; ++k) {
        const int j = threadIdx.x + k * blockDim.x;
        if (j < d) {
          const A gw = has_w ? gv[k] * wv[k] : gv[k];
          dx[base + j] = from_acc<T>(r * (gw - c1 - hv[k] * c2));
        }
      }
    }
#pragma unroll
    for (int k = 0; k < CACHED; ++k) {
      const int j = threadIdx.x + k * blockDim.x;
      if (j < d) {
        if (has_w) pw[j] = sw[k];
        if (has_b) pb[j] = sb[k];
      }
    }
    return;
  }
  for (int j = threadIdx.x; j < d; j += blockDim.x) {
    if (has_w) pw[j] = A(0);
    if (has_b) pb[j] = A(0);
  }
  for (int row = blockIdx.x; row < m; row += gridDim.x) {
    const long long base = (long long)row * d;
    const A mu = mean[row], r = rstd[row];
    A c1 = 0, c2 = 0;
    for (int j = threadIdx.x; j < d; j += blockDim.x) {
      const A gj = to_acc(g[base + j]);
      const A h = (to_acc(x[base + j]) - mu) * r;
      const A gw = has_w ? gj * to_acc(w[j]) : gj;
      c1 += gw;
      c2 += gw * h;
      if (has_w) pw[j] += gj * h;
      if (has_b) pb[j] += gj;
    }
    c1 = block_sum(c1, shared) / A(d);
    c2 = block_sum(c2, shared) / A(d);
    for (int j = threadIdx.x; j < d; j += blockDim.x) {
      const A gj = to_acc(g[base + j]);
      const A h = (to_acc(x[base + j]) - mu) * r;
      const A gw = has_w ? gj * to_acc(w[j]) : gj;
      dx[base + j] = from_acc<T>(r * (gw - c1 - h * c2));
    }
  }
}

// dw[j], db[j] = the sums of the `parts` partial rows, in row order (one thread per column)
template <typename T>
__device__ void layer_norm_bwd_wb(const typename Acc<T>::type* part_w, const typename Acc<T>::type* part_b,
                                  T* dw, T* db, int parts, int d, int has_w, int has_b) {
  typedef typename Acc<T>::type A;
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= d) return;
  A sw = 0, sb = 0;
  for (int p = 0; p < parts; ++p) {
    if (has_w) sw += part_w[(long long)p * d + j];
    if (has_b) sb += part_b[(long long)p * d + j];
  }
  if (has_w) dw[j] = from_acc<T>(sw);
  if (has_b) db[j] = from_acc<T>(sb);
}
""" + instantiate(
    "engine_layer_norm_fwd",
    "const {T}* x, const {T}* w, const {T}* b, {T}* y, Acc<{T}>::type* mean, Acc<{T}>::type* rstd, "
    "int m, int d, double eps, int has_w, int has_b",
    "layer_norm_fwd<{T}>(x, w, b, y, mean, rstd, m, d, eps, has_w, has_b)",
) + "\n" + instantiate(
    "engine_layer_norm_bwd",
    "const {T}* g, const {T}* x, const Acc<{T}>::type* mean, const Acc<{T}>::type* rstd, const {T}* w, "
    "{T}* dx, Acc<{T}>::type* part_w, Acc<{T}>::type* part_b, int m, int d, int has_w, int has_b",
    "layer_norm_bwd<{T}>(g, x, mean, rstd, w, dx, part_w, part_b, m, d, has_w, has_b)",
) + "\n" + instantiate(
    "engine_layer_norm_bwd_wb",
    "const Acc<{T}>::type* part_w, const Acc<{T}>::type* part_b, {T}* dw, {T}* db, int parts, int d, "
    "int has_w, int has_b",
    "layer_norm_bwd_wb<{T}>(part_w, part_b, dw, db, parts, d, has_w, has_b)",
) + r"""
// float32 rows with a float16 y (forward) and a float16 g (backward): layer_norm followed by
// autocast's cast of its output, and that cast's backward before layer_norm's, in one kernel each
extern "C" __global__ void engine_layer_norm_fwd_half_y__float(const float* x, const float* w, const float* b, __half* y,
    float* mean, float* rstd, int m, int d, double eps, int has_w, int has_b) {
  layer_norm_fwd<float, __half>(x, w, b, y, mean, rstd, m, d, eps, has_w, has_b);
}
extern "C" __global__ void engine_layer_norm_bwd_half_g__float(const __half* g, const float* x, const float* mean,
    const float* rstd, const float* w, float* dx, float* part_w, float* part_b, int m, int d, int has_w, int has_b) {
  layer_norm_bwd<float, __half>(g, x, mean, rstd, w, dx, part_w, part_b, m, d, has_w, has_b);
}
"""


# ------------------------------------------------------------------ numpy reference
def normalized_rows(x2, mean, rstd):
    """xhat = (x - mean) * rstd in the accumulation dtype (mean, rstd: [m])."""
    xhat = x2.astype(mean.dtype) - mean[:, None]
    xhat *= rstd[:, None]
    return xhat


def forward_reference(x2, w, b, eps, y_dtype=None):
    """(y, mean, rstd) of layer_norm over the rows of x2 [m, d]; w, b [d] or None; y in x2's dtype
    or `y_dtype` (float16 for float32 rows: rounded from the float32 result)."""
    acc = acc_dtype(x2.dtype)
    x = x2.astype(acc)
    mean = x.mean(axis=1)
    x -= mean[:, None]
    rstd = 1 / np.sqrt((x * x).mean(axis=1) + acc.type(eps))
    x *= rstd[:, None]
    if w is not None:
        x *= w.astype(acc)
    if b is not None:
        x += b.astype(acc)
    return x.astype(y_dtype or x2.dtype), mean, rstd


def backward_reference(g2, x2, mean, rstd, w, has_b):
    """(dx, dw, db) of layer_norm from the output gradient g2 [m, d] (x2's dtype, or float16 for
    float32 rows: a float16 y's gradient) and the forward's mean and rstd [m]; dw is None without
    w, db None unless has_b; all three in x2's dtype."""
    acc = mean.dtype
    d = x2.shape[1]
    g = g2.astype(acc)
    xhat = normalized_rows(x2, mean, rstd)
    gw = g * w.astype(acc) if w is not None else g
    c1 = gw.sum(axis=1, keepdims=True) / acc.type(d)
    c2 = (gw * xhat).sum(axis=1, keepdims=True) / acc.type(d)
    dx = rstd[:, None] * (gw - c1 - xhat * c2)
    dw = (g * xhat).sum(axis=0).astype(x2.dtype) if w is not None else None
    db = g.sum(axis=0).astype(x2.dtype) if has_b else None
    return dx.astype(x2.dtype), dw, db


# ------------------------------------------------------------------ CUDA launchers
def _half_beside(x2, dtype):
    """Whether `dtype` (of y or g) is the float16 a float32 input may have beside it (the
    `_half_y` / `_half_g` kernels), rather than x2's own."""
    return np.dtype(dtype) == np.float16 and x2.dtype == np.float32


def _check(x2, w, b, g2=None):
    """The kernels read every array as x2's element type (g2 also float16 for float32 rows)."""
    for name, p, shape in (("weight", w, x2.shape[1:]), ("bias", b, x2.shape[1:]), ("grad", g2, x2.shape)):
        ok = p is None or (p.shape == shape and (p.dtype == x2.dtype or (p is g2 and _half_beside(x2, p.dtype))))
        if not ok:
            raise TypeError(f"layer_norm kernels: {name} must be {list(shape)} {x2.dtype} as the input, "
                            f"got {list(p.shape)} {p.dtype}")


def forward_cuda(x2, w, b, eps, y_dtype=None):
    """forward_reference's results, one launch."""
    _check(x2, w, b)
    y_dtype = np.dtype(y_dtype or x2.dtype)
    if y_dtype != x2.dtype and not _half_beside(x2, y_dtype):
        raise TypeError(f"layer_norm kernels: y in {y_dtype} for a {x2.dtype} input (float16 beside float32 only)")
    cp = backend.cupy()
    m, d = x2.shape
    x2, w, b = (None if a is None else cp.ascontiguousarray(a) for a in (x2, w, b))
    acc = acc_dtype(x2.dtype)
    y = cp.empty((m, d), y_dtype)
    mean, rstd = cp.empty(m, acc), cp.empty(m, acc)
    base = "engine_layer_norm_fwd_half_y" if y_dtype != x2.dtype else "engine_layer_norm_fwd"
    kernel = raw_kernel(SOURCE, kernel_name(base, x2.dtype))
    kernel((m,), (row_threads(d),), (x2, x2 if w is None else w, x2 if b is None else b, y, mean, rstd,
                                      i32(m), i32(d), f64(eps), i32(w is not None), i32(b is not None)))
    return y, mean, rstd


def backward_cuda(g2, x2, mean, rstd, w, has_b):
    """backward_reference's results, two launches (one without weight and bias)."""
    _check(x2, w, None, g2)
    if mean.dtype != acc_dtype(x2.dtype) or rstd.dtype != mean.dtype:  # the kernel reads them as acc_t*
        raise TypeError(f"layer_norm kernels: mean and rstd must be {acc_dtype(x2.dtype)} for a {x2.dtype} "
                        f"input, got {mean.dtype} and {rstd.dtype}")
    cp = backend.cupy()
    m, d = x2.shape
    g2, x2, mean, rstd = (cp.ascontiguousarray(a) for a in (g2, x2, mean, rstd))
    has_w = w is not None
    w = cp.ascontiguousarray(w) if has_w else x2
    parts = min(m, BWD_BLOCKS)
    dx = cp.empty((m, d), x2.dtype)
    part_w = cp.empty((parts, d), mean.dtype) if has_w else mean  # `mean`: an unread placeholder
    part_b = cp.empty((parts, d), mean.dtype) if has_b else mean
    base = "engine_layer_norm_bwd_half_g" if g2.dtype != x2.dtype else "engine_layer_norm_bwd"
    kernel = raw_kernel(SOURCE, kernel_name(base, x2.dtype))
    kernel((parts,), (row_threads(d),), (g2, x2, mean, rstd, w, dx, part_w, part_b,
                                         i32(m), i32(d), i32(has_w), i32(has_b)))
    if not (has_w or has_b):
        return dx, None, None
    dw = cp.empty(d, x2.dtype) if has_w else None
    db = cp.empty(d, x2.dtype) if has_b else None
    kernel = raw_kernel(SOURCE, kernel_name("engine_layer_norm_bwd_wb", x2.dtype))
    kernel((blocks(d),), (THREADS,), (part_w, part_b, dx if dw is None else dw, dx if db is None else db,
                                      i32(parts), i32(d), i32(has_w), i32(has_b)))
    return dx, dw, db


# ------------------------------------------------------------------ dispatch
def layer_norm_forward(x2, w, b, eps, y_dtype=None):
    """(y, mean, rstd) of layer_norm over the rows of x2 [m, d] (m, d > 0); w and b [d] of x2's
    dtype or None; y in x2's dtype or `y_dtype` (float16 beside float32 rows). The CUDA kernel for
    CuPy arrays, the reference otherwise."""
    if isinstance(x2, np.ndarray):
        return forward_reference(x2, w, b, eps, y_dtype)
    return forward_cuda(x2, w, b, eps, y_dtype)


def layer_norm_backward(g2, x2, mean, rstd, w, has_b):
    """(dx, dw or None, db or None) of layer_norm; arrays as layer_norm_forward's, g2 in y's dtype."""
    if isinstance(x2, np.ndarray):
        return backward_reference(g2, x2, mean, rstd, w, has_b)
    return backward_cuda(g2, x2, mean, rstd, w, has_b)
