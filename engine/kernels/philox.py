"""Philox4x32-10 random numbers on CUDA: the engine's device generator (as torch's CUDA one).

A counter-based generator has no state but (seed, offset): group g of a draw is the Philox block
of counter offset + g under key seed, four 32-bit words. So a device generator's state is two
integers, saved in checkpoints and restored exactly; nothing is allocated per call (CuPy's
curand generators keep a state per thread and are slow to create); and any shard of a tensor can
compute its own numbers from element indices.

Each kernel has a numpy reference with the same signature computing the same bits (the float
transforms use the same formulas; normals agree with the GPU's to a few ulp: log, sqrt and
sincospi round differently).
"""
import numpy as np

from ._cuda import THREADS, blocks, raw_kernel

_M0, _M1 = 0xD2511F53, 0xCD9E8D57
_W0, _W1 = 0x9E3779B9, 0xBB67AE85
MASK64 = (1 << 64) - 1

# outputs per Philox block (four 32-bit words) of each kind of draw
PER_GROUP = {"uniform_float": 4, "uniform_double": 2, "normal_float": 2, "normal_double": 2, "bits": 4}

# the generator's device functions, for kernels that draw their own numbers (dropout_add, flash)
DEVICE = r"""
typedef unsigned int u32;
typedef unsigned long long u64;

__device__ __forceinline__ void philox(u64 seed, u64 ctr, u32 w[4]) {
    u32 c0 = (u32)ctr, c1 = (u32)(ctr >> 32), c2 = 0u, c3 = 0u;
    u32 k0 = (u32)seed, k1 = (u32)(seed >> 32);
    #pragma unroll
    for (int r = 0; r < 10; ++r) {
        if (r) { k0 += 0x9E3779B9u; k1 += 0xBB67AE85u; }
        u32 hi0 = __umulhi(0xD2511F53u, c0), lo0 = 0xD2511F53u * c0;
        u32 hi1 = __umulhi(0xCD9E8D57u, c2), lo1 = 0xCD9E8D57u * c2;
        c0 = hi1 ^ c1 ^ k0; c1 = lo1; c2 = hi0 ^ c3 ^ k1; c3 = lo0;
    }
    w[0] = c0; w[1] = c1; w[2] = c2; w[3] = c3;
}

// The stream position of a draw: (seed, offset) as passed, or, for a draw captured in a CUDA graph
// (`state` not null), the seed and base offset that each replay finds in device memory, plus the
// passed offset (the draw's place in the graph): every replay draws new numbers.
__device__ __forceinline__ void stream_position(const u64* state, u64& seed, u64& offset) {
    if (state != nullptr) { seed = state[0]; offset += state[1]; }
}

__device__ __forceinline__ float u24(u32 x) { return (x >> 8) * (1.0f / 16777216.0f); }
__device__ __forceinline__ double u53(u32 a, u32 b) {
    return ((a >> 5) * 67108864.0 + (b >> 6)) * (1.0 / 9007199254740992.0);
}
"""

SOURCE = DEVICE + r"""
#define GROUPS(per) for (u64 g = blockIdx.x * (u64)blockDim.x + threadIdx.x; g * per < n; \
                         g += (u64)gridDim.x * blockDim.x)

extern "C" __global__ void engine_philox_uniform_float(float* out, u64 n, u64 seed, u64 offset, const u64* state) {
    stream_position(state, seed, offset);
    GROUPS(4) {
        u32 w[4]; philox(seed, offset + g, w);
        for (int k = 0; k < 4 && g * 4 + k < n; ++k) out[g * 4 + k] = u24(w[k]);
    }
}

extern "C" __global__ void engine_philox_uniform_double(double* out, u64 n, u64 seed, u64 offset, const u64* state) {
    stream_position(state, seed, offset);
    GROUPS(2) {
        u32 w[4]; philox(seed, offset + g, w);
        out[g * 2] = u53(w[0], w[1]);
        if (g * 2 + 1 < n) out[g * 2 + 1] = u53(w[2], w[3]);
    }
}

extern "C" __global__ void engine_philox_normal_float(float* out, u64 n, u64 seed, u64 offset, const u64* state) {
    stream_position(state, seed, offset);
    GROUPS(2) {
        u32 w[4]; philox(seed, offset + g, w);
        float u1 = ((w[0] >> 8) + 1u) * (1.0f / 16777216.0f), u2 = u24(w[1]);
        float r = sqrtf(-2.0f * logf(u1)), s, c;
        sincospif(2.0f * u2, &s, &c);
        out[g * 2] = r * c;
        if (g * 2 + 1 < n) out[g * 2 + 1] = r * s;
    }
}

extern "C" __global__ void engine_philox_normal_double(double* out, u64 n, u64 seed, u64 offset, const u64* state) {
    stream_position(state, seed, offset);
    GROUPS(2) {
        u32 w[4]; philox(seed, offset + g, w);
        double u1 = 1.0 - u53(w[0], w[1]), u2 = u53(w[2], w[3]);
        double r = sqrt(-2.0 * log(u1)), s, c;
        sincospi(2.0 * u2, &s, &c);
        out[g * 2] = r * c;
        if (g * 2 + 1 < n) out[g * 2 + 1] = r * s;
    }
}

extern "C" __global__ void engine_philox_bits(u32* out, u64 n, u64 seed, u64 offset, const u64* state) {
    stream_position(state, seed, offset);
    GROUPS(4) {
        u32 w[4]; philox(seed, offset + g, w);
        for (int k = 0; k < 4 && g * 4 + k < n; ++k) out[g * 4 + k] = w[k];
    }
}
"""

