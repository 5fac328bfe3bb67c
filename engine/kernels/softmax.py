"""Attention softmax over the last dim: y = softmax(z) with z = x * scale, masked, and its gradient.

Masks, any combination of:
  * `mask`, broadcastable to x: a bool array (True = masked: z = fill there) or a float array
    added to z (an additive mask);
  * `causal`: x is [..., q, k] and query i (of q) sees keys j <= i + (k - q) (the last q of k
    positions; with a KV cache the first k - q keys are the past). Masked keys get z = fill, as
    with a bool mask, and the kernel computes the condition from the row index: no mask array.
The gradient dx = scale * y * (g - sum(g * y)) is exactly zero where a bool mask or the causal
flag masks (those z are constants of x).

CUDA: one block per row, 1 launch forward (max, sum of exp, write) and 1 backward. A broadcast
mask is read in place through strides: the leading dims of x are folded into at most three
(b, h, q of attention scores), each with the mask's element stride (0 where it broadcasts).
"""
import numpy as np

from .. import backend
from ._cuda import COMMON, acc_dtype, f64, i32, i64, instantiate, kernel_name, raw_kernel, row_threads

MASK_NONE, MASK_BOOL, MASK_ADD = 0, 1, 2

SOURCE = COMMON + r"""
// The mask's element offset of row `row` (leading dims folded to l0 x l1 x l2, strides t0, t1, t2).
__device__ __forceinline__ long long mask_row(long long row, int l1, int l2, long long t0, long long t1,
                                              long long t2) {
  const long long i2 = row % l2;
  row /= l2;
  const long long i1 = row % l1;
  return (row / l1) * t0 + i1 * t1 + i2 * t2;
}

template <typename T>
__device__ void softmax_fwd(const T* x, const unsigned char* bmask, const typename Acc<T>::type* amask, T* y,
                            int m, int d, int q, double scale, double fill, int mask_kind, int causal,
                            int l1, int l2, long long t0, long long t1, long long t2, long long tl) {
  typedef typename Acc<T>::type A;
  __shared__ A shared[32];
  const int row = blockIdx.x;
  if (row >= m) return;
  const long long base = (long long)row * d;
  const long long moff = mask_kind ? mask_row(row, l1, l2, t0, t1, t2) : 0;
  const int last = causal ? row % q + (d - q) : d - 1;  // keys after `last` are masked
  const A s = A(scale), f = A(fill);
  auto score = [&](int j) -> A {
    if (j > last || (mask_kind == 1 && bmask[moff + j * tl])) return f;
    A z = to_acc(x[base + j]) * s;
    if (mask_kind == 2) z += amask[moff + j * tl];
    return z;
  };
  A mx = neg_inf<A>();
  for (int j = threadIdx.x; j < d; j += blockDim.x) mx = nan_max(mx, score(j));
  mx = block_max(mx, shared);
  A sum = 0;
  for (int j = threadIdx.x; j < d; j += blockDim.x) sum += acc_exp(score(j) - mx);
  const A inv = A(1) / block_sum(sum, shared);
  for (int j = threadIdx.x; j < d; j += blockDim.x) y[base + j] = from_acc<T>(acc_exp(score(j) - mx) * inv);
}

template <typename T>
__device__ void softmax_bwd(const T* g, const T* y, const unsigned char* bmask, T* dx, int m, int d, int q,
                            double scale, int has_mask, int causal, int l1, int l2, long long t0, long long t1,
                            long long t2, long long tl) {
  typedef typename Acc<T>::type A;
  __shared__ A shared[32];
  const int row = blockIdx.x;
  if (row >= m) return;
  const long long base = (long long)row * d;
  const long long moff = has_mask ? mask_row(row, l1, l2, t0, t1, t2) : 0;
  const int last = causal ? row % q + (d - q) : d - 1;
  A dot = 0;
  for (int j = threadIdx.x; j < d; j += blockDim.x) dot += to_acc(g[base + j]) * to_acc(y[base + j]);
  dot = block_sum(dot, shared);
  const A s = A(scale);
  for (int j = threadIdx.x; j < d; j += blockDim.x) {
    const bool masked = j > last || (has_mask && bmask[moff + j * tl]);
    dx[base + j] = from_acc<T>(masked ? A(0) : s * to_acc(y[base + j]) * (to_acc(g[base + j]) - dot));
  }
}
""" + instantiate(
    "engine_softmax_fwd",
    "const {T}* x, const unsigned char* bmask, const Acc<{T}>::type* amask, {T}* y, int m, int d, int q, "
    "double scale, double fill, int mask_kind, int causal, int l1, int l2, long long t0, long long t1, "
    "long long t2, long long tl",
    "softmax_fwd<{T}>(x, bmask, amask, y, m, d, q, scale, fill, mask_kind, causal, l1, l2, t0, t1, t2, tl)",
) + "\n" + instantiate(
    "engine_softmax_bwd",
    "const {T}* g, const {T}* y, const unsigned char* bmask, {T}* dx, int m, int d, int q, double scale, "
    "int has_mask, int causal, int l1, int l2, long long t0, long long t1, long long t2, long long tl",
    "softmax_bwd<{T}>(g, y, bmask, dx, m, d, q, scale, has_mask, causal, l1, l2, t0, t1, t2, tl)",
)


