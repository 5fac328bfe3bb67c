"""Multi-tensor launches: one kernel over a list of tensors through a device table of pointers.

A model has hundreds of parameters; an update that launches a few kernels per parameter spends
its time launching. A multi-tensor kernel gets one int64 table per launch instead:

    [ptr of column 0 of tensor 0 .. n-1 | column 1 ... | column k-1 | sizes (n) | chunk starts (n + 1)]

Each tensor is cut into chunks of CHUNK elements; chunk starts are the running count of chunks
(tensor t owns chunks starts[t] .. starts[t + 1] - 1), so a block that takes chunk c finds its
tensor by a binary search over the starts (MT_LOOKUP below) and grid-strides over the chunks.

The table is a pure function of the pointers and sizes, so it is cached under them: a step with
the same parameter, gradient and state buffers as an earlier one copies nothing to the device.
"""
from collections import OrderedDict

import numpy as np

from .. import backend
from . import _cuda

CHUNK = 16 * _cuda.THREADS   # elements per chunk: 16 per thread of a block
MAX_BLOCKS = 4096            # enough resident blocks for any current GPU; the rest grid-strides
_CACHE_SIZE = 32
_tables = OrderedDict()

# float16 stored as its 16 bits, converted by PTX instructions: no cuda_fp16.h, whose location
# NVRTC does not know under a pip-installed CUDA. CUDA_ON_CPU: the CPU stand-in that runs kernel
# sources in the tests (tests/cuda_on_cpu), which has no PTX, converts with the same rounding.
HALF = r"""
#ifdef CUDA_ON_CPU
__device__ __forceinline__ float half_to_float(unsigned short h) { return __half2float(__ushort_as_half(h)); }
__device__ __forceinline__ unsigned short float_to_half(float f) { return __half_as_ushort(__float2half_rn(f)); }
__device__ __forceinline__ unsigned short float_to_half(double d) { return __half_as_ushort((__half)d); }
#else
__device__ __forceinline__ float half_to_float(unsigned short h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}
__device__ __forceinline__ unsigned short float_to_half(float f) {
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}
__device__ __forceinline__ unsigned short float_to_half(double d) {
    unsigned short h;
    asm("cvt.rn.f16.f64 %0, %1;" : "=h"(h) : "d"(d));
    return h;
}
#endif
"""

# CUDA source shared by the multi-tensor kernels: the table's columns and the chunk -> tensor search
MT_LOOKUP = r"""
struct MtTable {
    const long long* table;
    int n;
    __device__ __forceinline__ long long ptr(int column, int t) const { return table[(long long)column * n + t]; }
    __device__ __forceinline__ long long size(int t, int columns) const { return table[(long long)columns * n + t]; }
    __device__ __forceinline__ long long start(int t, int columns) const {
        return table[(long long)(columns + 1) * n + t];
    }
    // the tensor owning chunk c: the last t with start(t) <= c (empty tensors own no chunk)
    __device__ __forceinline__ int tensor_of(long long c, int columns) const {
        int lo = 0, hi = n - 1;
        while (lo < hi) {
            const int mid = (lo + hi + 1) >> 1;
            if (start(mid, columns) <= c) lo = mid; else hi = mid - 1;
        }
        return lo;
    }
    // chunk c's tensor, and the elements [*begin, *end) of that tensor the chunk covers
    __device__ __forceinline__ int chunk_range(long long c, int columns, long long chunk, long long* begin,
                                               long long* end) const {
        const int t = tensor_of(c, columns);
        const long long n_elements = size(t, columns);
        *begin = (c - start(t, columns)) * chunk;
        *end = *begin + chunk < n_elements ? *begin + chunk : n_elements;
        return t;
    }
};
"""


def chunks_of(sizes):
    """Chunk starts (n + 1 running counts) of tensors of `sizes` elements."""
    counts = [(s + CHUNK - 1) // CHUNK for s in sizes]
    return np.concatenate([[0], np.cumsum(counts, dtype=np.int64)]).astype(np.int64)


def dense(a):
    """Whether `a`'s elements are exactly a.size items from a.data.ptr (C or F order), as a table
    entry is walked; a slice or a broadcast view is not."""
    return a.flags.c_contiguous or a.flags.f_contiguous


def table(columns, sizes):
    """(device int64 table, number of chunks) for `columns` (k lists of n device arrays, None
    for an absent array: pointer 0) holding tensors of `sizes` elements; cached under the
    pointers and sizes. Each array must be dense (C or F order): the kernels walk `size`
    consecutive elements from its pointer."""
    for col in columns:
        for a in col:
            if a is not None and not dense(a):
                raise ValueError("multi-tensor table: arrays must be C- or F-contiguous, got strides "
                                 f"{a.strides} for shape {a.shape}")
    ptrs = tuple(0 if a is None else a.data.ptr for col in columns for a in col)
    key = (len(columns), ptrs, tuple(sizes))
    hit = _tables.get(key)
    if hit is not None:
        _tables.move_to_end(key)
        return hit
    starts = chunks_of(sizes)
    host = np.concatenate([np.asarray(ptrs, dtype=np.int64), np.asarray(sizes, dtype=np.int64), starts])
    hit = _tables[key] = (backend.cupy().asarray(host), int(starts[-1]))
    if len(_tables) > _CACHE_SIZE:
        _tables.popitem(last=False)
    return hit


def grid_for(n_chunks):
    return max(1, min(n_chunks, MAX_BLOCKS))


def read_table(flat, n, columns):
    """Host-side reading of a table (for the kernels' emulators and checks): (pointer columns,
    sizes, chunk starts), with an error when the sizes and chunk starts disagree."""
    if flat.dtype != np.int64 or flat.size != (columns + 2) * n + 1:
        raise ValueError(f"a multi-tensor table of {n} tensors and {columns} pointer columns has "
                         f"{(columns + 2) * n + 1} int64 entries, got {flat.size} {flat.dtype}")
    ptrs = flat[: columns * n].reshape(columns, n)
    sizes = flat[columns * n: (columns + 1) * n]
    starts = flat[(columns + 1) * n:]
    if not np.array_equal(starts, chunks_of(sizes)):
        raise ValueError(f"multi-tensor table: chunk starts {starts.tolist()} do not match sizes {sizes.tolist()} "
                         f"in chunks of {CHUNK}")
    return ptrs, sizes, starts
