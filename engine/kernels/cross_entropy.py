"""Cross-entropy of logits against class indices, loss and gradient in one pass over each row, on
one device or split over the vocabulary (Megatron's vocab-parallel cross-entropy).

For a row x (C classes), target t, label smoothing eps, with m = max(x), s = sum(exp(x - m)),
z_t = x[t] - m and sum_z = sum(x - m):
    loss  = log(s) - z_t                                  (eps = 0)
          = (1 - eps) (log(s) - z_t) + eps / C (C log(s) - sum_z)
    dunit = exp(x - m) / s - eps / C - (1 - eps) onehot(t)      (d loss / d x)
A row whose target is `ignore_index` has loss 0 and dunit 0; a row whose target is outside
[0, C) has loss and dunit NaN (checked on the device: nothing is read back to raise an error).
Float16 logits are read as float32 and everything is computed and returned in float32
(float64 logits in float64). The backward of a loss is dx = dunit * g_row (`cross_entropy_bwd`).

Single device, `cross_entropy_fwd(x2, target, ignore_index, smoothing) -> (loss [M], dunit [M, C])`:
one kernel, one block per row; an online max/sum of exp reads the row once, the dunit pass a
second time.

Vocab-parallel, each rank holding columns [start, start + Cl) of the C classes:
    m     = all_reduce_max(row max of the shard)                       (the engine's ClassMax)
    stats = all_reduce_sum(vocab_stats(x2, m, target, start))           [M, 3]: s, z_t, sum_z of
            the shard (z_t = 0 where the target is another rank's)
    loss, dunit = vocab_loss(x2, m, stats, target, start, C, ignore_index, smoothing)
each phase one launch, the collectives between them the engine's.
"""
import numpy as np

from ..backend import xp_of
from ._cuda import COMMON, THREADS, acc_dtype, blocks, f64, i32, i64, instantiate, kernel_name, raw_kernel, \
    row_threads

__all__ = ["cross_entropy_fwd", "cross_entropy_fwd_numpy", "cross_entropy_fwd_cuda",
           "vocab_stats", "vocab_stats_numpy", "vocab_stats_cuda",
           "vocab_loss", "vocab_loss_numpy", "vocab_loss_cuda",
           "cross_entropy_bwd", "cross_entropy_bwd_numpy", "cross_entropy_bwd_cuda"]

