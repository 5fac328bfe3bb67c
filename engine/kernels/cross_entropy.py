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

Single device, `cross_entropy_fwd(x2, target, ignore_index, smoothing) -> (loss [M], stats [M, 2])`
(the row's max m and sum of exp(x - m)): one kernel, one block per row, an online max/sum of exp
reading the row once; `cross_entropy_bwd_rows(x2, stats, target, scale, ...) -> dx` recomputes
dunit from the logits and the statistics, one block per row, reading the row once and writing dx.
Nothing of [M, C] is stored between the two (GPT-2's [8192, 50304] float32 dunit was 1.6 GB, written
by the forward and read by the backward: 1.8 + 1.4 ms on an H200). Rows of a multiple of 8 classes
(16-byte aligned) are read 8 elements per thread with 16-byte loads, the same 8 elements for every
dtype, so float16 logits give the bits of the same logits cast to float32.

Vocab-parallel, each rank holding columns [start, start + Cl) of the C classes:
    m     = all_reduce_max(row max of the shard)                       (the engine's ClassMax)
    stats = all_reduce_sum(vocab_stats(x2, m, target, start))           [M, 3]: s, z_t, sum_z of
            the shard (z_t = 0 where the target is another rank's)
    loss, dunit = vocab_loss(x2, m, stats, target, start, C, ignore_index, smoothing)
each phase one launch, the collectives between them the engine's.
"""
import numpy as np

from ..backend import xp_of
from ._cuda import CHUNKS, COMMON, THREADS, acc_dtype, aligned, blocks, f64, i32, i64, instantiate, kernel_name, \
    raw_kernel, row_threads

__all__ = ["cross_entropy_fwd", "cross_entropy_fwd_numpy", "cross_entropy_fwd_cuda",
           "cross_entropy_bwd_rows", "cross_entropy_bwd_rows_numpy", "cross_entropy_bwd_rows_cuda",
           "cross_entropy_dunit_numpy",
           "vocab_stats", "vocab_stats_numpy", "vocab_stats_cuda",
           "vocab_loss", "vocab_loss_numpy", "vocab_loss_cuda",
           "cross_entropy_bwd", "cross_entropy_bwd_numpy", "cross_entropy_bwd_cuda"]

SOURCE = COMMON + CHUNKS + r"""
__device__ __forceinline__ float acc_log(float v) { return logf(v); }
__device__ __forceinline__ double acc_log(double v) { return log(v); }
template <typename A> __device__ __forceinline__ A quiet_nan() { return -neg_inf<A>() - -neg_inf<A>(); }

// a row's loss from its statistics (see engine/kernels/cross_entropy.py): NaN for a target
// outside [0, classes), 0 for ignore_index
template <typename A>
__device__ __forceinline__ A ce_loss(A s, A zt, A sum_z, long long t, long long classes, long long ignore_index,
                                     A eps) {
  const bool valid = t != ignore_index;
  const bool bad = valid && (t < 0 || t >= classes);
  const A lse = acc_log(s);
  A l = lse - zt;
  if (eps != A(0)) l = (A(1) - eps) * l + eps / A(classes) * (A(classes) * lse - sum_z);
  return bad ? quiet_nan<A>() : valid ? l : A(0);
}

// d loss / d x of one logit v of a row (max m, 1 / sum of exp inv); hit: v is the target's
template <typename A>
struct CeRow {
  A m, inv, off, on;
  bool valid, bad;
  __device__ CeRow(A m_, A s, A eps, long long t, long long classes, long long ignore_index)
      : m(m_), inv(A(1) / s), off(eps / A(classes)), on(A(1) - eps), valid(t != ignore_index),
        bad(t != ignore_index && (t < 0 || t >= classes)) {}
  __device__ __forceinline__ A dunit(A v, bool hit) const {
    A d = acc_exp(v - m) * inv - off;
    if (hit) d -= on;
    return bad ? quiet_nan<A>() : valid ? d : A(0);
  }
};

// loss[row] and the row of dunit from the row's statistics; t is the global target, the shard
// holds classes [start, start + cols) of `classes`
template <typename T>
__device__ void ce_finish_row(const T* x, long long base, int cols, typename Acc<T>::type m,
                              typename Acc<T>::type s, typename Acc<T>::type zt, typename Acc<T>::type sum_z,
                              long long t, long long start, long long classes, long long ignore_index,
                              typename Acc<T>::type eps, typename Acc<T>::type* loss,
                              typename Acc<T>::type* dunit, int row) {
  typedef typename Acc<T>::type A;
  if (threadIdx.x == 0) loss[row] = ce_loss(s, zt, sum_z, t, classes, ignore_index, eps);
  const CeRow<A> r(m, s, eps, t, classes, ignore_index);
  const long long tl = t - start;
  for (int j = threadIdx.x; j < cols; j += blockDim.x) dunit[base + j] = r.dunit(to_acc(x[base + j]), j == tl);
}

// the 8 logits of group k of a row starting at x + base, as the accumulation type
template <typename T>
__device__ __forceinline__ void ce_load8(const T* x, long long base, int k, typename Acc<T>::type v[8]) {
  Chunk c[sizeof(T) / 2];
#pragma unroll
  for (int i = 0; i < (int)(sizeof(T) / 2); ++i)
    c[i] = reinterpret_cast<const Chunk*>(x + base)[(long long)k * (sizeof(T) / 2) + i];
  const T* t = reinterpret_cast<const T*>(c);
#pragma unroll
  for (int i = 0; i < 8; ++i) v[i] = to_acc(t[i]);
}

// online max and sum of exp: one logit v into (m, s); sx sums the logits
template <typename A>
__device__ __forceinline__ void ce_online(A v, A& m, A& s, A& sx) {
  sx += v;
  if (v > m) {
    s = s * acc_exp(m - v) + A(1);
    m = v;
  } else if (v != neg_inf<A>()) {
    s += acc_exp(v - m);  // a nan v makes s nan
  }
}

// single device, forward: the row's loss and statistics (max, sum of exp(x - max)), one block per
// row; grouped: 8 logits per thread and step (cols % 8 == 0, rows 16-byte aligned)
template <typename T>
__device__ void ce_fwd(const T* x, const long long* target, typename Acc<T>::type* loss,
                       typename Acc<T>::type* stats, int rows, int cols, long long ignore_index, double smoothing,
                       int grouped) {
  typedef typename Acc<T>::type A;
  __shared__ A shared[32];
  const int row = blockIdx.x;
  if (row >= rows) return;
  const long long base = (long long)row * cols;
  A m = neg_inf<A>(), s = 0, sx = 0;
  if (grouped) {
    for (int k = threadIdx.x; k < cols / 8; k += blockDim.x) {
      A v[8];
      ce_load8(x, base, k, v);
#pragma unroll
      for (int i = 0; i < 8; ++i) ce_online(v[i], m, s, sx);
    }
  } else {
    for (int j = threadIdx.x; j < cols; j += blockDim.x) ce_online(to_acc(x[base + j]), m, s, sx);
  }
  const A bm = block_max(m, shared);
  s = block_sum(s == A(0) ? A(0) : s * acc_exp(m - bm), shared);
  if (bm == -neg_inf<A>()) s = quiet_nan<A>();  // x - max is nan at an infinite max
  sx = block_sum(sx, shared);
  if (threadIdx.x == 0) {
    const long long t = target[row];
    const A zt = (t >= 0 && t < cols) ? to_acc(x[base + t]) - bm : A(0);
    loss[row] = ce_loss(s, zt, sx - A(cols) * bm, t, cols, ignore_index, A(smoothing));
    stats[2LL * row] = bm;
    stats[2LL * row + 1] = s;
  }
}

// single device, backward: dx = dunit * scale[row * scale_stride], dunit recomputed from the
// logits and the forward's statistics, one block per row (grouped as the forward)
template <typename T>
__device__ void ce_bwd_rows(const T* x, const typename Acc<T>::type* stats, const long long* target,
                            const typename Acc<T>::type* scale, T* dx, int rows, int cols, long long ignore_index,
                            double smoothing, int scale_stride, int grouped) {
  typedef typename Acc<T>::type A;
  const int row = blockIdx.x;
  if (row >= rows) return;
  const long long base = (long long)row * cols, t = target[row];
  const CeRow<A> r(stats[2LL * row], stats[2LL * row + 1], A(smoothing), t, cols, ignore_index);
  const A sc = scale[(long long)row * scale_stride];
  if (grouped) {
    for (int k = threadIdx.x; k < cols / 8; k += blockDim.x) {
      A v[8];
      ce_load8(x, base, k, v);
      Chunk c[sizeof(T) / 2];
      T* out = reinterpret_cast<T*>(c);
#pragma unroll
      for (int i = 0; i < 8; ++i) out[i] = from_acc<T>(r.dunit(v[i], 8LL * k + i == t) * sc);
#pragma unroll
      for (int i = 0; i < (int)(sizeof(T) / 2); ++i)
        reinterpret_cast<Chunk*>(dx + base)[(long long)k * (sizeof(T) / 2) + i] = c[i];
    }
  } else {
    for (int j = threadIdx.x; j < cols; j += blockDim.x)
      dx[base + j] = from_acc<T>(r.dunit(to_acc(x[base + j]), j == t) * sc);
  }
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
                "const {T}* x, const long long* target, Acc<{T}>::type* loss, Acc<{T}>::type* stats, int rows, "
                "int cols, long long ignore_index, double smoothing, int grouped",
                "ce_fwd<{T}>(x, target, loss, stats, rows, cols, ignore_index, smoothing, grouped)"),
    instantiate("engine_ce_bwd_rows",
                "const {T}* x, const Acc<{T}>::type* stats, const long long* target, const Acc<{T}>::type* scale, "
                "{T}* dx, int rows, int cols, long long ignore_index, double smoothing, int scale_stride, int grouped",
                "ce_bwd_rows<{T}>(x, stats, target, scale, dx, rows, cols, ignore_index, smoothing, scale_stride, "
                "grouped)"),
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
    """(loss [M], stats [M, 2]: each row's max and sum of exp(x - max))."""
    acc = acc_dtype(x2.dtype)
    with np.errstate(all="ignore"):
        m = x2.astype(acc).max(axis=1) if x2.shape[1] else np.full(x2.shape[0], -np.inf, acc)
    stats = vocab_stats_numpy(x2, m, target, 0)
    loss, _ = vocab_loss_numpy(x2, m, stats, target, 0, x2.shape[1], ignore_index, smoothing)
    return loss, np.stack([m.astype(acc), stats[:, 0]], axis=1)


def cross_entropy_dunit_numpy(x2, stats, target, ignore_index, smoothing):
    """d loss / d x2 per unit of loss [M, C] from the forward's statistics."""
    m, s = stats[:, 0], stats[:, 1]
    three = np.stack([s, np.zeros_like(s), np.zeros_like(s)], axis=1)  # z_t and sum_z only enter the loss
    return vocab_loss_numpy(x2, m, three, target, 0, x2.shape[1], ignore_index, smoothing)[1]


def cross_entropy_bwd_rows_numpy(x2, stats, target, scale, ignore_index, smoothing, dtype):
    """dx = dunit * scale per row (scale [M], or [1]) in `dtype`, dunit from the statistics."""
    return cross_entropy_bwd_numpy(cross_entropy_dunit_numpy(x2, stats, target, ignore_index, smoothing), scale, dtype)


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


def grouped(x2):
    """Whether the single-device kernels read x2 [M, C] 8 logits per thread and step (16-byte
    loads): C a multiple of 8 and x2 16-byte aligned (then every row is)."""
    return x2.shape[1] % 8 == 0 and aligned(x2)


def cross_entropy_fwd_cuda(x2, target, ignore_index, smoothing):
    xp = xp_of(x2)
    x2 = xp.ascontiguousarray(x2)
    m, c = x2.shape
    acc = acc_dtype(x2.dtype)
    loss, stats = xp.empty(m, acc), xp.empty((m, 2), acc)
    _rows_launch("engine_ce_fwd", x2, _targets(xp, target), loss, stats, i32(m), i32(c), i64(ignore_index),
                 f64(smoothing), i32(grouped(x2)))
    return loss, stats


def cross_entropy_bwd_rows_cuda(x2, stats, target, scale, ignore_index, smoothing, dtype):
    xp = xp_of(x2)
    x2 = xp.ascontiguousarray(x2)
    if np.dtype(dtype) != x2.dtype:
        raise ValueError(f"cross_entropy_bwd_rows: dx is written in the logits' dtype {x2.dtype}, not {dtype}")
    m, c = x2.shape
    acc = acc_dtype(x2.dtype)
    dx = xp.empty((m, c), dtype)
    scale, = _vectors(xp, acc, scale)
    _rows_launch("engine_ce_bwd_rows", x2, xp.ascontiguousarray(stats), _targets(xp, target), scale, dx, i32(m),
                 i32(c), i64(ignore_index), f64(smoothing), i32(scale.size > 1), i32(grouped(x2)))
    return dx


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
    """(loss [M], stats [M, 2]) of logits x2 [M, C] against targets [M] (see the module doc)."""
    fn = cross_entropy_fwd_cuda if _cuda(x2) else cross_entropy_fwd_numpy
    return fn(x2, target, ignore_index, smoothing)


def cross_entropy_bwd_rows(x2, stats, target, scale, ignore_index, smoothing, dtype):
    """dx [M, C] of `dtype` (the logits') = dunit * scale[row], dunit recomputed from the logits
    and the forward's `stats` (scale of size M, or 1)."""
    fn = cross_entropy_bwd_rows_cuda if _cuda(x2) else cross_entropy_bwd_rows_numpy
    return fn(x2, stats, target, scale, ignore_index, smoothing, dtype)


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
