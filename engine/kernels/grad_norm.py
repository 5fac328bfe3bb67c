"""Multi-tensor gradient norm and clip scaling: a norm over every gradient in two launches and
the clip in one, with nothing read back to the host.

    grad_norm(arrays, norm_type, acc, root=True)   -> 0-d array of dtype `acc`
        the norm_type-norm of all the arrays' elements together (2: sqrt of the sum of squares,
        inf: max |x|, any other finite p != 0: (sum |x|^p)^(1/p)), accumulated in `acc`;
        root=False leaves the sum of powers (or the max) for a caller that still has to add the
        shards of other ranks.
    scale_grads(arrays, total, max_norm)            -> None
        each array *= min(max_norm / (total + 1e-6), 1), the coefficient computed from the 0-d
        array `total` in its own dtype (torch's clip_grads_with_norm_), the product in the wider
        of the two dtypes.
    unscale_grads(arrays, scale, found)             -> None
        each array *= 1 / scale, the 0-d scale read on the device, and the 0-d flag `found` set
        to 1 where a result is not finite: the GradScaler's unscale and check, no host read.

On CUDA, `engine_grad_norm_partial` walks the chunks of a multi-tensor table (see _multi_tensor.py)
and leaves one partial per block; `engine_grad_norm_finish` adds the partials in a fixed order in
one block (so the norm is deterministic) and takes the root; `engine_grad_scale` reads the norm
from device memory; `engine_grad_unscale` multiplies by the reciprocal of a scale in device
memory, raising a flag in device memory on inf/nan. The numpy versions are the references.
"""
import functools
from string import Template

import numpy as np

from ..backend import xp_of
from . import _cuda, _multi_tensor as mt

__all__ = ["grad_norm", "grad_norm_numpy", "grad_norm_cuda", "scale_grads", "scale_grads_numpy", "scale_grads_cuda",
           "unscale_grads", "unscale_grads_numpy", "unscale_grads_cuda", "unscale_kernel", "unscale_factor",
           "norm_mode", "supported_norm", "finish_norm", "combine", "chunk_partials"]

SUM_SQUARES, MAX_ABS, SUM_POW = 0, 1, 2
PARTIAL_BLOCKS = 1024   # at most this many partials (one per block of the partial kernel)
FINISH_THREADS = 256


def supported_norm(norm_type):
    """Norm types the kernels compute: inf and p > 0 (0, -inf and negative p keep the generic
    path, whose norm of per-tensor norms counts an empty tensor as a norm of 0)."""
    return norm_type == np.inf or (np.isfinite(norm_type) and norm_type > 0)


def norm_mode(norm_type):
    return SUM_SQUARES if norm_type == 2 else MAX_ABS if norm_type == np.inf else SUM_POW


def _powers(a, mode, p):
    """What the kernel accumulates for each element of `a` (already in the accumulation type)."""
    if mode == SUM_SQUARES:
        return a * a
    if mode == MAX_ABS or p == 1:
        return np.abs(a)
    return np.abs(a) ** a.dtype.type(p)


def combine(values, mode, acc):
    """Sum, or NaN-propagating max, of a 1-D array (the empty combination is 0)."""
    if values.size == 0:
        return acc.type(0)
    return values.max() if mode == MAX_ABS else values.sum(dtype=acc)


def finish_norm(xp, raw, mode, p):
    """The norm from `raw`, a 0-d array holding a sum of powers (or the max |x|) in `mode`."""
    if mode == SUM_SQUARES:
        return xp.sqrt(raw)
    if mode == MAX_ABS or p == 1:
        return raw
    return raw ** (raw.dtype.type(1) / raw.dtype.type(p))


def grad_norm_numpy(arrays, norm_type, acc, root=True):
    acc = np.dtype(acc)
    mode = norm_mode(norm_type)
    with np.errstate(all="ignore"):
        parts = np.array([combine(_powers(a.reshape(-1).astype(acc), mode, norm_type), mode, acc) for a in arrays],
                         dtype=acc)
        raw = np.asarray(combine(parts, mode, acc), dtype=acc)
        return finish_norm(np, raw, mode, norm_type) if root else raw


