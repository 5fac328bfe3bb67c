"""out[key] += values with repeated indices (numpy's `np.add.at`), in one fixed order on CUDA.

CuPy's `add.at` adds with atomics, so a float target hit by several values gets them in the
order the threads happen to run: the last bits of the sum vary from run to run. Under
`engine.use_deterministic_algorithms(True)` (engine/backend/deterministic.py) floating
scatter-adds on CUDA take this path instead:

  1. the target of every value: a row index along axis 0 when `key` is one integer array (the
     embedding gradient, index_add along dim 0), else each element's flat position in `out`;
  2. a stable sort of the targets (cupy.argsort), so that each target's values keep their order;
  3. one kernel, a thread per (run of equal targets, column), adding the run into `out` in that
     order, each addition rounded to the element type, exactly as numpy's add.at does.

So the result has the bits of numpy's `add.at` on the same values, every run. It costs the sort
and, for a general key, an int64 array of out's positions the size of `values`.
"""
import numpy as np

from .. import backend
from ..backend import deterministic
from ._cuda import COMMON, THREADS, blocks, i64, instantiate, kernel_name, raw_kernel

SOURCE = COMMON + r"""
// out[target[k], c] += vals[order[k], c] for the sorted targets k of each run, in k order: the thread
// of a run's first k (and column c) adds the whole run; targets outside [0, rows) are skipped
template <typename T>
__device__ void segment_add(const long long* target, const long long* order, const T* vals, T* out, long long n,
                            long long cols, long long rows) {
  const long long total = n * cols;
  for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x; e < total;
       e += (long long)gridDim.x * blockDim.x) {
    const long long k = e / cols, c = e % cols, t = target[k];
    if ((k > 0 && target[k - 1] == t) || t < 0 || t >= rows) continue;
    T* o = out + t * cols + c;
    T acc = *o;
    for (long long j = k; j < n && target[j] == t; ++j) acc = from_acc<T>(to_acc(acc) + to_acc(vals[order[j] * cols + c]));
    *o = acc;
  }
}
""" + instantiate(
    "engine_segment_add",
    "const long long* target, const long long* order, const {T}* vals, {T}* out, long long n, long long cols, "
    "long long rows",
    "segment_add<{T}>(target, order, vals, out, n, cols, rows)",
)


def segment_add_reference(out2, target, values2):
    """out2 [rows, cols] += values2 [n, cols] at rows `target` [n], in place: numpy's add.at."""
    np.add.at(out2, target, values2)


def flat_targets(xp, out, mesh, values):
    """(the flat position in `out` of each element of `values` that the index arrays `mesh`
    (one per axis of out) scatter, values flattened)."""
    lin = xp.ravel_multi_index(tuple(xp.broadcast_to(m, values.shape) for m in mesh), out.shape).reshape(-1)
    return lin, values.reshape(-1)


def _targets(xp, out, key, values):
    """(targets [n], values [n, cols], out viewed [rows, cols]) of out[key] += values."""
    if isinstance(key, xp.ndarray) and key.ndim == 1 and key.dtype.kind in "iu":  # rows along axis 0
        rows = out.shape[0]
        target = key.astype(np.int64)
        target = xp.where(target < 0, target + rows, target)
        cols = out.size // rows if rows else 0
        vals = xp.broadcast_to(values, (key.size,) + out.shape[1:]).reshape(key.size, cols)
        return target, vals, out.reshape(rows, cols)
    if (isinstance(key, tuple) and len(key) == out.ndim
            and all(isinstance(m, xp.ndarray) and m.dtype.kind in "iu" for m in key)):
        shape = xp.broadcast_shapes(*(m.shape for m in key))
        lin, vals = flat_targets(xp, out, key, xp.broadcast_to(values, shape))
    else:  # slices, a boolean mask, fewer arrays than axes: the positions of an arange
        positions = xp.arange(out.size, dtype=np.int64).reshape(out.shape)[key]
        lin, vals = positions.reshape(-1), xp.broadcast_to(values, positions.shape).reshape(-1)
    return lin, vals.reshape(-1, 1), out.reshape(-1, 1)


def add_at_cuda(out, key, values):
    """np.add.at(out, key, values) on CuPy arrays (out floating): sorted runs, one kernel."""
    cp = backend.cupy()
    work = out if out.flags.c_contiguous else cp.ascontiguousarray(out)
    target, vals, out2 = _targets(cp, work, key, cp.asarray(values, dtype=out.dtype))
    n, cols = vals.shape
    if n and cols:
        order = cp.argsort(target)  # stable: each target's values keep their order
        sorted_target = target[order]
        vals = cp.ascontiguousarray(vals)
        kernel = raw_kernel(SOURCE, kernel_name("engine_segment_add", out.dtype))
        kernel((blocks(n * cols),), (THREADS,), (sorted_target, order, vals, out2, i64(n), i64(cols),
                                                 i64(out2.shape[0])))
    if work is not out:
        out[...] = work


def add_at(out, key, values):
    """np.add.at(out, key, values) for numpy and CuPy arrays: CuPy's atomic add.at, or under
    engine.use_deterministic_algorithms(True) for floating `out` the sorted runs above."""
    xp = backend.xp_of(out)
    if xp is np or out.dtype.kind != "f" or not deterministic.are_deterministic_algorithms_enabled():
        xp.add.at(out, key, values)
        return
    add_at_cuda(out, key, values)
