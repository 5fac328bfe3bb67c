"""Compiling and launching CuPy kernels: one cache of compiled kernels, the launch geometry and the
explicit scalar types raw kernels need.

CuPy compiles a RawKernel on its first launch on each device and caches the binary on disk; the
engine keeps the kernel objects so that a source is hashed once per process, not per call. The
cache is keyed by the CuPy module too: a test may swap the backend (real CuPy, the CuPy double)
inside one process, and a kernel object only launches on its own module's arrays.
"""
import numpy as np

from .. import backend

THREADS = 256  # threads per block of the row-wise and grid-stride kernels
_OPTIONS = ("--std=c++17",)  # C++14 is deprecated from CUDA 12.x
_raw = {}
_elementwise = {}


def raw_kernel(source, name):
    """The compiled `name` (an `extern "C" __global__` function) of CUDA `source`."""
    cp = backend.cupy()
    key = (id(cp), name, source)
    kernel = _raw.get(key)
    if kernel is None:
        kernel = _raw[key] = cp.RawKernel(source, name, options=_OPTIONS)
    return kernel


def elementwise_kernel(in_params, out_params, operation, name, preamble=""):
    """A CuPy ElementwiseKernel (CuPy broadcasts and picks the types; one launch per call)."""
    cp = backend.cupy()
    key = (id(cp), name, in_params, out_params, operation, preamble)
    kernel = _elementwise.get(key)
    if kernel is None:
        kernel = _elementwise[key] = cp.ElementwiseKernel(
            in_params, out_params, operation, name, preamble=preamble)
    return kernel


# 16-byte vector loads and stores for the memory-bound kernels (bias add, casts, GELU,
# cross-entropy): a Chunk is one such access. Their 32-bit grid-stride index stays below 2^32
# (index plus stride) when there are fewer than MAX_CHUNKS chunks.
CHUNK_BYTES = 16
MAX_CHUNKS = 2 ** 31
CHUNKS = r"""
typedef unsigned long long u64;
struct alignas(16) Chunk { unsigned int w[4]; };
"""


def aligned(*arrays):
    """Whether every array starts on a 16-byte boundary (a Chunk's vector access)."""
    return all(a.data.ptr % CHUNK_BYTES == 0 for a in arrays)


def rows_chunked(out, *others):
    """Whether a kernel over the rows (last dim) of `out`, and `others` laid out alike or as one
    row, may move 16 bytes per thread: rows of a multiple of 16 bytes, every array aligned, fewer
    than MAX_CHUNKS chunks."""
    size = out.dtype.itemsize
    return out.shape[-1] * size % CHUNK_BYTES == 0 and aligned(out, *others) \
        and out.size * size // CHUNK_BYTES < MAX_CHUNKS


def blocks(n, threads=THREADS, limit=65535 * 32):
    """Blocks for a grid-stride loop over `n` items (at least one, at most `limit`)."""
    return max(1, min((n + threads - 1) // threads, limit))


def i32(n):
    """A raw-kernel int argument (CuPy would pass a Python int as a 64-bit long long)."""
    return np.int32(n)


def i64(n):
    return np.int64(n)


def f32(x):
    return np.float32(x)


def f64(x):
    return np.float64(x)


def acc_dtype(dtype):
    """The dtype the kernels accumulate `dtype` in: float32 for float16/float32, else float64."""
    return np.dtype(np.float64) if np.dtype(dtype) == np.float64 else np.dtype(np.float32)


C_TYPES = {np.dtype(np.float32): "float", np.dtype(np.float16): "__half", np.dtype(np.float64): "double"}


def c_type(dtype):
    """The CUDA C type of a floating numpy dtype, with a clear error for the others."""
    try:
        return C_TYPES[np.dtype(dtype)]
    except KeyError:
        raise TypeError(f"fused CUDA kernels support float16, float32 and float64, not {np.dtype(dtype)}") from None


# ------------------------------------------------------------------ one kernel per dtype
FLOAT_DTYPES = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))


def kernel_name(base, dtype):
    """`base__half`, `base__float` or `base__double`: the extern "C" instantiation of a templated
    kernel for `dtype` (the CuPy double's emulators key on `base`, the text before `__`)."""
    return f"{base}__{c_type(dtype).lstrip('_')}"


def instantiate(base, params, call, dtypes=FLOAT_DTYPES):
    """extern "C" wrappers around a templated `__device__` kernel body, one per dtype, so that a
    RawKernel can find each by a plain name. `params` and `call` are format strings in `{T}`,
    the element type."""
    return "\n".join(
        f'extern "C" __global__ void {kernel_name(base, dt)}({params.format(T=c_type(dt))}) '
        f'{{ {call.format(T=c_type(dt))}; }}' for dt in dtypes)


def row_threads(n, limit=THREADS):
    """Threads of a one-block-per-row kernel for rows of `n`: whole warps, no more than a row has
    elements for (short rows of attention scores), at most `limit`."""
    return min(limit, max(32, (n + 31) // 32 * 32))


# Device code the row kernels share: the float accumulation type of each element type, loads
# and stores through it, and warp-shuffle + shared-memory block reductions. A block has a
# multiple of 32 threads, at most 1024 (so at most 32 warps: one shared slot per warp).
COMMON = r"""
#include <cuda_fp16.h>

template <typename T> struct Acc { typedef float type; };
template <> struct Acc<double> { typedef double type; };

__device__ __forceinline__ float to_acc(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_acc(float v) { return v; }
__device__ __forceinline__ double to_acc(double v) { return v; }

template <typename T> __device__ __forceinline__ T from_acc(typename Acc<T>::type v);
template <> __device__ __forceinline__ __half from_acc<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ float from_acc<float>(float v) { return v; }
template <> __device__ __forceinline__ double from_acc<double>(double v) { return v; }

__device__ __forceinline__ float acc_exp(float v) { return expf(v); }
__device__ __forceinline__ double acc_exp(double v) { return exp(v); }
__device__ __forceinline__ float acc_rsqrt(float v) { return rsqrtf(v); }
__device__ __forceinline__ double acc_rsqrt(double v) { return rsqrt(v); }

template <typename A> __device__ __forceinline__ A neg_inf();
template <> __device__ __forceinline__ float neg_inf<float>() { return -__int_as_float(0x7f800000); }
template <> __device__ __forceinline__ double neg_inf<double>() { return -__longlong_as_double(0x7ff0000000000000LL); }

// max that propagates nan, as numpy's and torch's row max do
template <typename A> __device__ __forceinline__ A nan_max(A a, A b) { return (a > b || a != a) ? a : b; }

template <typename A> __device__ __forceinline__ A warp_sum(A v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

template <typename A> __device__ __forceinline__ A warp_max(A v) {
  for (int o = 16; o > 0; o >>= 1) v = nan_max(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// The sum of `v` over the block, returned to every thread. `shared` holds 32 values; the first
// __syncthreads lets consecutive reductions reuse it.
template <typename A> __device__ A block_sum(A v, A* shared) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < (int)(blockDim.x >> 5) ? shared[lane] : A(0);
  return warp_sum(v);
}

template <typename A> __device__ A block_max(A v, A* shared) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < (int)(blockDim.x >> 5) ? shared[lane] : neg_inf<A>();
  return warp_max(v);
}
"""
