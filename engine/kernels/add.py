"""a + b of two arrays of one shape and floating dtype: the residual adds and gradient sums of a
training step.

CuPy's `a + b` moves two [8192, 768] float32 arrays into a third at ~1.8 TB/s on an H200 (50 such
adds in a GPT-2 124M fp16 step, 1.7 ms), against ~2.9 TB/s for a copy; this kernel adds 16 bytes
of each operand per thread (8 halves, 4 floats, 2 doubles), as the bias-add and cast kernels that
reach ~3 TB/s there (tools/benchmarks/gpu_elementwise.py). The sum is computed in the
accumulation type (float32 for float16) and rounded once, as numpy's.

The 16-byte path needs a multiple of 16 bytes, the three arrays 16-byte aligned and fewer than
2^31 chunks; anything else takes one element per thread.
"""
import numpy as np

from .. import backend
from ._cuda import CHUNK_BYTES, CHUNKS, COMMON, MAX_CHUNKS, THREADS, acc_dtype, aligned, blocks, i32, \
    instantiate, kernel_name, raw_kernel

SOURCE = COMMON + CHUNKS + r"""
template <typename T>
__device__ void add(const T* a, const T* b, T* y, u64 n, int chunked) {
  if (chunked) {  // 16 bytes of each operand per thread; n / per < 2^31, so 32-bit indices
    const unsigned int chunks = (unsigned int)(n / (16 / sizeof(T)));
    for (unsigned int k = blockIdx.x * blockDim.x + threadIdx.x; k < chunks; k += gridDim.x * blockDim.x) {
      const Chunk u = reinterpret_cast<const Chunk*>(a)[k];
      const Chunk v = reinterpret_cast<const Chunk*>(b)[k];
      Chunk w;
      const T* ut = reinterpret_cast<const T*>(&u);
      const T* vt = reinterpret_cast<const T*>(&v);
      T* wt = reinterpret_cast<T*>(&w);
#pragma unroll
      for (int j = 0; j < (int)(16 / sizeof(T)); ++j) wt[j] = from_acc<T>(to_acc(ut[j]) + to_acc(vt[j]));
      reinterpret_cast<Chunk*>(y)[k] = w;
    }
    return;
  }
  for (u64 e = blockIdx.x * (u64)blockDim.x + threadIdx.x; e < n; e += (u64)gridDim.x * blockDim.x)
    y[e] = from_acc<T>(to_acc(a[e]) + to_acc(b[e]));
}
""" + instantiate("engine_add", "const {T}* a, const {T}* b, {T}* y, u64 n, int chunked", "add<{T}>(a, b, y, n, chunked)")


def add_reference(a, b):
    """a + b summed in the accumulation dtype, rounded once to their dtype."""
    acc = acc_dtype(a.dtype)
    return (a.astype(acc) + b.astype(acc)).astype(a.dtype)


def supported(a, b):
    """Whether add_cuda takes this pair: non-empty C-contiguous float16/32/64 arrays of one shape and dtype."""
    return a.dtype == b.dtype and a.dtype in (np.float16, np.float32, np.float64) and a.shape == b.shape \
        and a.size > 0 and a.flags.c_contiguous and b.flags.c_contiguous


def chunked(a, b, y):
    """Whether the launch takes the 16-byte path (see the module doc)."""
    nbytes = a.size * a.dtype.itemsize
    return nbytes % CHUNK_BYTES == 0 and aligned(a, b, y) and nbytes // CHUNK_BYTES < MAX_CHUNKS


def add_cuda(a, b):
    """a + b (a new C-contiguous array), one launch."""
    if not supported(a, b):
        raise ValueError(f"add: needs non-empty C-contiguous float arrays of one shape and dtype, got "
                         f"{a.dtype}{list(a.shape)} and {b.dtype}{list(b.shape)}")
    y = backend.cupy().empty(a.shape, a.dtype)
    vec = chunked(a, b, y)
    items = a.size * a.dtype.itemsize // CHUNK_BYTES if vec else a.size
    raw_kernel(SOURCE, kernel_name("engine_add", a.dtype))(
        (blocks(items),), (THREADS,), (a, b, y, np.uint64(a.size), i32(vec)))
    return y