def chunk_partials(flats, grid, mode, p, acc):
    """The partial of each of `grid` blocks of the partial kernel over the tensors `flats`: block b
    combines the chunks b, b + grid, ... of the tensors' chunks in order (the emulator's model of
    the kernel)."""
    acc = np.dtype(acc)
    chunks = [(f, s) for f in flats for s in range(0, f.size, mt.CHUNK)]
    out = np.empty(grid, dtype=acc)
    with np.errstate(all="ignore"):
        for b in range(grid):
            vals = [combine(_powers(f[s: s + mt.CHUNK].astype(acc), mode, p), mode, acc) for f, s in chunks[b::grid]]
            out[b] = combine(np.array(vals, dtype=acc), mode, acc)
    return out


def _scale_each(xp, arrays, total, max_norm):
    """Each of `arrays` times min(max_norm / (total + 1e-6), 1), in place through its strides
    (nothing computed for no arrays: on CUDA the coefficient costs launches)."""
    if not arrays:
        return
    n = total.dtype.type
    with np.errstate(all="ignore"):
        coef = xp.minimum(n(max_norm) / (total + n(1e-6)), n(1))
        for a in arrays:
            xp.multiply(a, coef, out=a, casting="unsafe")


def scale_grads_numpy(arrays, total, max_norm):
    _scale_each(np, arrays, total, max_norm)


# ------------------------------------------------------------------ CUDA
_TYPES = {  # numpy dtype -> (name suffix, storage type, load)
    "float32": ("float", "float", "p[i]"),
    "float64": ("double", "double", "p[i]"),
    "float16": ("half", "unsigned short", "half_to_float(p[i])"),
}
_ACC = {"float32": ("float", "sqrtf", "powf", "fabsf"), "float64": ("double", "sqrt", "pow", "fabs")}

_COMMON = r"""
${half}
typedef ${T} scalar_t;
typedef ${A} acc_t;
__device__ __forceinline__ acc_t load(const scalar_t* p, long long i) { return (acc_t)(${load}); }
__device__ __forceinline__ acc_t combine(acc_t a, acc_t b, int mode) {
    if (mode == 1) return (b != b || b > a) ? b : a;  // max that keeps a NaN, as numpy's
    return a + b;
}
// the block's combination of `v`, valid in thread 0; blockDim.x is a multiple of 32
__device__ acc_t block_reduce(acc_t v, int mode) {
    __shared__ acc_t warp_vals[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int o = 16; o > 0; o >>= 1) v = combine(v, __shfl_down_sync(0xffffffffu, v, o), mode);
    __syncthreads();  // warp_vals may still be read by an earlier call
    if (lane == 0) warp_vals[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = threadIdx.x < (blockDim.x >> 5) ? warp_vals[lane] : (acc_t)0;
        for (int o = 16; o > 0; o >>= 1) v = combine(v, __shfl_down_sync(0xffffffffu, v, o), mode);
    }
    return v;
}
"""

_PARTIAL = _COMMON + r"""
${lookup}
extern "C" __global__ void ${name}(const long long* __restrict__ table, const int n_tensors,
        const long long n_chunks, const int chunk, acc_t* __restrict__ partials, const int mode, const acc_t p) {
    const MtTable tab = {table, n_tensors};
    acc_t v = 0;
    for (long long c = blockIdx.x; c < n_chunks; c += gridDim.x) {
        long long begin, end;
        const int t = tab.chunk_range(c, 1, chunk, &begin, &end);
        const scalar_t* x = reinterpret_cast<const scalar_t*>(tab.ptr(0, t));
        for (long long i = begin + threadIdx.x; i < end; i += blockDim.x) {
            const acc_t a = load(x, i);
            const acc_t e = mode == 0 ? a * a : (mode == 1 || p == (acc_t)1) ? ${fabs}(a) : ${pow}(${fabs}(a), p);
            v = combine(v, e, mode);
        }
    }
    v = block_reduce(v, mode);
    if (threadIdx.x == 0) partials[blockIdx.x] = v;
}
"""