SOURCE = COMMON + r"""
__device__ __forceinline__ float acc_log(float v) { return logf(v); }
__device__ __forceinline__ double acc_log(double v) { return log(v); }
template <typename A> __device__ __forceinline__ A quiet_nan() { return -neg_inf<A>() - -neg_inf<A>(); }

// loss[row] and the row of dunit from the row's statistics (see engine/kernels/cross_entropy.py);
// t is the global target, the shard holds classes [start, start + cols) of `classes`
template <typename T>
__device__ void ce_finish_row(const T* x, long long base, int cols, typename Acc<T>::type m,
                              typename Acc<T>::type s, typename Acc<T>::type zt, typename Acc<T>::type sum_z,
                              long long t, long long start, long long classes, long long ignore_index,
                              typename Acc<T>::type eps, typename Acc<T>::type* loss,
                              typename Acc<T>::type* dunit, int row) {
  typedef typename Acc<T>::type A;
  const bool valid = t != ignore_index;
  const bool bad = valid && (t < 0 || t >= classes);
  const A lse = acc_log(s);
  if (threadIdx.x == 0) {
    A l = lse - zt;
    if (eps != A(0)) l = (A(1) - eps) * l + eps / A(classes) * (A(classes) * lse - sum_z);
    loss[row] = bad ? quiet_nan<A>() : valid ? l : A(0);
  }
  const A inv = A(1) / s, off = eps / A(classes), on = A(1) - eps;
  const long long tl = t - start;
  for (int j = threadIdx.x; j < cols; j += blockDim.x) {
    A d = acc_exp(to_acc(x[base + j]) - m) * inv - off;
    if (j == tl) d -= on;
    dunit[base + j] = bad ? quiet_nan<A>() : valid ? d : A(0);
  }
}

// single device: statistics and the finish in one block per row
template <typename T>
__device__ void ce_fwd(const T* x, const long long* target, typename Acc<T>::type* loss,
                       typename Acc<T>::type* dunit, int rows, int cols, long long ignore_index, double smoothing) {
  typedef typename Acc<T>::type A;
  __shared__ A shared[32];
  const int row = blockIdx.x;
  if (row >= rows) return;
  const long long base = (long long)row * cols;
  A m = neg_inf<A>(), s = 0, sx = 0;
  for (int j = threadIdx.x; j < cols; j += blockDim.x) {  // online max and sum of exp
    const A v = to_acc(x[base + j]);
    sx += v;
    if (v > m) {
      s = s * acc_exp(m - v) + A(1);
      m = v;
    } else if (v != neg_inf<A>()) {
      s += acc_exp(v - m);  // a nan v makes s nan
    }
  }
  const A bm = block_max(m, shared);
  s = block_sum(s == A(0) ? A(0) : s * acc_exp(m - bm), shared);
  if (bm == -neg_inf<A>()) s = quiet_nan<A>();  // x - max is nan at an infinite max
  sx = block_sum(sx, shared);
  const long long t = target[row];
  const A zt = (t >= 0 && t < cols) ? to_acc(x[base + t]) - bm : A(0);
  ce_finish_row<T>(x, base, cols, bm, s, zt, sx - A(cols) * bm, t, 0, cols, ignore_index, A(smoothing), loss,
                   dunit, row);
}

// vocab-parallel phase 2: the shard's sum of exp(x - m), target logit z_t and sum of x - m
template <typename T>
__device__ void ce_vocab_stats(const T* x, const typename Acc<T>::type* row_max, const long long* target,
                               typename Acc<T>::type* stats, int rows, int cols, long long start) {
  typedef typename Acc<T>::type A;
  __shared__ A shared[32];
  const int row = blockIdx.x;
  if (row >= rows) return;
  const long long base = (long long)row * cols;
  const A m = row_max[row];
  A s = 0, sz = 0;
  for (int j = threadIdx.x; j < cols; j += blockDim.x) {
    const A z = to_acc(x[base + j]) - m;
    s += acc_exp(z);
    sz += z;
  }
  s = block_sum(s, shared);
  sz = block_sum(sz, shared);
  if (threadIdx.x == 0) {
    const long long tl = target[row] - start;
    stats[3LL * row] = s;
    stats[3LL * row + 1] = (tl >= 0 && tl < cols) ? to_acc(x[base + tl]) - m : A(0);
    stats[3LL * row + 2] = sz;
  }
}

// vocab-parallel phase 3: loss and dunit of the shard from the all-reduced statistics
template <typename T>
__device__ void ce_vocab_loss(const T* x, const typename Acc<T>::type* row_max, const typename Acc<T>::type* stats,
                              const long long* target, typename Acc<T>::type* loss, typename Acc<T>::type* dunit,
                              int rows, int cols, long long start, long long classes, long long ignore_index,
                              double smoothing) {
  typedef typename Acc<T>::type A;
  const int row = blockIdx.x;
  if (row >= rows) return;
  ce_finish_row<T>(x, (long long)row * cols, cols, row_max[row], stats[3LL * row], stats[3LL * row + 1],
                   stats[3LL * row + 2], target[row], start, classes, ignore_index, A(smoothing), loss, dunit, row);
}

// backward: dx = dunit * scale[row * scale_stride] (a per-row or one upstream gradient), grid-stride
template <typename T>
__device__ void ce_bwd(const typename Acc<T>::type* dunit, const typename Acc<T>::type* scale, T* dx, long long n,
                       int cols, int scale_stride) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
    dx[i] = from_acc<T>(dunit[i] * scale[(i / cols) * scale_stride]);
}
""" + "\n".join([
    instantiate("engine_ce_fwd",
                "const {T}* x, const long long* target, Acc<{T}>::type* loss, Acc<{T}>::type* dunit, int rows, "
                "int cols, long long ignore_index, double smoothing",
                "ce_fwd<{T}>(x, target, loss, dunit, rows, cols, ignore_index, smoothing)"),
    instantiate("engine_ce_vocab_stats",
                "const {T}* x, const Acc<{T}>::type* row_max, const long long* target, Acc<{T}>::type* stats, "
                "int rows, int cols, long long start",
                "ce_vocab_stats<{T}>(x, row_max, target, stats, rows, cols, start)"),
    instantiate("engine_ce_vocab_loss",
                "const {T}* x, const Acc<{T}>::type* row_max, const Acc<{T}>::type* stats, const long long* target, "
                "Acc<{T}>::type* loss, Acc<{T}>::type* dunit, int rows, int cols, long long start, long long classes, "
                "long long ignore_index, double smoothing",
                "ce_vocab_loss<{T}>(x, row_max, stats, target, loss, dunit, rows, cols, start, classes, ignore_index, "
                "smoothing)"),
    instantiate("engine_ce_bwd",
                "const Acc<{T}>::type* dunit, const Acc<{T}>::type* scale, {T}* dx, long long n, int cols, "
                "int scale_stride",
                "ce_bwd<{T}>(dunit, scale, dx, n, cols, scale_stride)"),
])


