"""Multi-tensor Adam / AdamW: one launch updates every parameter of a group (of one dtype).

`adam_update(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, hyper, half_copies=None)`
updates lists of arrays in place with torch's formulas (engine/optim/adam.py has them); where
`half_copies` gives a float16 array for a parameter, the updated parameter is also written there
in float16 (autocast's copy of that parameter, engine/ops/cast_cache.py: written in the same pass,
the forward that follows casts no weight). `adam_update_numpy` is the
reference: the same operations in the same order as the kernel, each rounded to the compute type
(the parameter's own type; float32 for float16 parameters, whose values are stored back in
float16). For float32 and float64 this is bit for bit the engine's CPU update (`Adam._update`).

The CUDA version (`adam_update_cuda`) reads a cached table of pointers (see _multi_tensor.py), so a
step is one launch per dtype whatever the number of parameters; the GPU contracts a*b+c into fused
multiply-adds, so its results differ from the reference in the last bits.
"""
import functools
from collections import namedtuple
from string import Template

import numpy as np

from ..backend import xp_of
from . import _cuda, _multi_tensor as mt

__all__ = ["AdamHyper", "adam_update", "adam_update_numpy", "adam_update_cuda", "compute_dtype", "constants"]

AdamHyper = namedtuple("AdamHyper", "lr beta1 beta2 eps weight_decay step decoupled bias_correction maximize")

# flags of the kernel (one int)
DECOUPLED, HAS_WD, LERP_SMALL, MAXIMIZE, AMSGRAD = 1, 2, 4, 8, 16
# param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq (0 without amsgrad), float16 copy (0: none)
COLUMNS = 6
HALF_COPY = 5


def compute_dtype(dtype):
    """The type the update computes in: float32 for float16 parameters, else their own."""
    return np.dtype(np.float32) if np.dtype(dtype) == np.float16 else np.dtype(dtype)


def constants(hyper, dtype, amsgrad):
    """(8 scalars of the compute type, flags): what the kernel takes, derived on the host in
    double precision as torch derives them (Python floats), then rounded once."""
    f = compute_dtype(dtype).type
    lerp = 1.0 - hyper.beta1
    small = abs(lerp) < 0.5
    if hyper.bias_correction:
        bc1, bc2_sqrt = 1.0 - hyper.beta1 ** hyper.step, (1.0 - hyper.beta2 ** hyper.step) ** 0.5
    else:
        bc1, bc2_sqrt = 1.0, 1.0
    wd = hyper.weight_decay
    scalars = (f(1.0 - hyper.lr * wd), f(wd), f(lerp if small else 1.0 - lerp), f(hyper.beta2),
               f(1.0 - hyper.beta2), f(bc2_sqrt), f(hyper.eps), f(-(hyper.lr / bc1)))
    flags = (DECOUPLED * bool(hyper.decoupled) | HAS_WD * (wd != 0) | LERP_SMALL * small
             | MAXIMIZE * bool(hyper.maximize) | AMSGRAD * bool(amsgrad))
    return scalars, np.int32(flags)


def adam_arrays(w, g, m, v, vmax, scalars, flags, half_copy=None):
    """The kernel's arithmetic on flat arrays of one tensor, in place (vmax is None without
    amsgrad; half_copy, when given, receives the new w in float16); the numpy reference and the
    kernel's emulator both run this."""
    decay, wd, lerp_w, beta2, one_minus_beta2, bc2_sqrt, eps, neg_step = scalars
    a = compute_dtype(w.dtype)
    wi, gi = w.astype(a), g.astype(a)
    if flags & MAXIMIZE:
        gi = -gi
    if flags & HAS_WD:
        if flags & DECOUPLED:
            wi = wi * decay
        else:
            gi = wi * wd + gi
    mi = m.astype(a)
    d = gi - mi
    mi = mi + d * lerp_w if flags & LERP_SMALL else gi - d * lerp_w
    t = gi * one_minus_beta2
    t = t * gi
    vi = v.astype(a) * beta2 + t
    vd = vi
    if flags & AMSGRAD:
        vd = np.maximum(vmax.astype(a), vi)
        vmax[...] = vd
    den = np.sqrt(vd) / bc2_sqrt + eps
    w[...] = wi + (mi / den) * neg_step
    m[...] = mi
    v[...] = vi
    if half_copy is not None:
        half_copy[...] = w  # the stored value, rounded once to float16 (the kernel's cvt.rn)


