"""out[key] += values with repeated indices (numpy's `np.add.at`), and out[key] = values, in one
fixed order on CUDA.

CuPy's `add.at` adds with atomics, so a float target hit by several values gets them in the
order the threads happen to run: the last bits of the sum vary from run to run. Under
`engine.use_deterministic_algorithms(True)` (engine/backend/deterministic.py) floating
scatter-adds on CUDA take this path instead:

  1. the target of every value: a row index along axis 0 when `key` is one integer array (the
     embedding gradient, index_add along dim 0), else each element's flat position in `out`;
  2. a stable sort of the targets (cupy.argsort), so that each target's values keep their order;
  3. one kernel, a thread per (run of equal targets, column), adding the run into `out` in that
     order, each addition rounded to the element type, exactly as numpy's add.at does; for a
     store, the thread of each run's last value writes it (the last write wins, as in numpy).
     Weighted bincount goes through the adds (float64, numpy's sums).

So the result has the bits of numpy's `add.at` on the same values (cast to out's dtype first:
every caller passes them so), every run; a store keeps the last value of each target in the C
order of the index (numpy's order for C-ordered indices and values). Indices out of range wrap
(per-axis index arrays, as CuPy's ravel_multi_index) or are skipped (rows): the ops check their
indices first (on CUDA in debug mode). It costs the sort, and CuPy sorts with Thrust, whose sort
ends with a stream synchronisation (CuPy issue #9126): a host wait per scatter-add, and no
deterministic scatter-add inside a CUDA graph capture (refused by name). A general key also
costs an int64 array of target positions: the size of `values` for per-axis index arrays, of
`out` for keys with slices or a boolean mask.
"""
import numpy as np

from .. import backend
from ..backend import deterministic
from ._cuda import COMMON, THREADS, blocks, i64, instantiate, kernel_name, raw_kernel

SOURCE = COMMON + r"""
// For each (sorted value k, column c) that speaks for its run of equal targets (the run's first
// value with `first`, else its last) and whose target t is inside out's `rows`: body(k, c, t)
template <typename Body>
__device__ void for_runs(const long long* target, long long n, long long cols, long long rows, bool first,
                         Body body) {
  const long long total = n * cols;
  for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x; e < total;
       e += (long long)gridDim.x * blockDim.x) {
    const long long k = e / cols, c = e % cols, t = target[k];
    const bool speaks = first ? (k == 0 || target[k - 1] != t) : (k + 1 == n || target[k + 1] != t);
    if (speaks && t >= 0 && t < rows) body(k, c, t);
  }
}

// out[t, c] += vals[order[j], c] for the sorted values j of each run, in j order (the first value's
// thread adds the whole run), each addition rounded to T as numpy's add.at rounds it
template <typename T>
__device__ void segment_add(const long long* target, const long long* order, const T* vals, T* out, long long n,
                            long long cols, long long rows) {
  for_runs(target, n, cols, rows, true, [&](long long k, long long c, long long t) {
    T acc = out[t * cols + c];
    for (long long j = k; j < n && target[j] == t; ++j) acc = from_acc<T>(to_acc(acc) + to_acc(vals[order[j] * cols + c]));
    out[t * cols + c] = acc;
  });
}

// out[t, c] = vals[order[k], c] for the last value k of each run: the last of a target's values
// wins, as numpy's assignment leaves it. W: an unsigned word of the element's size (any dtype
// moves as its bytes)
template <typename W>
__device__ void segment_store(const long long* target, const long long* order, const W* vals, W* out, long long n,
                              long long cols, long long rows) {
  for_runs(target, n, cols, rows, false,
           [&](long long k, long long c, long long t) { out[t * cols + c] = vals[order[k] * cols + c]; });
}
""" + instantiate(
    "engine_segment_add",
    "const long long* target, const long long* order, const {T}* vals, {T}* out, long long n, long long cols, "
    "long long rows",
    "segment_add<{T}>(target, order, vals, out, n, cols, rows)",
) + "\n" + "\n".join(
    f'extern "C" __global__ void engine_segment_store__u{8 * size}(const long long* target, const long long* order, '
    f'const {word}* vals, {word}* out, long long n, long long cols, long long rows) '
    f'{{ segment_store<{word}>(target, order, vals, out, n, cols, rows); }}'
    for size, word in ((1, "unsigned char"), (2, "unsigned short"), (4, "unsigned int"), (8, "unsigned long long")))

_WORDS = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def flat_targets(xp, out, mesh, values):
    """(the flat position in `out` of each element of `values` that the index arrays `mesh`
    (one per axis of out) scatter, values flattened)."""
    # mode "wrap": negative indices count from the end (CuPy's default; numpy's is "raise")
    lin = xp.ravel_multi_index(tuple(xp.broadcast_to(m, values.shape) for m in mesh), out.shape,
                               mode="wrap").reshape(-1)
    return lin, values.reshape(-1)


def _fit(xp, values, shape):
    """`values` broadcast to `shape` as an assignment broadcasts them: leading unit dims beyond
    the target's rank dropped first (numpy's and torch's x[idx] = v accept them)."""
    while values.ndim > len(shape) and values.shape[0] == 1:
        values = values[0]
    return xp.broadcast_to(values, shape)