def row_block(cols):
    """Threads per row: whole warps up to 256, 512 for rows of 16 Ki classes and more."""
    return 512 if cols >= 16384 else row_threads(cols)


# ------------------------------------------------------------------ numpy references
def _target_logit(z, target, start):
    """z[row, target - start] where the target is in the shard's columns, else 0."""
    if z.shape[1] == 0:
        return np.zeros(z.shape[0], z.dtype)
    rows = np.arange(z.shape[0])
    local = target.astype(np.int64) - start
    inside = (local >= 0) & (local < z.shape[1])
    return np.where(inside, z[rows, np.where(inside, local, 0)], z.dtype.type(0))


def vocab_stats_numpy(x2, row_max, target, start):
    acc = acc_dtype(x2.dtype)
    with np.errstate(all="ignore"):
        z = x2.astype(acc) - row_max.reshape(-1, 1).astype(acc)
        return np.stack([np.exp(z).sum(axis=1, dtype=acc), _target_logit(z, target, start), z.sum(axis=1, dtype=acc)],
                        axis=1)


def vocab_loss_numpy(x2, row_max, stats, target, start, classes, ignore_index, smoothing):
    acc = acc_dtype(x2.dtype)
    f = acc.type
    target = target.astype(np.int64)
    valid = target != ignore_index
    bad = valid & ((target < 0) | (target >= classes))
    s, zt, sum_z = (stats[:, k].astype(acc) for k in range(3))
    with np.errstate(all="ignore"):
        lse = np.log(s)
        loss = lse - zt
        if smoothing:
            eps = f(smoothing)
            loss = (f(1) - eps) * loss + eps / f(classes) * (f(classes) * lse - sum_z)
        z = x2.astype(acc) - row_max.reshape(-1, 1).astype(acc)
        dunit = np.exp(z) * (f(1) / s)[:, None]
        dunit -= f(smoothing) / f(classes)
        rows = np.arange(x2.shape[0])
        local = target - start
        hit = valid & (local >= 0) & (local < x2.shape[1])
        dunit[rows[hit], local[hit]] -= f(1) - f(smoothing)
    loss = np.where(bad, f(np.nan), np.where(valid, loss, f(0)))
    dunit = np.where(bad[:, None], f(np.nan), np.where(valid[:, None], dunit, f(0)))
    return loss.astype(acc), dunit.astype(acc)


def cross_entropy_fwd_numpy(x2, target, ignore_index, smoothing):
    with np.errstate(all="ignore"):
        m = x2.astype(acc_dtype(x2.dtype)).max(axis=1) if x2.shape[1] else np.full(x2.shape[0], -np.inf)
    stats = vocab_stats_numpy(x2, m, target, 0)
    return vocab_loss_numpy(x2, m, stats, target, 0, x2.shape[1], ignore_index, smoothing)


def cross_entropy_bwd_numpy(dunit, scale, dtype):
    """dx = dunit * scale per row (scale [M], or [1] for one upstream gradient) in `dtype`."""
    return (dunit * scale.reshape(-1, 1)).astype(dtype)


