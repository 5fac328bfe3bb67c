"""A linear layer's bias added to its product in place: y[r, c] += b[c] over rows of d.

CuPy's broadcast `y += b` computes each element's bias index with 64-bit divisions and moves a
[8192, 3072] float16 product at ~780 GB/s on an H200, a quarter of the device's copy bandwidth;
this kernel moves 16 bytes per thread (8 halves, 4 floats, 2 doubles) and reaches ~3 TB/s there
(tools/benchmarks/gpu_elementwise.py): 48 bias adds of a GPT-2 124M step, 3.3 -> ~0.9 ms.

The sum is computed in the accumulation type (float32 for float16) and rounded once, as the
numpy reference. The 16-byte path needs rows of a multiple of 16 bytes, both arrays 16-byte
aligned and fewer than 2^31 chunks (the 32-bit grid-stride index plus its stride stays below
2^32); anything else takes one element per thread.
"""
import numpy as np

from ._cuda import CHUNK_BYTES, CHUNKS, COMMON, THREADS, acc_dtype, blocks, i32, instantiate, kernel_name, \
    raw_kernel, rows_chunked

SOURCE = COMMON + CHUNKS + r"""
template <typename T>
__device__ void bias_add(T* y, const T* b, u64 n, int d, int chunked) {
  if (chunked) {  // 16 bytes per thread; n / per < 2^31, so 32-bit indices
    const unsigned int per = 16 / sizeof(T), chunks = (unsigned int)(n / per), row = (unsigned int)d / per;
    for (unsigned int k = blockIdx.x * blockDim.x + threadIdx.x; k < chunks; k += gridDim.x * blockDim.x) {
      Chunk v = reinterpret_cast<Chunk*>(y)[k];
      const Chunk w = reinterpret_cast<const Chunk*>(b)[k % row];
      T* vt = reinterpret_cast<T*>(&v);
      const T* wt = reinterpret_cast<const T*>(&w);
#pragma unroll
      for (int j = 0; j < (int)(16 / sizeof(T)); ++j) vt[j] = from_acc<T>(to_acc(vt[j]) + to_acc(wt[j]));
      reinterpret_cast<Chunk*>(y)[k] = v;
    }
    return;
  }
  for (u64 e = blockIdx.x * (u64)blockDim.x + threadIdx.x; e < n; e += (u64)gridDim.x * blockDim.x)
    y[e] = from_acc<T>(to_acc(y[e]) + to_acc(b[e % d]));
}
""" + instantiate("engine_bias_add", "{T}* y, const {T}* b, u64 n, int d, int chunked",
                  "bias_add<{T}>(y, b, n, d, chunked)")

def bias_add_reference(y, b):
    """y + b over the last axis, summed in the accumulation dtype and rounded to y's dtype."""
    acc = acc_dtype(y.dtype)
    return (y.astype(acc) + b.astype(acc)).astype(y.dtype)


def chunked(y, b):
    """Whether the launch takes the 16-byte path (see the module doc)."""
    return rows_chunked(y, b)


def supported(y, b):
    """Whether bias_add_cuda_ takes this pair: a C-contiguous floating y, b of y's dtype and last
    dim, contiguous."""
    return y.dtype in (np.float16, np.float32, np.float64) and b.dtype == y.dtype and y.ndim >= 1 \
        and b.shape == y.shape[-1:] and y.flags.c_contiguous and b.flags.c_contiguous and y.size > 0


def bias_add_cuda_(y, b):
    """y += b over y's last axis, in place, one launch; returns y."""
    if not supported(y, b):
        raise ValueError(f"bias_add: needs a C-contiguous float y and a contiguous bias of its last dim and dtype, "
                         f"got {y.dtype}{list(y.shape)} and {b.dtype}{list(b.shape)}")
    vec = chunked(y, b)
    items = y.size * y.dtype.itemsize // CHUNK_BYTES if vec else y.size
    raw_kernel(SOURCE, kernel_name("engine_bias_add", y.dtype))(
        (blocks(items),), (THREADS,), (y, b, np.uint64(y.size), i32(y.shape[-1]), i32(vec)))
    return y