def _targets(xp, out, key, values):
    """(targets [n], values [n, cols], out viewed [rows, cols]) of out[key] += values."""
    if isinstance(key, xp.ndarray) and key.ndim == 1 and key.dtype.kind in "iu":  # rows along axis 0
        rows = out.shape[0]
        target = key.astype(np.int64)
        target = xp.where(target < 0, target + rows, target)
        cols = out.size // rows if rows else 0
        vals = _fit(xp, values, (key.size,) + out.shape[1:]).reshape(key.size, cols)
        return target, vals, out.reshape(rows, cols)
    if (isinstance(key, tuple) and len(key) == out.ndim
            and all(isinstance(m, xp.ndarray) and m.dtype.kind in "iu" for m in key)):
        shape = xp.broadcast_shapes(*(m.shape for m in key))
        lin, vals = flat_targets(xp, out, key, _fit(xp, values, shape))
    else:  # slices, a boolean mask, fewer arrays than axes: the positions of an arange
        positions = xp.arange(out.size, dtype=np.int64).reshape(out.shape)[key]
        lin, vals = positions.reshape(-1), _fit(xp, values, positions.shape).reshape(-1)
    return lin, vals.reshape(-1, 1), out.reshape(-1, 1)


def _refuse_in_capture(what):
    if backend.capture_state() is not None:
        raise RuntimeError(f"a deterministic {what} (engine.use_deterministic_algorithms(True)) cannot be captured "
                           "in a CUDA graph: CuPy's sort synchronises the stream. Turn one of them off")


def _sorted_runs(out, key, values, kernel_base, word=None):
    """Launch `kernel_base` over out[key] <- values in runs of equal sorted targets (stable)."""
    cp = backend.cupy()
    work = out if out.flags.c_contiguous else cp.ascontiguousarray(out)
    target, vals, out2 = _targets(cp, work, key, cp.asarray(values, dtype=out.dtype))
    n, cols = vals.shape
    if n and cols:
        order = cp.argsort(target)  # stable: each target's values keep their order
        sorted_target = target[order]
        # values read from the memory being written (x[idx] = x) are copied first, as numpy does
        vals = vals.copy() if cp.may_share_memory(vals, work) else cp.ascontiguousarray(vals)
        if word is None:
            name = kernel_name(kernel_base, out.dtype)
        else:  # any dtype, moved as words of its size
            name, vals, out2 = f"{kernel_base}__u{8 * word().itemsize}", vals.view(word), out2.view(word)
        raw_kernel(SOURCE, name)((blocks(n * cols),), (THREADS,), (sorted_target, order, vals, out2, i64(n),
                                                                   i64(cols), i64(out2.shape[0])))
    if work is not out:
        out[...] = work


def add_at_cuda(out, key, values):
    """np.add.at(out, key, values) on CuPy arrays (out floating): sorted runs, one kernel."""
    _refuse_in_capture("scatter-add")
    _sorted_runs(out, key, values, "engine_segment_add")


def store_at_cuda(out, key, values):
    """out[key] = values on CuPy arrays, the last value of a repeated target winning: sorted runs."""
    _refuse_in_capture("indexed store")
    _sorted_runs(out, key, values, "engine_segment_store", _WORDS[out.dtype.itemsize])


def add_at(out, key, values):
    """np.add.at(out, key, values) for numpy and CuPy arrays: CuPy's atomic add.at, or under
    engine.use_deterministic_algorithms(True) for floating `out` the sorted runs above."""
    xp = backend.xp_of(out)
    if xp is np or out.dtype.kind != "f" or not deterministic.are_deterministic_algorithms_enabled():
        xp.add.at(out, key, values)
        return
    add_at_cuda(out, key, values)


def _may_repeat(xp, key):
    """Whether `key` holds an integer index array (a target may be written twice); slices, ints,
    None, Ellipsis and boolean masks name each element once."""
    keys = key if isinstance(key, tuple) else (key,)
    return any(isinstance(k, xp.ndarray) and k.dtype.kind in "iu" and k.size > 1 for k in keys)


def store_at(out, key, values):
    """out[key] = values for numpy and CuPy arrays. With repeated targets CuPy keeps whichever
    write lands last; under engine.use_deterministic_algorithms(True) the last value of each
    target wins, as numpy's assignment leaves it (the sorted runs above)."""
    xp = backend.xp_of(out)
    if (xp is np or not _may_repeat(xp, key) or not deterministic.are_deterministic_algorithms_enabled()
            or out.dtype.itemsize not in _WORDS):  # complex128: CuPy's order
        out[key] = values
        return
    store_at_cuda(out, key, values)


def bincount(x, weights=None, minlength=0, size=None):
    """xp.bincount(x, weights, minlength); with weights on CUDA under deterministic mode, the
    float64 sums of numpy's bincount through the sorted runs (`size`: the bin count when the
    caller knows it, which saves reading x's maximum back)."""
    xp = backend.xp_of(x)
    if xp is np or weights is None or not deterministic.are_deterministic_algorithms_enabled():
        return xp.bincount(x, weights=weights, minlength=minlength)
    if size is None:  # two host reads, as cupy.bincount makes them
        if x.size and int(x.min()) < 0:
            raise ValueError("The first argument of bincount must be non-negative")
        size = max(int(minlength), int(x.max()) + 1 if x.size else 0)
    out = xp.zeros(size, np.result_type(weights.dtype, np.float64))
    add_at_cuda(out, x.reshape(-1), weights.reshape(-1))
    return out