_FINISH = _COMMON + r"""
extern "C" __global__ void ${name}(const acc_t* __restrict__ partials, const int count, acc_t* __restrict__ out,
        const int mode, const acc_t p, const int root) {
    acc_t v = 0;
    for (int i = threadIdx.x; i < count; i += blockDim.x) v = combine(v, partials[i], mode);
    v = block_reduce(v, mode);
    if (threadIdx.x == 0) {
        if (root && mode == 0) v = ${sqrt}(v);
        else if (root && mode == 2 && p != (acc_t)1) v = ${pow}(v, (acc_t)1 / p);
        out[0] = v;
    }
}
"""

# every element of the tensors times a coefficient, in place: the clip's (from the norm on the
# device) or the GradScaler's 1 / scale (with its inf/nan check after each store)
_SCALE = r"""
${half}
typedef ${T} scalar_t;
typedef ${N} norm_t;
typedef ${C} compute_t;
${lookup}
__device__ __forceinline__ compute_t load(const scalar_t* p, long long i) { return (compute_t)(${load}); }
__device__ __forceinline__ scalar_t to_scalar(compute_t x) { return ${store}; }
__device__ __forceinline__ compute_t widen(scalar_t s) { return (compute_t)(${widen}); }
extern "C" __global__ void ${name}(const long long* __restrict__ table, const int n_tensors,
        const long long n_chunks, const int chunk, ${coef_params}) {
    const MtTable tab = {table, n_tensors};
    ${coef}
    for (long long k = blockIdx.x; k < n_chunks; k += gridDim.x) {
        long long begin, end;
        const int t = tab.chunk_range(k, 1, chunk, &begin, &end);
        scalar_t* g = reinterpret_cast<scalar_t*>(tab.ptr(0, t));
        for (long long i = begin + threadIdx.x; i < end; i += blockDim.x) {
            const scalar_t s = to_scalar(load(g, i) * coef);
            g[i] = s;
            ${after}
        }
    }
}
"""


def _suffix(dtype):
    _cuda.c_type(dtype)  # the clear error for other dtypes
    return _TYPES[np.dtype(dtype).name][0]


@functools.lru_cache(maxsize=None)  # one string object per source (see _cuda.raw_kernel)
def partial_kernel(dtype, acc):
    suffix, storage, load = _TYPES[np.dtype(dtype).name]
    a, sqrt, pow_, fabs = _ACC[np.dtype(acc).name]
    name = f"engine_grad_norm_partial__{_suffix(dtype)}_{_suffix(acc)}"
    src = Template(_PARTIAL).substitute(half=mt.HALF, T=storage, A=a, load=load, lookup=mt.MT_LOOKUP, name=name,
                                        sqrt=sqrt, pow=pow_, fabs=fabs)
    return src, name


@functools.lru_cache(maxsize=None)  # one string object per source (see _cuda.raw_kernel)
def finish_kernel(acc):
    a, sqrt, pow_, fabs = _ACC[np.dtype(acc).name]
    name = f"engine_grad_norm_finish__{_suffix(acc)}"
    src = Template(_FINISH).substitute(half="", T=a, A=a, load="p[i]", name=name, sqrt=sqrt, pow=pow_, fabs=fabs)
    return src, name


# (kernel parameters, the coefficient's computation, what follows each store)
_CLIP_COEF = ("const norm_t* __restrict__ total, const norm_t max_norm", """norm_t c = max_norm / (total[0] + (norm_t)1e-6);
    c = c > (norm_t)1 ? (norm_t)1 : c;  // a NaN coefficient stays NaN, as numpy's minimum
    const compute_t coef = (compute_t)c;""", "")