# ------------------------------------------------------------------ numpy reference
def causal_mask(q, k):
    """[q, k] bool, True where query i must not see key j: j > i + (k - q)."""
    return np.arange(k)[None, :] > np.arange(q)[:, None] + (k - q)


def _check_causal(shape, causal):
    if causal and len(shape) < 2:
        raise ValueError(f"softmax: causal=True needs scores [..., q, k], got shape {list(shape)}")


def forward_reference(x, mask=None, scale=1.0, fill=-10000.0, causal=False):
    """softmax over the last dim of z = x * scale, with z = fill where the bool `mask` or the causal
    flag masks, and a float `mask` added to z."""
    _check_causal(x.shape, causal)
    acc = acc_dtype(x.dtype)
    z = x.astype(acc) * acc.type(scale)
    if mask is not None and mask.dtype == np.bool_:
        z = np.where(mask, acc.type(fill), z)
    elif mask is not None:
        z += mask.astype(acc)
    if causal:
        z = np.where(causal_mask(*x.shape[-2:]), acc.type(fill), z)
    z -= z.max(axis=-1, keepdims=True)
    np.exp(z, out=z)
    z /= z.sum(axis=-1, keepdims=True)
    return z.astype(x.dtype)


def backward_reference(g, y, mask=None, scale=1.0, causal=False):
    """dx = scale * y * (g - sum(g * y)) over the last dim, zero where the bool `mask` (a float
    mask: no effect) or the causal flag masks."""
    _check_causal(y.shape, causal)
    acc = acc_dtype(y.dtype)
    g, ya = g.astype(acc), y.astype(acc)
    dx = ya * (g - (g * ya).sum(axis=-1, keepdims=True)) * acc.type(scale)
    if mask is not None and mask.dtype == np.bool_:
        dx = np.where(mask, acc.type(0), dx)
    if causal:
        dx = np.where(causal_mask(*y.shape[-2:]), acc.type(0), dx)
    return dx.astype(y.dtype)


# ------------------------------------------------------------------ CUDA launchers
def mask_layout(xp, mask, shape):
    """(mask as the kernel reads it, l1, l2, t0, t1, t2, tl): element strides of `mask` broadcast to
    `shape`, the leading dims folded into three (l0 x l1 x l2; the kernel derives l0)."""
    nd = len(shape)
    mask = xp.ascontiguousarray(unbroadcast(mask))
    mask = mask.reshape((1,) * (nd - mask.ndim) + tuple(mask.shape))
    dims = _fold(shape[:-1], _broadcast_strides(mask.shape)[:-1])
    if len(dims) > 3:  # a broadcast pattern three dims cannot express: the mask written out
        mask = xp.ascontiguousarray(xp.broadcast_to(mask, shape))
        dims = _fold(shape[:-1], _broadcast_strides(mask.shape)[:-1])
    dims = [(1, 0)] * (3 - len(dims)) + dims
    tl = _broadcast_strides(mask.shape)[-1]
    return mask, dims[1][0], dims[2][0], dims[0][1], dims[1][1], dims[2][1], tl


def unbroadcast(a):
    """`a` with each broadcast axis (stride 0) cut to size 1: a view that broadcasts back to `a`,
    so that making it contiguous copies the data, not its broadcast (measured on an H100: a
    causal mask broadcast to GPT-2 124M's [8, 12, 1024, 1024] scores was copied out, 100 MB,
    twice per layer: 11 ms of a 76 ms step)."""
    if 0 not in a.strides:
        return a
    return a[tuple(slice(0, 1) if st == 0 and n > 1 else slice(None) for n, st in zip(a.shape, a.strides))]


def _broadcast_strides(shape):
    """Element strides of a C-contiguous array of `shape`, 0 along its size-1 dims."""
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step if n > 1 else 0)
        step *= n
    return strides[::-1]