_OUT_DTYPE = {"uniform_float": np.float32, "uniform_double": np.float64, "normal_float": np.float32,
              "normal_double": np.float64, "bits": np.uint32}


def uniform_kind(dtype):
    """The draw of uniforms for elements of `dtype`: doubles for float64, floats otherwise."""
    return "uniform_double" if np.dtype(dtype) == np.float64 else "uniform_float"


def groups(kind, n):
    """Philox blocks a draw of `n` values of `kind` consumes (the generator's offset advance)."""
    per = PER_GROUP[kind]
    return (n + per - 1) // per


# ------------------------------------------------------------------ numpy reference
def philox_words(seed, counters):
    """The four 32-bit words (shape (4, len(counters)), uint64 holding 32 bits) of each counter."""
    ctr = np.asarray(counters, dtype=np.uint64)
    lo32 = np.uint64(0xFFFFFFFF)
    c0, c1 = ctr & lo32, ctr >> np.uint64(32)
    c2 = np.zeros_like(c0)
    c3 = np.zeros_like(c0)
    k0, k1 = seed & 0xFFFFFFFF, (seed >> 32) & 0xFFFFFFFF
    for r in range(10):
        if r:
            k0, k1 = (k0 + _W0) & 0xFFFFFFFF, (k1 + _W1) & 0xFFFFFFFF
        p0, p1 = np.uint64(_M0) * c0, np.uint64(_M1) * c2
        c0, c1, c2, c3 = ((p1 >> np.uint64(32)) ^ c1 ^ np.uint64(k0), p1 & lo32,
                          (p0 >> np.uint64(32)) ^ c3 ^ np.uint64(k1), p0 & lo32)
    return np.stack([c0, c1, c2, c3])


def _u24(w):
    return (w >> np.uint64(8)).astype(np.float32) * np.float32(1.0 / 16777216.0)


def _u53(a, b):
    return ((a >> np.uint64(5)).astype(np.float64) * 67108864.0 + (b >> np.uint64(6)).astype(np.float64)) \
        * (1.0 / 9007199254740992.0)


_PI_LONG = 4 * np.arctan(np.longdouble(1))


def reference(kind, n, seed, offset):
    """`n` values of `kind` from (seed, offset), as the CUDA kernel computes them."""
    w = philox_words(seed, offset + np.arange(groups(kind, n), dtype=np.uint64))
    if kind == "uniform_float":
        out = _u24(w).T.reshape(-1)
    elif kind == "bits":
        out = w.astype(np.uint32).T.reshape(-1)
    elif kind == "uniform_double":
        out = np.stack([_u53(w[0], w[1]), _u53(w[2], w[3])]).T.reshape(-1)
    elif kind == "normal_float":
        u1 = ((w[0] >> np.uint64(8)) + np.uint64(1)).astype(np.float32) * np.float32(1.0 / 16777216.0)
        r = np.sqrt(np.float32(-2.0) * np.log(u1))
        turn = 2.0 * _u24(w[1]).astype(np.float64)  # sincospif(2 u2): the angle pi * turn, no rounded 2 pi
        out = np.stack([r * np.cos(np.pi * turn).astype(np.float32), r * np.sin(np.pi * turn).astype(np.float32)])
        out = out.T.reshape(-1)
    else:  # normal_double
        u1, u2 = 1.0 - _u53(w[0], w[1]), _u53(w[2], w[3])
        r = np.sqrt(-2.0 * np.log(u1))
        # sincospi(2 u2): pi * turn in extended precision, not a double 2 pi times u2 (whose
        # rounding alone moved the results by several ulp from the GPU's)
        angle = _PI_LONG * (2.0 * u2).astype(np.longdouble)
        out = np.stack([r * np.cos(angle).astype(np.float64), r * np.sin(angle).astype(np.float64)])
        out = out.T.reshape(-1)
    return out[:n]


# ------------------------------------------------------------------ draws inside CUDA graphs
class GraphOffset(int):
    """The offset of a draw captured in a CUDA graph: its place from the graph's start (an int, so
    it flows through the code that passes offsets on) and `state`, the device memory [seed, base
    offset] each replay of that graph finds set to the stream's position (engine/cuda_graphs.py)."""

    def __new__(cls, value, state):
        self = super().__new__(cls, value)
        self.state = state
        return self

    def __add__(self, other):  # a later draw's place in the same graph
        return GraphOffset(int(self) + int(other), self.state)


def state_arg(offset):
    """The kernels' `state` argument for a draw at `offset`: the device [seed, base offset] of a
    captured draw, else a null pointer (the seed and offset passed are the position)."""
    return offset.state if isinstance(offset, GraphOffset) else np.uint64(0)


# ------------------------------------------------------------------ CUDA launcher
def draw(xp, kind, n, seed, offset):
    """`n` values of `kind` on the current device: one launch."""
    out = xp.empty(n, dtype=_OUT_DTYPE[kind])
    if n:
        kernel = raw_kernel(SOURCE, f"engine_philox_{kind}")
        kernel((blocks(groups(kind, n)),), (THREADS,),
               (out, np.uint64(n), np.uint64(seed & MASK64), np.uint64(offset), state_arg(offset)))
    return out