# the GradScaler's unscale: 1 / scale from the device (in double, rounded once to float32 for
# float16 and float32 tensors, as torch's inverse scale; kept double for float64), the product in
# the compute type rounded once, and the flag raised where a stored value is not finite
# (x - x is 0 only for finite x); every writer writes the same 1, so no atomics are needed
_UNSCALE_COEF = ("const float* __restrict__ scale, float* __restrict__ found",
                 "const compute_t coef = (compute_t)(1.0 / (double)scale[0]);",
                 """const compute_t b = widen(s);
            if (!(b - b == (compute_t)0)) found[0] = 1.0f;""")


@functools.lru_cache(maxsize=None)  # one string object per source (see _cuda.raw_kernel)
def _scale_source(dtype, norm_dtype, name, coef):
    _, storage, load = _TYPES[np.dtype(dtype).name]
    half = np.dtype(dtype) == np.float16
    compute = np.promote_types(np.float32 if half else dtype, norm_dtype)
    store = "float_to_half(x)" if half else "(scalar_t)x"
    params, coef_src, after = coef
    return Template(_SCALE).substitute(half=mt.HALF, T=storage, N=_ACC[np.dtype(norm_dtype).name][0],
                                       C=_ACC[compute.name][0], load=load, store=store, lookup=mt.MT_LOOKUP,
                                       widen="half_to_float(s)" if half else "s",
                                       name=name, coef_params=params, coef=coef_src, after=after)


def scale_kernel(dtype, norm_dtype):
    name = f"engine_grad_scale__{_suffix(dtype)}_{_suffix(norm_dtype)}"
    return _scale_source(dtype, norm_dtype, name, _CLIP_COEF), name


def unscale_kernel(dtype):
    """Every element times 1 / scale (read from the device), the flag `found` set to 1 where a
    result is not finite: the GradScaler's unscale and inf/nan check in one pass."""
    name = f"engine_grad_unscale__{_suffix(dtype)}"
    return _scale_source(dtype, compute_type(dtype), name, _UNSCALE_COEF), name


def compute_type(dtype):
    """The type the unscale kernel computes (and rounds 1 / scale to) for `dtype` tensors:
    float32 for float16 (torch's float32 inverse scale: a float16 one is 0 from 2^25) and float32,
    float64 for float64."""
    return np.dtype(np.float64) if np.dtype(dtype) == np.float64 else np.dtype(np.float32)


def _by_dtype(arrays):
    """{dtype: [non-empty arrays]} in first-seen order."""
    groups = {}
    for a in arrays:
        if a.size:
            groups.setdefault(a.dtype, []).append(a)
    return groups


def grad_norm_cuda(arrays, norm_type, acc, root=True):
    """The partial kernel once per gradient dtype (each filling its slice of the partials), then
    the finish kernel: two launches for gradients of one dtype (a strided gradient is read from a
    dense copy)."""
    xp = xp_of(arrays[0])
    arrays = [a if mt.dense(a) else xp.ascontiguousarray(a) for a in arrays]
    acc = np.dtype(acc)
    mode, p = np.int32(norm_mode(norm_type)), acc.type(norm_type if np.isfinite(norm_type) else 0)
    launches = []
    for dtype, group in _by_dtype(arrays).items():
        tab, n_chunks = mt.table([group], [a.size for a in group])
        launches.append((dtype, group, tab, n_chunks, min(n_chunks, PARTIAL_BLOCKS)))
    partials = xp.empty(max(1, sum(grid for *_, grid in launches)), dtype=acc)
    offset = 0
    for dtype, group, tab, n_chunks, grid in launches:
        src, name = partial_kernel(dtype, acc)
        _cuda.raw_kernel(src, name)((grid,), (_cuda.THREADS,), (tab, _cuda.i32(len(group)), _cuda.i64(n_chunks),
                                                              _cuda.i32(mt.CHUNK), partials[offset: offset + grid],
                                                              mode, p))
        offset += grid
    out = xp.empty((), dtype=acc)
    src, name = finish_kernel(acc)
    _cuda.raw_kernel(src, name)((1,), (FINISH_THREADS,), (partials, _cuda.i32(offset), out, mode, p,
                                                          _cuda.i32(bool(root))))
    return out