def adam_update_numpy(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, hyper, half_copies=None, skip=None):
    """Reference: update each parameter (lists of same-dtype arrays; max_exp_avg_sqs is None
    without amsgrad, half_copies None or a list of float16 arrays and Nones) in place. `skip`, a
    0-d float32 flag, nonzero: nothing is updated, the float16 copies are written from the
    parameters as they are."""
    if not params:
        return
    if skip is not None and float(skip) != 0.0:
        for w, half in zip(params, half_copies or ()):
            if half is not None:
                half[...] = w
        return
    scalars, flags = constants(hyper, params[0].dtype, max_exp_avg_sqs is not None)
    with np.errstate(all="ignore"):
        for i, (w, g, m, v) in enumerate(zip(params, grads, exp_avgs, exp_avg_sqs)):
            vmax = None if max_exp_avg_sqs is None else max_exp_avg_sqs[i]
            adam_arrays(w, g, m, v, vmax, scalars, flags, None if half_copies is None else half_copies[i])


_SOURCE = r"""
${half}
typedef ${T} scalar_t;
typedef ${A} acc_t;
__device__ __forceinline__ acc_t load(const scalar_t* p, long long i) { return ${load}; }
__device__ __forceinline__ scalar_t to_scalar(acc_t x) { return ${store}; }
__device__ __forceinline__ unsigned short to_half(scalar_t x) { return ${half_of}; }  // rounded once
${lookup}
extern "C" __global__ void ${name}(const long long* __restrict__ table, const int n_tensors,
        const long long n_chunks, const int chunk, const acc_t decay, const acc_t wd, const acc_t lerp_w,
        const acc_t beta2, const acc_t one_minus_beta2, const acc_t bc2_sqrt, const acc_t eps,
        const acc_t neg_step, const int flags, const float* __restrict__ skip) {
    const MtTable tab = {table, n_tensors};
    // flags: the bits DECOUPLED, HAS_WD, LERP_SMALL, MAXIMIZE, AMSGRAD of engine/kernels/adamw.py
    const bool maximize = flags & 8, has_wd = flags & 2, decoupled = flags & 1, lerp_small = flags & 4;
    const bool amsgrad = flags & 16;
    // the GradScaler's inf/nan flag of this step, on the device: nonzero skips the update
    const bool skipped = skip[0] != 0.0f;
    for (long long c = blockIdx.x; c < n_chunks; c += gridDim.x) {
        long long begin, end;
        const int t = tab.chunk_range(c, ${columns}, chunk, &begin, &end);
        scalar_t* p = reinterpret_cast<scalar_t*>(tab.ptr(0, t));
        const scalar_t* gr = reinterpret_cast<const scalar_t*>(tab.ptr(1, t));
        scalar_t* m_ = reinterpret_cast<scalar_t*>(tab.ptr(2, t));
        scalar_t* v_ = reinterpret_cast<scalar_t*>(tab.ptr(3, t));
        scalar_t* vmax = reinterpret_cast<scalar_t*>(tab.ptr(4, t));
        unsigned short* half_copy = reinterpret_cast<unsigned short*>(tab.ptr(${half_copy}, t));  // null: none
        if (skipped) {  // the parameter stays; its float16 copy is still written from it (the host marks it current)
            if (half_copy) for (long long i = begin + threadIdx.x; i < end; i += blockDim.x) half_copy[i] = to_half(p[i]);
            continue;
        }
        for (long long i = begin + threadIdx.x; i < end; i += blockDim.x) {
            acc_t w = load(p, i);
            acc_t g = load(gr, i);
            if (maximize) g = -g;
            if (has_wd) {
                if (decoupled) w = w * decay; else g = w * wd + g;
            }
            acc_t m = load(m_, i);
            const acc_t d = g - m;
            m = lerp_small ? m + d * lerp_w : g - d * lerp_w;
            acc_t sq = g * one_minus_beta2;
            sq = sq * g;
            const acc_t v = load(v_, i) * beta2 + sq;
            acc_t vd = v;
            if (amsgrad) {
                const acc_t old = load(vmax, i);
                vd = (old != old || v != v) ? old + v : (old > v ? old : v);  // NaN propagates, as np.maximum
                vmax[i] = to_scalar(vd);
            }
            const acc_t den = ${sqrt}(vd) / bc2_sqrt + eps;
            const scalar_t w_new = to_scalar(w + (m / den) * neg_step);
            p[i] = w_new;
            if (half_copy) half_copy[i] = to_half(w_new);
            m_[i] = to_scalar(m);
            v_[i] = to_scalar(v);
        }
    }
}
"""