def _fold(sizes, strides):
    """[(size, stride)] of the dims, size-1 dims dropped and neighbours merged where the outer
    one's stride is the inner one's times its size (so one index walks both)."""
    dims = []
    for n, t in zip(sizes, strides):
        if n == 1:
            continue
        if dims and dims[-1][1] == t * n:
            dims[-1] = (dims[-1][0] * n, t)
        else:
            dims.append((n, t))
    return dims


def _layout(xp, shape, mask, causal):
    """(mask array or None, mask kind, the kernels' row scalars q, l1, l2, t0, t1, t2, tl)."""
    _check_causal(shape, causal)
    q = shape[-2] if causal else 1
    if mask is None:
        return None, MASK_NONE, (i32(q), i32(1), i32(1), i64(0), i64(0), i64(0), i64(0))
    kind = MASK_BOOL if mask.dtype == np.bool_ else MASK_ADD
    mask, l1, l2, t0, t1, t2, tl = mask_layout(xp, mask, shape)
    return mask, kind, (i32(q), i32(l1), i32(l2), i64(t0), i64(t1), i64(t2), i64(tl))


def _out(xp, out, like):
    """`out` when the kernel can write it directly (C-contiguous, like's shape and dtype; it may
    be the input itself: each thread reads its elements before it writes them), else a new array."""
    if out is not None and out.shape == like.shape and out.dtype == like.dtype and out.flags.c_contiguous:
        return out
    return xp.empty(like.shape, like.dtype)


def _into(out, result):
    """`result`, copied into `out` first when `out` is given and is not already it."""
    if out is None or out is result:
        return result
    out[...] = result
    return out


def forward_cuda(x, mask=None, scale=1.0, fill=-10000.0, causal=False, out=None):
    """forward_reference's result, one launch (into `out` when given; `out` may be `x`)."""
    cp = backend.cupy()
    d = x.shape[-1]
    m = x.size // d
    x = cp.ascontiguousarray(x)
    y = _out(cp, out, x)
    if mask is not None and mask.dtype != np.bool_:
        mask = mask.astype(acc_dtype(x.dtype), copy=False)
    mask, kind, (q, *layout) = _layout(cp, x.shape, mask, causal)
    kernel = raw_kernel(SOURCE, kernel_name("engine_softmax_fwd", x.dtype))
    kernel((m,), (row_threads(d),), (x, mask if kind == MASK_BOOL else x, mask if kind == MASK_ADD else x, y,
                                     i32(m), i32(d), q, f64(scale), f64(fill), i32(kind), i32(causal), *layout))
    return _into(out, y)


def backward_cuda(g, y, mask=None, scale=1.0, causal=False, out=None):
    """backward_reference's result, one launch (into `out` when given; `out` may be `g`)."""
    cp = backend.cupy()
    if g.dtype != y.dtype:  # both in the wider dtype, the result in y's
        work = np.promote_types(g.dtype, y.dtype)
        return _into(out, backward_cuda(g.astype(work), y.astype(work), mask, scale, causal).astype(y.dtype))
    d = y.shape[-1]
    m = y.size // d
    g, y = cp.ascontiguousarray(g), cp.ascontiguousarray(y)
    dx = _out(cp, out, y)
    if mask is not None and mask.dtype != np.bool_:
        mask = None  # an additive mask leaves every score a function of x
    mask, kind, (q, *layout) = _layout(cp, y.shape, mask, causal)
    kernel = raw_kernel(SOURCE, kernel_name("engine_softmax_bwd", y.dtype))
    kernel((m,), (row_threads(d),), (g, y, y if mask is None else mask, dx, i32(m), i32(d), q, f64(scale),
                                     i32(kind == MASK_BOOL), i32(causal), *layout))
    return _into(out, dx)


# ------------------------------------------------------------------ dispatch
def softmax_forward(x, mask=None, scale=1.0, fill=-10000.0, causal=False, out=None):
    """softmax over the last dim of the scaled, masked scores x (non-empty; see the module doc),
    written into `out` when given (which may be x). The CUDA kernel for CuPy arrays, the
    reference otherwise."""
    if isinstance(x, np.ndarray):
        return _into(out, forward_reference(x, mask, scale, fill, causal))
    return forward_cuda(x, mask, scale, fill, causal, out)


def softmax_backward(g, y, mask=None, scale=1.0, causal=False, out=None):
    """The gradient of softmax_forward's input from its output y and output gradient g, written
    into `out` when given (which may be g)."""
    if isinstance(y, np.ndarray):
        return _into(out, backward_reference(g, y, mask, scale, causal))
    return backward_cuda(g, y, mask, scale, causal, out)