def scale_grads_cuda(arrays, total, max_norm):
    """One launch per gradient dtype; `total` (a 0-d float32 or float64 CuPy array) is read on
    the device. A strided gradient is scaled in place through its strides instead."""
    norm = total.dtype.type
    _scale_each(xp_of(total), [a for a in arrays if a.size and not mt.dense(a)], total, max_norm)
    arrays = [a for a in arrays if mt.dense(a)]
    for dtype, group in _by_dtype(arrays).items():
        tab, n_chunks = mt.table([group], [a.size for a in group])
        src, name = scale_kernel(dtype, total.dtype)
        _cuda.raw_kernel(src, name)((mt.grid_for(n_chunks),), (_cuda.THREADS,),
                                    (tab, _cuda.i32(len(group)), _cuda.i64(n_chunks), _cuda.i32(mt.CHUNK), total,
                                     norm(max_norm)))


def unscale_factor(scale, dtype):
    """The factor the unscale multiplies `dtype` gradients by, in the type it multiplies in: 1 /
    scale in double (inf for a scale of 0), rounded to float32 for float16 and float32 gradients
    (as torch's inverse scale: a float16 factor would flush 2^-25 and below to 0)."""
    with np.errstate(divide="ignore"):
        inv = np.float64(1.0) / np.float64(scale)
    return compute_type(dtype).type(inv)


def unscale_grads_numpy(arrays, scale, found):
    """Each array times 1 / scale (unscale_factor: the product in float32 for float16 arrays,
    rounded once) in place; `found` (a 0-d float32 array) is set to 1 when a result is not
    finite, and never cleared."""
    with np.errstate(all="ignore"):
        for a in arrays:
            f = unscale_factor(scale, a.dtype)
            a[...] = (a.astype(f.dtype) * f).astype(a.dtype) if a.dtype == np.float16 else a * f
            if a.size and not np.isfinite(a).all():
                found[...] = 1


def unscale_grads_cuda(arrays, scale, found):
    """unscale_grads_numpy on the device, nothing read back: one launch per dtype (strided
    arrays through CuPy, their check by a device max into `found`)."""
    xp = xp_of(scale)
    for a in arrays:
        if a.size and not mt.dense(a):
            f = (1.0 / scale.astype(np.float64)).astype(compute_type(a.dtype))
            xp.multiply(a.astype(f.dtype) if a.dtype == np.float16 else a, f, out=a, casting="unsafe")
            xp.maximum(found, (~xp.isfinite(a).all()).astype(np.float32), out=found)
    dense = [a for a in arrays if a.size and mt.dense(a)]
    for dtype, group in _by_dtype(dense).items():
        tab, n_chunks = mt.table([group], [a.size for a in group])
        src, name = unscale_kernel(dtype)
        _cuda.raw_kernel(src, name)((mt.grid_for(n_chunks),), (_cuda.THREADS,),
                                    (tab, _cuda.i32(len(group)), _cuda.i64(n_chunks), _cuda.i32(mt.CHUNK), scale,
                                     found))


def unscale_grads(arrays, scale, found):
    """The GradScaler's unscale of `arrays` by the 0-d float32 `scale`, raising the 0-d float32
    flag `found` on inf/nan: on CUDA one launch per dtype and no host read."""
    if arrays and xp_of(arrays[0]) is not np:
        unscale_grads_cuda(arrays, scale, found)
    else:
        unscale_grads_numpy(arrays, scale, found)


def grad_norm(arrays, norm_type, acc, root=True):
    """Norm of all `arrays` together (see the module doc): CUDA for CuPy arrays, else numpy."""
    if arrays and xp_of(arrays[0]) is not np:
        return grad_norm_cuda(arrays, norm_type, acc, root)
    return grad_norm_numpy(arrays, norm_type, acc, root)


def scale_grads(arrays, total, max_norm):
    if arrays and xp_of(arrays[0]) is not np:
        scale_grads_cuda(arrays, total, max_norm)
    else:
        scale_grads_numpy(arrays, total, max_norm)