_TYPES = {  # numpy dtype -> (name suffix, storage type, compute type, load, store, sqrt, stored -> float16)
    "float32": ("float", "float", "float", "p[i]", "x", "sqrtf", "float_to_half(x)"),
    "float64": ("double", "double", "double", "p[i]", "x", "sqrt", "float_to_half(x)"),
    "float16": ("half", "unsigned short", "float", "half_to_float(p[i])", "float_to_half(x)", "sqrtf", "x"),
}


def kernel_name(dtype):
    _cuda.c_type(dtype)  # the clear error for other dtypes
    return "engine_adamw__" + _TYPES[np.dtype(dtype).name][0]


@functools.lru_cache(maxsize=None)  # one string object per source (see _cuda.raw_kernel)
def kernel_source(dtype):
    suffix, storage, acc, load, store, sqrt, half_of = _TYPES[np.dtype(dtype).name]
    return Template(_SOURCE).substitute(half=mt.HALF, T=storage, A=acc, load=load, store=store, sqrt=sqrt,
                                        half_of=half_of, columns=COLUMNS, half_copy=HALF_COPY,
                                        lookup=mt.MT_LOOKUP, name=kernel_name(dtype))


def adam_update_cuda(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, hyper, half_copies=None, skip=None):
    """One launch for the whole list (same dtype, C-contiguous CuPy arrays of matching sizes;
    `half_copies`: None or a list of float16 arrays of the parameters' sizes and Nones; `skip`:
    None or a 0-d float32 flag on the device, read by the kernel)."""
    keep = [i for i, w in enumerate(params) if w.size]
    if not keep:
        return
    dtype = params[keep[0]].dtype
    if skip is None:
        skip = _never_skip(params[keep[0]])
    elif skip.dtype != np.float32 or skip.size != 1:
        raise ValueError(f"adam_update: skip must be one float32 flag, got {skip.size} x {skip.dtype}")
    cols = [[lst[i] for i in keep] for lst in (params, grads, exp_avgs, exp_avg_sqs)]
    for extra in (max_exp_avg_sqs, half_copies):
        cols.append([None] * len(keep) if extra is None else [extra[i] for i in keep])
    for a, w in zip(cols[HALF_COPY], cols[0]):
        if a is not None and (a.dtype != np.float16 or a.size != w.size):
            raise ValueError(f"adam_update: a float16 copy must match its parameter's {w.size} elements, "
                             f"got {a.size} x {a.dtype}")
    tab, n_chunks = mt.table(cols, [params[i].size for i in keep])
    scalars, flags = constants(hyper, dtype, max_exp_avg_sqs is not None)
    kernel = _cuda.raw_kernel(kernel_source(dtype), kernel_name(dtype))
    kernel((mt.grid_for(n_chunks),), (_cuda.THREADS,),
           (tab, _cuda.i32(len(keep)), _cuda.i64(n_chunks), _cuda.i32(mt.CHUNK)) + scalars + (flags, skip))


_never = {}  # (array module, device id) -> a 0-d float32 zero: the flag of steps taken unconditionally


def _never_skip(like):
    xp = xp_of(like)
    key = (id(xp), like.device.id)  # the array module too: tests swap real CuPy and its double
    flag = _never.get(key)
    if flag is None:
        flag = _never[key] = xp.zeros((), dtype=np.float32)
    return flag


def adam_update(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, hyper, half_copies=None, skip=None):
    """Update lists of same-dtype arrays in place: the CUDA kernel for CuPy arrays, else numpy."""
    if params and xp_of(params[0]) is not np:
        adam_update_cuda(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, hyper, half_copies, skip)
    else:
        adam_update_numpy(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, hyper, half_copies, skip)
