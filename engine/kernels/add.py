"""a + b of two arrays of one shape: the residual adds and gradient sums of a training step.

CuPy's `a + b` moves two [8192, 768] float32 arrays into a third at ~1.8 TB/s on an H200 (50 such
adds in a GPT-2 124M fp16 step, 1.7 ms), against ~2.9 TB/s for a copy; this kernel reads 16 bytes
of `a` per thread (8 halves, 4 floats, 2 doubles) and the same number of elements of `b`, as the
bias-add and cast kernels that reach ~3 TB/s there (tools/benchmarks/gpu_elementwise.py). The
sum is computed in the accumulation type (float32 for float16) and rounded once to a's dtype, as
numpy's.

Operands of one dtype (float16, float32, float64), or float32 `a` + float16 `b` into float32:
the residual adds under float16 autocast (a float16 branch onto the float32 stream), where the
float16 operand is read as it is instead of a float32 copy of it made first (numpy's promotion:
the conversion is exact, the sum rounded once).

The vector path needs a multiple of 16 bytes of `a`, the three arrays 16-byte aligned and fewer
than 2^31 chunks; anything else takes one element per thread.
"""
import numpy as np

from .. import backend
from ._cuda import CHUNK_BYTES, CHUNKS, COMMON, MAX_CHUNKS, THREADS, acc_dtype, aligned, blocks, c_type, i32, \
    raw_kernel

SOURCE = COMMON + CHUNKS + r"""
template <int N> struct alignas(N) Bytes { unsigned int w[N / 4]; };  // N bytes in one access

template <typename T, typename U>
__device__ void add(const T* a, const U* b, T* y, u64 n, int chunked) {
  if (chunked) {  // 16 bytes of a and y per thread, as many elements of b; n / per < 2^31: 32-bit indices
    constexpr int per = 16 / sizeof(T);
    typedef Bytes<per * sizeof(U)> UChunk;
    const unsigned int chunks = (unsigned int)(n / per);
    for (unsigned int k = blockIdx.x * blockDim.x + threadIdx.x; k < chunks; k += gridDim.x * blockDim.x) {
      const Chunk u = reinterpret_cast<const Chunk*>(a)[k];
      const UChunk v = reinterpret_cast<const UChunk*>(b)[k];
      Chunk w;
      const T* ut = reinterpret_cast<const T*>(&u);
      const U* vt = reinterpret_cast<const U*>(&v);
      T* wt = reinterpret_cast<T*>(&w);
#pragma unroll
      for (int j = 0; j < per; ++j) wt[j] = from_acc<T>(to_acc(ut[j]) + to_acc(vt[j]));
      reinterpret_cast<Chunk*>(y)[k] = w;
    }
    return;
  }
  for (u64 e = blockIdx.x * (u64)blockDim.x + threadIdx.x; e < n; e += (u64)gridDim.x * blockDim.x)
    y[e] = from_acc<T>(to_acc(a[e]) + to_acc(b[e]));
}
"""

# (a's dtype, b's dtype) -> the kernel's extern "C" name
_PAIRS = [(np.float16, np.float16), (np.float32, np.float32), (np.float64, np.float64), (np.float32, np.float16)]
NAMES = {(np.dtype(a), np.dtype(b)): f"engine_add__{c_type(a).lstrip('_')}"
         + ("" if a == b else f"_{c_type(b).lstrip('_')}") for a, b in _PAIRS}
SOURCE += "\n".join(
    f'extern "C" __global__ void {name}(const {c_type(a)}* a, const {c_type(b)}* b, {c_type(a)}* y, u64 n, '
    f'int chunked) {{ add<{c_type(a)}, {c_type(b)}>(a, b, y, n, chunked); }}' for (a, b), name in NAMES.items())


def add_reference(a, b):
    """a + b summed in the accumulation dtype of a's, rounded once to a's dtype."""
    acc = acc_dtype(a.dtype)
    return (a.astype(acc) + b.astype(acc)).astype(a.dtype)


def supported(a, b):
    """Whether add_cuda takes this pair: non-empty C-contiguous arrays of one shape, of one float
    dtype or float32 + float16."""
    return (a.dtype, b.dtype) in NAMES and a.shape == b.shape and a.size > 0 and a.flags.c_contiguous \
        and b.flags.c_contiguous


def chunked(a, b, y):
    """Whether the launch takes the vector path (see the module doc)."""
    nbytes = a.size * a.dtype.itemsize
    return nbytes % CHUNK_BYTES == 0 and aligned(a, b, y) and nbytes // CHUNK_BYTES < MAX_CHUNKS


def add_cuda(a, b):
    """a + b as a new C-contiguous array of a's dtype, one launch."""
    if not supported(a, b):
        raise ValueError(f"add: needs non-empty C-contiguous arrays of one shape, of one float dtype or float32 + "
                         f"float16, got {a.dtype}{list(a.shape)} and {b.dtype}{list(b.shape)}")
    y = backend.cupy().empty(a.shape, a.dtype)
    vec = chunked(a, b, y)
    items = a.size * a.dtype.itemsize // CHUNK_BYTES if vec else a.size
    raw_kernel(SOURCE, NAMES[a.dtype, b.dtype])((blocks(items),), (THREADS,), (a, b, y, np.uint64(a.size), i32(vec)))
    return y