# ------------------------------------------------------------------ CUDA launchers
def _rows_launch(base, x2, *args):
    """Launch the one-block-per-row kernel `base` for the rows of x2 [M, C]."""
    m, c = x2.shape
    raw_kernel(SOURCE, kernel_name(base, x2.dtype))((max(m, 1),), (row_block(c),), (x2,) + args)


def _vectors(xp, acc, *arrays):
    return [xp.ascontiguousarray(a.reshape(-1).astype(acc, copy=False)) for a in arrays]


def _targets(xp, target):
    return xp.ascontiguousarray(target.reshape(-1).astype(np.int64, copy=False))


def cross_entropy_fwd_cuda(x2, target, ignore_index, smoothing):
    xp = xp_of(x2)
    x2 = xp.ascontiguousarray(x2)
    m, c = x2.shape
    acc = acc_dtype(x2.dtype)
    loss, dunit = xp.empty(m, acc), xp.empty((m, c), acc)
    _rows_launch("engine_ce_fwd", x2, _targets(xp, target), loss, dunit, i32(m), i32(c), i64(ignore_index),
                 f64(smoothing))
    return loss, dunit


def vocab_stats_cuda(x2, row_max, target, start):
    xp = xp_of(x2)
    x2 = xp.ascontiguousarray(x2)
    m, c = x2.shape
    acc = acc_dtype(x2.dtype)
    stats = xp.empty((m, 3), acc)
    row_max, = _vectors(xp, acc, row_max)
    _rows_launch("engine_ce_vocab_stats", x2, row_max, _targets(xp, target), stats, i32(m), i32(c), i64(start))
    return stats


def vocab_loss_cuda(x2, row_max, stats, target, start, classes, ignore_index, smoothing):
    xp = xp_of(x2)
    x2 = xp.ascontiguousarray(x2)
    m, c = x2.shape
    acc = acc_dtype(x2.dtype)
    loss, dunit = xp.empty(m, acc), xp.empty((m, c), acc)
    row_max, stats = _vectors(xp, acc, row_max, stats)
    _rows_launch("engine_ce_vocab_loss", x2, row_max, stats, _targets(xp, target), loss, dunit, i32(m), i32(c),
                 i64(start), i64(classes), i64(ignore_index), f64(smoothing))
    return loss, dunit


def cross_entropy_bwd_cuda(dunit, scale, dtype):
    xp = xp_of(dunit)
    m, c = dunit.shape
    dx = xp.empty((m, c), dtype)
    scale, = _vectors(xp, dunit.dtype, scale)
    kernel = raw_kernel(SOURCE, kernel_name("engine_ce_bwd", dtype))
    kernel((blocks(dunit.size),), (THREADS,), (xp.ascontiguousarray(dunit), scale, dx, i64(dunit.size),
                                              i32(max(c, 1)), i32(scale.size > 1)))
    return dx


# ------------------------------------------------------------------ dispatch
def _cuda(x):
    return xp_of(x) is not np


def cross_entropy_fwd(x2, target, ignore_index, smoothing):
    """(loss [M], dunit [M, C]) of logits x2 [M, C] against targets [M] (see the module doc)."""
    fn = cross_entropy_fwd_cuda if _cuda(x2) else cross_entropy_fwd_numpy
    return fn(x2, target, ignore_index, smoothing)


def vocab_stats(x2, row_max, target, start):
    """[M, 3]: (sum of exp(x - m), z_t or 0, sum of x - m) over the shard x2 of columns start.."""
    fn = vocab_stats_cuda if _cuda(x2) else vocab_stats_numpy
    return fn(x2, row_max, target, start)


def vocab_loss(x2, row_max, stats, target, start, classes, ignore_index, smoothing):
    """(loss [M], dunit of the shard [M, Cl]) from all-reduced `stats` (see the module doc)."""
    fn = vocab_loss_cuda if _cuda(x2) else vocab_loss_numpy
    return fn(x2, row_max, stats, target, start, classes, ignore_index, smoothing)


def cross_entropy_bwd(dunit, scale, dtype):
    """dx [M, C] of `dtype` = dunit * scale[row] (scale of size M, or 1)."""
    fn = cross_entropy_bwd_cuda if _cuda(dunit) else cross_entropy_bwd_numpy
    return fn(dunit, scale, dtype)
