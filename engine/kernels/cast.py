"""float16 <-> float32 casts of contiguous arrays: the casts around a linear layer under autocast.

CuPy's `astype` between float16 and float32 moves a [8192, 768] activation at ~720 GB/s on an
H200 (tools/benchmarks/gpu_elementwise.py), a quarter of the device's copy bandwidth; a GPT-2
124M fp16 step makes ~100 such casts (the layer norms' float32 outputs into the linears, the
linears' float16 outputs into the float32 residual stream, and their gradients back). This
kernel converts 8 elements per thread with 16-byte loads and stores. float32 -> float16 rounds
to nearest even, overflows to inf and keeps NaN (numpy's astype); float16 -> float32 is exact.

The 16-byte path needs a multiple of 8 elements, both arrays 16-byte aligned and fewer than
2^31 groups of 8 (the 32-bit grid-stride index plus its stride stays below 2^32); anything
else takes one element per thread.
"""
import numpy as np

from .. import backend
from ._cuda import CHUNKS, COMMON, MAX_CHUNKS, THREADS, aligned, blocks, i32, raw_kernel

SOURCE = COMMON + CHUNKS + r"""
template <typename S, typename D>
__device__ void cast(const S* x, D* y, u64 n, int chunked) {
  if (chunked) {  // 8 elements per thread: sizeof(S) / 2 chunks in, sizeof(D) / 2 chunks out
    const int in = sizeof(S) / 2, out = sizeof(D) / 2;
    const unsigned int groups = (unsigned int)(n / 8);
    for (unsigned int k = blockIdx.x * blockDim.x + threadIdx.x; k < groups; k += gridDim.x * blockDim.x) {
      Chunk a[sizeof(S) / 2], b[sizeof(D) / 2];
#pragma unroll
      for (int c = 0; c < in; ++c) a[c] = reinterpret_cast<const Chunk*>(x)[(u64)k * in + c];
      const S* xs = reinterpret_cast<const S*>(a);
      D* ys = reinterpret_cast<D*>(b);
#pragma unroll
      for (int j = 0; j < 8; ++j) ys[j] = from_acc<D>(to_acc(xs[j]));
#pragma unroll
      for (int c = 0; c < out; ++c) reinterpret_cast<Chunk*>(y)[(u64)k * out + c] = b[c];
    }
    return;
  }
  for (u64 e = blockIdx.x * (u64)blockDim.x + threadIdx.x; e < n; e += (u64)gridDim.x * blockDim.x)
    y[e] = from_acc<D>(to_acc(x[e]));
}

extern "C" __global__ void engine_cast__half_float(const __half* x, float* y, u64 n, int chunked) {
  cast<__half, float>(x, y, n, chunked);
}
extern "C" __global__ void engine_cast__float_half(const float* x, __half* y, u64 n, int chunked) {
  cast<float, __half>(x, y, n, chunked);
}
"""

_NAMES = {(np.dtype(np.float16), np.dtype(np.float32)): "engine_cast__half_float",
          (np.dtype(np.float32), np.dtype(np.float16)): "engine_cast__float_half"}
GROUP = 8


def supported(x, dtype):
    """Whether cast_cuda takes this cast: float16 <-> float32 of a non-empty C-contiguous array."""
    return (x.dtype, np.dtype(dtype)) in _NAMES and x.size > 0 and x.flags.c_contiguous


def chunked(x, y):
    """Whether the launch takes the 16-byte path (see the module doc)."""
    return x.size % GROUP == 0 and aligned(x, y) and x.size // GROUP < MAX_CHUNKS


def cast_reference(x, dtype):
    return x.astype(dtype)


def cast_cuda(x, dtype):
    """x as `dtype` (a new C-contiguous array), one launch."""
    dtype = np.dtype(dtype)
    if not supported(x, dtype):
        raise ValueError(f"cast: float16 <-> float32 of a non-empty C-contiguous array, got {x.dtype}"
                         f"{list(x.shape)} (contiguous: {x.flags.c_contiguous}) to {dtype}")
    cp = backend.cupy()
    y = cp.empty(x.shape, dtype)
    vec = chunked(x, y)
    items = x.size // GROUP if vec else x.size
    raw_kernel(SOURCE, _NAMES[x.dtype, dtype])((blocks(items),), (THREADS,), (x, y, np.uint64(x.size), i32(vec)))
    return y
