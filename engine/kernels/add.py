"""a + b of two arrays of one shape and floating dtype: the residual adds and gradient sums of a
training step.

CuPy's `a + b` moves two [8192, 768] float32 arrays into a third at ~1.8 TB/s on an H200 (50 such
adds in a GPT-2 124M fp16 step, 1.7 ms), against ~2.9 TB/s for a copy; this kernel adds 16 bytes
of each operand per thread (8 halves, 4 floats, 2 doubles), as the bias-add and cast kernels that
reach ~3 TB/s there (tools/benchmarks/gpu_elementwise.py). The sum is computed in the
accumulation type (float32 for float16) and rounded once, as numpy's.

The 16-byte path needs a multiple of 16 bytes, the three arrays 16-byte aligned and fewer than
2^31 chunks; anything else takes one element per thread.

`add_mixed_cuda` adds a float16 array to a float32 one into float32 (the residual adds under
autocast, a float16 branch onto the float32 stream), reading the float16 operand as it is
instead of a float32 copy of it made first.
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

// a float32 + a float16 array into float32 (the float32 residual stream plus a float16 branch
// under autocast, without the branch's cast): 4 elements per thread, 16 bytes of a and y, 8 of b
struct alignas(8) HalfChunk { unsigned int w[2]; };

__device__ void add_float_half(const float* a, const __half* b, float* y, u64 n, int chunked) {
  if (chunked) {
    const unsigned int groups = (unsigned int)(n / 4);
    for (unsigned int k = blockIdx.x * blockDim.x + threadIdx.x; k < groups; k += gridDim.x * blockDim.x) {
      const Chunk u = reinterpret_cast<const Chunk*>(a)[k];
      const HalfChunk v = reinterpret_cast<const HalfChunk*>(b)[k];
      Chunk w;
      const float* ut = reinterpret_cast<const float*>(&u);
      const __half* vt = reinterpret_cast<const __half*>(&v);
      float* wt = reinterpret_cast<float*>(&w);
#pragma unroll
      for (int j = 0; j < 4; ++j) wt[j] = ut[j] + to_acc(vt[j]);
      reinterpret_cast<Chunk*>(y)[k] = w;
    }
    return;
  }
  for (u64 e = blockIdx.x * (u64)blockDim.x + threadIdx.x; e < n; e += (u64)gridDim.x * blockDim.x)
    y[e] = a[e] + to_acc(b[e]);
}

extern "C" __global__ void engine_add_mixed__float_half(const float* a, const __half* b, float* y, u64 n,
                                                         int chunked) {
  add_float_half(a, b, y, n, chunked);
}
""" + instantiate("engine_add", "const {T}* a, const {T}* b, {T}* y, u64 n, int chunked", "add<{T}>(a, b, y, n, chunked)")

MIXED_NAME = "engine_add_mixed__float_half"
MIXED_GROUP = 4  # elements per thread on the vector path


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


def mixed_supported(a, b):
    """Whether add_mixed_cuda takes this pair: non-empty C-contiguous float32 `a` and float16 `b`
    of one shape."""
    return a.dtype == np.float32 and b.dtype == np.float16 and a.shape == b.shape and a.size > 0 \
        and a.flags.c_contiguous and b.flags.c_contiguous


def mixed_chunked(a, b, y):
    """Whether the mixed launch takes its vector path: groups of 4, every array 16-byte aligned."""
    return a.size % MIXED_GROUP == 0 and aligned(a, b, y) and a.size // MIXED_GROUP < MAX_CHUNKS


def add_mixed_reference(a, b):
    """float32 a + float16 b: b converted exactly, one float32 rounding (numpy's promotion)."""
    return a + b.astype(np.float32)


def add_mixed_cuda(a, b):
    """float32 a + float16 b as a new float32 array, one launch (no float32 copy of b made)."""
    if not mixed_supported(a, b):
        raise ValueError(f"add: the mixed kernel takes C-contiguous float32 and float16 arrays of one shape, got "
                         f"{a.dtype}{list(a.shape)} and {b.dtype}{list(b.shape)}")
    y = backend.cupy().empty(a.shape, np.float32)
    vec = mixed_chunked(a, b, y)
    items = a.size // MIXED_GROUP if vec else a.size
    raw_kernel(SOURCE, MIXED_NAME)((blocks(items),), (THREADS,), (a, b, y, np.uint64(a.size), i32(vec)))
    return y


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
