"""Flash attention on the packed QKV projection, float16 on tensor cores: the [b, heads, s, s]
scores are never written to memory.

    ctx = softmax(q k^T * scale, masked_fill(mask, fill)) @ v

q, k, v are read from qkv [b, s, heads, 3 * d] in place (each head's [q | k | v] side by side,
the layout of packed_qkv_attention) and ctx is written as [b, s, heads, d]. Masking is the one
of packed_qkv_attention: masked scores are set to the finite `fill` (not -inf), so a fully
masked row is uniform over all keys, and masked scores get no gradient. `causal` masks key j
for query i when j > i; with no other mask the tiles above the diagonal are skipped (their
exp(fill - max) is 0 in float32 wherever a row has an unmasked key, and under a causal mask
every row has one: key 0).

The kernels follow FlashAttention-2 (Dao, 2023). One block of 4 warps handles 64 rows (the
backward's) or 128 (the forward's, up to head size 64: two m-tiles of 16 per warp, so that each
K and V fragment read from shared memory feeds two products); each warp's m-tile of 16 rows is
computed with `mma.sync.m16n8k16` (float16 operands, float32 accumulators),
whose register layout the PTX ISA documents ("Matrix Fragments for mma.m16n8k16 with floating
point type"). That documented layout is what lets the probabilities stay in registers: the
accumulator fragments of two 16 x 8 score tiles are exactly the A-operand fragment of the
16 x 16 tile that multiplies V.

- forward (grid: query tiles x heads x batch): running row max m and sum l, the output
  accumulator rescaled by exp(m_old - m_new); writes ctx and lse = m + log(l) [b, heads, s].
  Registers (ptxas, sm_90, head size 64): 168 per thread with one m-tile, 255 with two (no spill
  inside the loop; 20 bytes around it); from head size 80 two m-tiles spill 44-956 bytes, so
  those sizes keep one (`forward_m_tiles`). Speed of either shape on a GPU: not yet measured
  (tools/benchmarks/gpu_flash.py times both).
- backward, split (the default): two kernels, no atomics (deterministic): `dq` per query tile
  (also writes D = rowsum(dO * O), which the softmax's gradient needs), then `dkdv` per key
  tile, reading D. Both recompute p = exp(z - lse) tile by tile: 7 tile products per (key tile,
  query tile) pair.
- backward, fused (FlashAttention-2's; `flash_backward(fused=True)`, up to head size 80): `bwd_pre`
  writes D and zeroes a float32 dq sum [b, heads, s, d]; `bwd` is dkdv's loop that also puts its
  ds tile in shared memory and multiplies it by its key tile into the dq sum, with float32
  atomics (5 products per pair, p computed once); `bwd_dq` scales and rounds the sum into dqkv.
  The atomics' order varies from run to run on a GPU, so dq's last bits do too.

Dropout of the probabilities (`dropout` = (p, seed, offset)) is drawn inside the kernels from the
engine's device generator stream (engine/kernels/philox.py), element by element as
`generator.random((b, heads, s, s))` at (seed, offset) would give it, so the elements dropped are
those the unfused core's mask drops from the same generator state; the row sums take every
probability, P @ V and dv the kept ones, and the backward draws the same numbers again (no mask
is stored). D = rowsum(dO * O) is unchanged by dropout (O is the dropped output).

Head sizes: multiples of 16 up to 128 (one compiled source per head size). Float16 only: the
tensor-core instruction takes float16 operands; other dtypes keep the cuBLAS + fused-softmax
path of engine/ops/attention.py.

Verified without a GPU by running this CUDA source on CPU threads (tests/cuda_on_cpu: one OS
thread per CUDA thread, __syncthreads a barrier, shuffles and the mma instruction emulated by
warp-wide exchanges in the documented layout), against the numpy references below.
"""
import functools

import numpy as np

from .. import backend
from . import dropout_add, philox
from ._cuda import f32, i32, i64, raw_kernel
from .softmax import unbroadcast

ROWS = 64  # query (forward, dq) or key (dkdv) rows of one block: 4 warps x 16
COLS = 64  # keys (forward, dq) or queries (dkdv) per step of the inner loop
THREADS = 128
HEAD_SIZES = tuple(range(16, 129, 16))
# The fused backward (flash_bwd) keeps five 64-row tiles in shared memory: Q, dO, K, ds (64 wide)
# and lse / D, 48 KB at most (a block's static limit) up to this head size; larger heads take the
# dq + dkdv kernels whatever is asked
FUSED_MAX_HEAD_SIZE = 80

_SOURCE = "#include <cuda_fp16.h>\n" + philox.DEVICE + r"""
#define HD __HEAD_SIZE__
#define KS (HD / 16)    // 16-wide k steps over the head dim
#define NT (HD / 8)     // 8-wide n tiles over the head dim
#define PAD (HD + 8)    // shared-memory row, padded against bank conflicts
#define ROWS 64
#define COLS 64
#define MT __M_TILES__       // query m-tiles of 16 rows per warp in the forward
#define FROWS (64 * MT)    // queries of one forward block
// dq's blocks per multiprocessor asked of ptxas: 3 (168 registers; 214 unasked at head size 64,
// which leaves room for 2) up to head size 64, where its loop still has no spill; above, 3 would
// spill inside the loop
#define DQ_MIN_BLOCKS (HD <= 64 ? 3 : 1)
#define NEG_INF (-__int_as_float(0x7f800000))

#define THREADS 128
#define LOG2E 1.4426950408889634f  // scores are kept in log2 units: exp2 is one instruction
#define LN2 0.6931471805599453f

#ifndef CUDA_ON_CPU  // the CPU stand-in of the tests (tests/cuda_on_cpu) emulates these instructions
// d[16x8] += a[16x16] b[16x8], float16 operands, float32 accumulators (PTX ISA layout)
__device__ __forceinline__ void mma16816(float* c, const unsigned* a, const unsigned* b) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
               "{%0,%1,%2,%3};"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// ldmatrix .x4: lanes 8i..8i+7 give the shared-memory addresses of the 8 rows (16 bytes each) of
// 8 x 8 matrix i; r[i] gets the lane's pair of it, (row lane / 4, columns 2 (lane % 4), +1), or
// with .trans of its transpose, (rows 2 (lane % 4), +1, column lane / 4): B fragments of mma
__device__ __forceinline__ void ldsm_x4(unsigned* r, const __half* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"((unsigned)__cvta_generic_to_shared(row)));
}
__device__ __forceinline__ void ldsm_x4_t(unsigned* r, const __half* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"((unsigned)__cvta_generic_to_shared(row)));
}

// Global -> shared copies that bypass registers and run while the block computes: 16 bytes (or
// 4), zeros where `full` is false (nothing is read then). A group of them is committed, then
// waited for (all of this thread's), then made visible to the block by __syncthreads.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool full) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"((unsigned)__cvta_generic_to_shared(dst)),
               "l"(src), "r"(full ? 16 : 0) : "memory");
}
__device__ __forceinline__ void cp_async4(void* dst, const void* src, bool full) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"((unsigned)__cvta_generic_to_shared(dst)),
               "l"(src), "r"(full ? 4 : 0) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;" ::: "memory"); }
#endif

// two float16 as one .f16x2 register: `lo` in the low half (the lower-numbered element)
__device__ __forceinline__ unsigned pack2(float lo, float hi) {
  return (unsigned)__half_as_ushort(__float2half_rn(lo)) | ((unsigned)__half_as_ushort(__float2half_rn(hi)) << 16);
}
// two adjacent float16 (even element index) as one register
__device__ __forceinline__ unsigned ld2(const __half* p) { return *reinterpret_cast<const unsigned*>(p); }
__device__ __forceinline__ float lo_f(unsigned r) { return __half2float(__ushort_as_half((unsigned short)(r & 0xffffu))); }
__device__ __forceinline__ float hi_f(unsigned r) { return __half2float(__ushort_as_half((unsigned short)(r >> 16))); }

// A-operand fragments of 16 rows [r0, r0 + 16) x HD of a row-major matrix (row stride `rs`, zero
// past row `n`): frag[kk] covers columns [16 kk, 16 kk + 16). Read once per block, from global.
__device__ __forceinline__ void load_a(unsigned frag[KS][4], const __half* m, long long rs, int r0, int n, int g, int t) {
  const int ra = r0 + g, rb = r0 + g + 8;
#pragma unroll
  for (int kk = 0; kk < KS; ++kk) {
    const int c = kk * 16 + 2 * t;
    frag[kk][0] = ra < n ? ld2(m + ra * rs + c) : 0u;
    frag[kk][1] = rb < n ? ld2(m + rb * rs + c) : 0u;
    frag[kk][2] = ra < n ? ld2(m + ra * rs + c + 8) : 0u;
    frag[kk][3] = rb < n ? ld2(m + rb * rs + c + 8) : 0u;
  }
}

// Starts copying rows [r0, r0 + 64) of a row-major matrix (row stride `rs`, 16-byte aligned rows,
// zeros past row `n`) into shared memory: HD / 16 copies of 16 bytes per thread
__device__ __forceinline__ void load_tile(__half (*dst)[PAD], const __half* m, long long rs, int r0, int n) {
#pragma unroll
  for (int it = 0; it < HD / 16; ++it) {
    const int w = threadIdx.x + it * THREADS, r = w / (HD / 8), c = 8 * (w % (HD / 8));
    const bool in = r0 + r < n;
    cp_async16(&dst[r][c], m + (in ? r0 + r : 0) * rs + c, in);
  }
}

// acc[m][16 x 64] = A_m[16 x HD] (fragments) times the 64 rows of `tile`, transposed, for M
// m-tiles of 16 rows: each B fragment is read from shared memory once for all M. One ldmatrix gives
// the B fragments of two n tiles: matrices (n tile 2 np, columns +0 / +8 of the k step), then
// (n tile 2 np + 1, +0 / +8). M-tiles below `first` are not computed (left as they are).
template <int M>
__device__ __forceinline__ void mma_rows_tm(float (&acc)[M][8][4], const unsigned (&a)[M][KS][4],
                                            const __half (*tile)[PAD], int lane, int first) {
  const int lr = lane & 7, lm = lane >> 3;  // this lane addresses row lr of matrix lm
#pragma unroll
  for (int mt = 0; mt < M; ++mt)
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) acc[mt][nt][0] = acc[mt][nt][1] = acc[mt][nt][2] = acc[mt][nt][3] = 0.f;
#pragma unroll
  for (int kk = 0; kk < KS; ++kk)
#pragma unroll
    for (int np = 0; np < 4; ++np) {
      unsigned b[4];
      ldsm_x4(b, &tile[(2 * np + (lm >> 1)) * 8 + lr][kk * 16 + (lm & 1) * 8]);
#pragma unroll
      for (int mt = 0; mt < M; ++mt) {
        if (mt < first) continue;
        mma16816(acc[mt][2 * np], a[mt][kk], b);
        mma16816(acc[mt][2 * np + 1], a[mt][kk], b + 2);
      }
    }
}

// acc[m][16 x HD] += P_m[16 x 64] times `tile` [64 x HD], P_m as A fragments (pa[m][j]: the k
// step of columns [16 j, 16 j + 16)), for M m-tiles; each B fragment read once for all M. One
// ldmatrix.trans gives the B fragments of two n tiles: matrices (rows +0 / +8 of the k step, n
// tile 2 np), then (+0 / +8, n tile 2 np + 1). M-tiles below `first` are left as they are.
template <int M>
__device__ __forceinline__ void mma_pa(float (&acc)[M][NT][4], const unsigned (&pa)[M][4][4], const __half (*tile)[PAD],
                                       int lane, int first) {
  const int lr = lane & 7, lm = lane >> 3;
#pragma unroll
  for (int j = 0; j < 4; ++j)
#pragma unroll
    for (int np = 0; np < NT / 2; ++np) {
      unsigned b[4];
      ldsm_x4_t(b, &tile[j * 16 + (lm & 1) * 8 + lr][(2 * np + (lm >> 1)) * 8]);
#pragma unroll
      for (int mt = 0; mt < M; ++mt) {
        if (mt < first) continue;
        mma16816(acc[mt][2 * np], pa[mt][j], b);
        mma16816(acc[mt][2 * np + 1], pa[mt][j], b + 2);
      }
    }
}

// The A fragments of a 16 x 64 tile held in the accumulator layout (rounded to float16): the
// accumulators of n tiles 2 j and 2 j + 1 are the A fragment of k step j.
__device__ __forceinline__ void pack_a(unsigned (&pa)[4][4], const float (&p)[8][4]) {
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    pa[j][0] = pack2(p[2 * j][0], p[2 * j][1]);
    pa[j][1] = pack2(p[2 * j][2], p[2 * j][3]);
    pa[j][2] = pack2(p[2 * j + 1][0], p[2 * j + 1][1]);
    pa[j][3] = pack2(p[2 * j + 1][2], p[2 * j + 1][3]);
  }
}

// One m-tile: acc[16 x 64] = A[16 x HD] times `tile` transposed (the backward kernels)
__device__ __forceinline__ void mma_rows_t(float (&acc)[8][4], const unsigned (&a)[KS][4], const __half (*tile)[PAD],
                                           int lane) {
  mma_rows_tm<1>(reinterpret_cast<float(&)[1][8][4]>(acc), reinterpret_cast<const unsigned(&)[1][KS][4]>(a), tile,
                 lane, 0);
}

// One m-tile: acc[16 x HD] += P[16 x 64] (accumulator layout) times `tile` [64 x HD]
__device__ __forceinline__ void mma_p_tile(float (&acc)[NT][4], const float (&p)[8][4], const __half (*tile)[PAD],
                                           int lane) {
  unsigned pa[1][4][4];
  pack_a(pa[0], p);
  mma_pa<1>(reinterpret_cast<float(&)[1][NT][4]>(acc), pa, tile, lane, 0);
}

// Whether score (query i, key j) is masked (set to fill). Only called for i, j < s.
__device__ __forceinline__ bool masked(int i, int j, int causal, const unsigned char* mask, long long mq, long long mk) {
  return (causal && j > i) || (mask != nullptr && mask[i * mq + j * mk]);
}

// Dropout of the probabilities, drawn here as generator.random((b, heads, s, s)) would draw
// them: probability (query i, key j) of the rows from bh is element e = (bh + i) s + j of the
// [b, heads, s, s] tensor and takes word e % 4 of Philox block offset + e / 4 (uniform_float);
// it is kept, times 1 / (1 - p), when u >= p, as engine.ops.dropout's mask is.
struct Dropout {
  u64 seed, offset;
  float p, scale;  // p = 0: no dropout (scale 1)

  __device__ __forceinline__ unsigned keep(u32 w) const { return (unsigned)(u24(w) >= p); }
  __device__ __forceinline__ unsigned kept(const u32 w[4], u64 e) const {  // element e's word: e % 4
    return keep((e & 2) ? ((e & 1) ? w[3] : w[2]) : ((e & 1) ? w[1] : w[0]));
  }

  // The keep bits of a warp's 16 x 64 accumulator tile: bit 4 nt + e for register e of n tile nt,
  // at row ra (e < 2) or rb and column c0 + 8 nt + (e & 1), c0 = (first column) + 2 t. Rows are
  // queries and columns keys, or the other way round (`rows_are_keys`, dkdv). Loops, not
  // unrolled: the Philox rounds are compiled once, not at each of the 32 registers.
  __device__ unsigned bits(long long bh, int s, int ra, int rb, int c0, bool rows_are_keys) const {
    if (p == 0.f) return ~0u;
    if (s % 4 == 0) return rows_are_keys ? bits_keys4(bh, s, ra, rb, c0) : bits_queries4(bh, s, ra, rb, c0);
    unsigned out = 0u;  // any s: a Philox block per register pair that lies in one, else two
#pragma unroll 1
    for (int x = 0; x < 32; x += 2) {
      const int r = (x & 2) ? rb : ra, c = c0 + (x >> 2) * 8;
      const int i = rows_are_keys ? c : r, j = rows_are_keys ? r : c;
      const u64 e0 = (u64)(bh + i) * (u64)s + (u64)j, e1 = e0 + (rows_are_keys ? (u64)s : 1ull);
      u32 w[4];
      philox(seed, offset + (e0 >> 2), w);
      out |= kept(w, e0) << x;
      if ((e1 >> 2) != (e0 >> 2)) philox(seed, offset + (e1 >> 2), w);
      out |= kept(w, e1) << (x + 1);
    }
    return out;
  }

  // s % 4 == 0: each Philox block holds keys 4m .. 4m + 3 of one query, so lanes that need the same
  // block share it, one block per lane and n tile. Queries as rows (forward, dq): lanes t and
  // t ^ 1 hold the two key pairs of a block, in rows ra and rb alike; the even lane draws row ra's
  // block, the odd one row rb's, and each gives the other its two bits of it.
  __device__ unsigned bits_queries4(long long bh, int s, int ra, int rb, int c0) const {
    const int hi = threadIdx.x & 1, row = hi ? rb : ra, k4 = c0 - 2 * hi;  // the block's first key
    unsigned out = 0u, give = 0u;
#pragma unroll 1
    for (int nt = 0; nt < 8; ++nt) {
      u32 w[4];
      philox(seed, offset + (((u64)(bh + row) * (u64)s + (u64)(k4 + 8 * nt)) >> 2), w);
      const int b = 4 * nt + 2 * hi;  // this lane's bits of `row`, and the partner's of it
      out |= (keep(hi ? w[2] : w[0]) << b) | (keep(hi ? w[3] : w[1]) << (b + 1));
      give |= (keep(hi ? w[0] : w[2]) << b) | (keep(hi ? w[1] : w[3]) << (b + 1));
    }
    return out | __shfl_xor_sync(0xffffffffu, give, 1);
  }

  // Keys as rows (dkdv): lanes g = 4m + q, q = 0 .. 3, of one t (lane bits 2 and 3) hold the four
  // keys of each block. Lane q draws the block of register slot q (key row ra or rb, query c or
  // c + 1), keeps in to[q'] the bit of word q' for lane q', and the four lanes swap (a 4 x 4
  // transpose in three shuffles).
  __device__ unsigned bits_keys4(long long bh, int s, int ra, int rb, int c0) const {
    const int q = (threadIdx.x >> 2) & 3, i = c0 + (q & 1), j4 = ((q & 2) ? rb : ra) - q;
    unsigned to[4] = {0u, 0u, 0u, 0u};
#pragma unroll 1
    for (int nt = 0; nt < 8; ++nt) {
      u32 w[4];
      philox(seed, offset + (((u64)(bh + i + 8 * nt) * (u64)s + (u64)j4) >> 2), w);
#pragma unroll
      for (int k = 0; k < 4; ++k) to[k] |= keep(w[k]) << (4 * nt + q);
    }
    auto pick = [&](int k) { return k == 0 ? to[0] : k == 1 ? to[1] : k == 2 ? to[2] : to[3]; };
    return pick(q) | __shfl_xor_sync(0xffffffffu, pick(q ^ 1), 4) | __shfl_xor_sync(0xffffffffu, pick(q ^ 2), 8) |
           __shfl_xor_sync(0xffffffffu, pick(q ^ 3), 12);
  }

  __device__ __forceinline__ float factor(unsigned bits, int nt, int e) const {
    return (bits >> (4 * nt + e)) & 1u ? scale : 0.f;
  }
};

// Where a block and thread work: the block's tile of 64 rows, head and batch row; the thread's
// warp, lane, group g = lane / 4 and t = lane % 4 (its place in the mma fragments); the head's q, k, v
// in qkv (token stride rs), its offset in the [b, s, heads, d] tensors (token stride os) and in
// the [b, heads, s] rows of lse and D; its slice of the mask; r0, the warp's first row. The grid
// is (heads, batch, tiles), tiles slowest, so that blocks start tile by tile across all heads;
// `heavy_last` (causal forward and dq, where the last query tiles have the most keys) starts
// them from the last tile: the longest blocks first, the short ones fill the end of the grid.
struct Place {
  int tile, h, b, warp, lane, g, t, r0;
  long long rs, os, bh, ob;
  const __half *q, *k, *v;
  const unsigned char* mask;
  __device__ Place(const __half* qkv, const unsigned char* m, int s, int heads, int has_mask, long long mb,
                   long long mh, bool heavy_last) {
    h = blockIdx.x; b = blockIdx.y; tile = heavy_last ? gridDim.z - 1 - blockIdx.z : blockIdx.z;
    warp = threadIdx.x >> 5; lane = threadIdx.x & 31; g = lane >> 2; t = lane & 3;
    r0 = tile * ROWS + warp * 16;
    rs = (long long)heads * 3 * HD;
    os = (long long)heads * HD;
    bh = ((long long)b * heads + h) * s;
    ob = (long long)b * s * os + (long long)h * HD;
    q = qkv + (long long)b * s * rs + (long long)h * 3 * HD;
    k = q + HD;
    v = q + 2 * HD;
    mask = has_mask ? m + b * mb + h * mh : nullptr;
  }
};

// Whether a warp's 16 x 64 tile needs the element checks below: a user mask, rows or columns
// past the sequence, or causal scores above the diagonal (row i, column j masked when j > i; the
// tile spans rows [i0, i0 + 16) and columns [j0, j0 + 64), or the other way round in dkdv).
// Elsewhere the scores are used as they are.
__device__ __forceinline__ bool edge_tile(int has_mask, int causal, int s, int i0, int j0, bool rows_are_keys) {
  if (rows_are_keys) return has_mask || i0 + COLS > s || j0 + 16 > s || (causal && j0 + 15 > i0);
  return has_mask || j0 + COLS > s || i0 + 16 > s || (causal && j0 + COLS - 1 > i0);
}

// The loops over tiles overlap copies with arithmetic (FlashAttention-2's order): a tile's copy is
// started as soon as every warp is done with the buffer it goes to, and waited for just before
// its use.

// The forward: MT m-tiles of 16 queries per warp (FROWS = 64 MT queries per block), so that each
// K and V fragment read from shared memory serves MT tensor-core products, and each warp has MT
// independent tiles to work on while another waits (FlashAttention-2's 128-query blocks of 4
// warps). Warp w's m-tile mt holds queries (tile) FROWS + 64 mt + 16 w + [0, 16): under a causal
// mask without a user mask, the key tiles past m-tile mt's last query are skipped for it, by
// the whole block at once.
extern "C" __global__ void __launch_bounds__(128)
flash_fwd_m__M_TILES____hd__HEAD_SIZE__(const __half* __restrict__ qkv, const unsigned char* __restrict__ mask,
              __half* __restrict__ out, float* __restrict__ lse, int s, int heads, float scale, float fill, int causal,
              int has_mask, long long mb, long long mh, long long mq, long long mk, u64 seed, u64 offset, float drop_p,
              float keep_scale, const u64* __restrict__ rng_state) {
  __shared__ __align__(16) __half ks[COLS][PAD];
  __shared__ __align__(16) __half vs[COLS][PAD];
  const Place w(qkv, mask, s, heads, has_mask, mb, mh, causal && !has_mask);
  stream_position(rng_state, seed, offset);
  const Dropout dr = {seed, offset, drop_p, keep_scale};
  const int g = w.g, t = w.t, lane = w.lane;
  const int t0 = w.tile * FROWS, q0 = t0 + w.warp * 16;  // the block's first query; the warp's m-tile 0
  const long long rs = w.rs;
  const unsigned char* bm = w.mask;
  int row[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) row[mt][0] = q0 + 64 * mt + g, row[mt][1] = q0 + 64 * mt + g + 8;
  const float sl = scale * LOG2E, fl = fill * LOG2E;  // m, the scores and fill in log2 units
  const bool skip = causal && !has_mask;
  const int kend = skip ? min(s, t0 + FROWS) : s;
  load_tile(ks, w.k, rs, 0, s);
  cp_async_commit();
  unsigned qa[MT][KS][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) load_a(qa[mt], w.q, rs, q0 + 64 * mt, s, g, t);
  float o[MT][NT][4], m[MT][2], l[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) o[mt][nt][0] = o[mt][nt][1] = o[mt][nt][2] = o[mt][nt][3] = 0.f;
    m[mt][0] = m[mt][1] = NEG_INF;
    l[mt][0] = l[mt][1] = 0.f;
  }
  for (int k0 = 0; k0 < kend; k0 += COLS) {
    cp_async_wait_all();
    __syncthreads();  // this K tile is here; every warp is done with the last V tile
    load_tile(vs, w.v, rs, k0, s);
    cp_async_commit();
    // m-tiles [0, first) see none of these keys (causal: k0 is past their last query t0 + 64 mt + 63)
    const int first = (skip && k0 > t0) ? (k0 - t0) / 64 : 0;
    float z[MT][8][4];
    mma_rows_tm<MT>(z, qa, ks, lane, first);
    unsigned pa[MT][4][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      if (mt < first) continue;
      const bool edge = edge_tile(has_mask, causal, s, q0 + 64 * mt, k0, false);
      float mx[2] = {NEG_INF, NEG_INF};
#pragma unroll
      for (int nt = 0; nt < 8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int i = row[mt][e >> 1], j = k0 + nt * 8 + 2 * t + (e & 1);
          float val = z[mt][nt][e] * sl;
          if (edge) {
            if (j >= s) val = NEG_INF;  // no such key
            else if (i < s && masked(i, j, causal, bm, mq, mk)) val = fl;
          }
          z[mt][nt][e] = val;
          mx[e >> 1] = fmaxf(mx[e >> 1], val);
        }
      float alpha[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) {  // the row's max over the quad of threads that hold it
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
        const float mnew = fmaxf(m[mt][r], mx[r]);  // finite: key k0 < s exists and fill is finite
        alpha[r] = exp2f(m[mt][r] - mnew);
        m[mt][r] = mnew;
        l[mt][r] *= alpha[r];
      }
      const unsigned kb = dr.bits(w.bh, s, row[mt][0], row[mt][1], k0 + 2 * t, false);
#pragma unroll
      for (int nt = 0; nt < 8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {  // the row sum takes every probability, P @ V the kept ones
          const float p = exp2f(z[mt][nt][e] - m[mt][e >> 1]);
          l[mt][e >> 1] += p;
          z[mt][nt][e] = p * dr.factor(kb, nt, e);
        }
      pack_a(pa[mt], z[mt]);
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        o[mt][nt][0] *= alpha[0]; o[mt][nt][1] *= alpha[0];
        o[mt][nt][2] *= alpha[1]; o[mt][nt][3] *= alpha[1];
      }
    }
    cp_async_wait_all();
    __syncthreads();  // this V tile is here; every warp is done with this K tile
    if (k0 + COLS < kend) load_tile(ks, w.k, rs, k0 + COLS, s);
    cp_async_commit();
    mma_pa<MT>(o, pa, vs, lane, first);
  }
  __half* ob = out + w.ob;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float lr = l[mt][r];
      lr += __shfl_xor_sync(0xffffffffu, lr, 1);
      lr += __shfl_xor_sync(0xffffffffu, lr, 2);
      const int i = row[mt][r];
      if (i >= s) continue;
      const float inv = 1.f / lr;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
        *reinterpret_cast<unsigned*>(ob + i * w.os + nt * 8 + 2 * t) = pack2(o[mt][nt][2 * r] * inv,
                                                                             o[mt][nt][2 * r + 1] * inv);
      if (t == 0) lse[w.bh + i] = (m[mt][r] + log2f(lr)) * LN2;
    }
}

// dq = scale * sum_j ds_ij k_j with ds = p (dp - D), dp = dO v^T (times the dropout factor); also
// D = rowsum(dO * O)
extern "C" __global__ void __launch_bounds__(128, DQ_MIN_BLOCKS)
flash_dq__hd__HEAD_SIZE__(const __half* __restrict__ qkv, const unsigned char* __restrict__ mask, const __half* __restrict__ out,
             const __half* __restrict__ dout, const float* __restrict__ lse, float* __restrict__ dsum,
             __half* __restrict__ dqkv, int s, int heads, float scale, float fill, int causal, int has_mask, long long mb,
             long long mh, long long mq, long long mk, u64 seed, u64 offset, float drop_p, float keep_scale,
             const u64* __restrict__ rng_state) {
  __shared__ __align__(16) __half ks[COLS][PAD];
  __shared__ __align__(16) __half vs[COLS][PAD];
  const Place w(qkv, mask, s, heads, has_mask, mb, mh, causal && !has_mask);
  stream_position(rng_state, seed, offset);
  const Dropout dr = {seed, offset, drop_p, keep_scale};
  const int tile = w.tile, g = w.g, t = w.t, r0 = w.r0, lane = w.lane;  // the warp's 16 queries from r0
  const long long rs = w.rs, os = w.os, bh = w.bh;
  const unsigned char* bm = w.mask;
  const int row[2] = {r0 + g, r0 + g + 8};
  const float sl = scale * LOG2E, fl = fill * LOG2E;
  const int kend = (causal && !has_mask) ? min(s, (tile + 1) * ROWS) : s;
  load_tile(ks, w.k, rs, 0, s);
  load_tile(vs, w.v, rs, 0, s);
  cp_async_commit();
  unsigned qa[KS][4], ga[KS][4], oa[KS][4];
  load_a(qa, w.q, rs, r0, s, g, t);
  load_a(ga, dout + w.ob, os, r0, s, g, t);
  load_a(oa, out + w.ob, os, r0, s, g, t);
  // D: each thread's share of its two rows, summed over the quad that holds the whole rows
  float dd[2] = {0.f, 0.f};
#pragma unroll
  for (int kk = 0; kk < KS; ++kk)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float prod = lo_f(ga[kk][e]) * lo_f(oa[kk][e]) + hi_f(ga[kk][e]) * hi_f(oa[kk][e]);
      dd[e & 1] += prod;  // registers 0 and 2 hold row g, 1 and 3 row g + 8
    }
  float ll[2];  // lse in log2 units
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    dd[r] += __shfl_xor_sync(0xffffffffu, dd[r], 1);
    dd[r] += __shfl_xor_sync(0xffffffffu, dd[r], 2);
    ll[r] = row[r] < s ? lse[bh + row[r]] * LOG2E : 0.f;
    if (t == 0 && row[r] < s) dsum[bh + row[r]] = dd[r];
  }
  float dq[NT][4];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) dq[nt][0] = dq[nt][1] = dq[nt][2] = dq[nt][3] = 0.f;
  for (int k0 = 0; k0 < kend; k0 += COLS) {
    const bool more = k0 + COLS < kend;
    cp_async_wait_all();
    __syncthreads();  // these K and V tiles are here; every warp is done with the last K tile
    float p[8][4], dp[8][4];
    mma_rows_t(p, qa, ks, lane);
    mma_rows_t(dp, ga, vs, lane);
    __syncthreads();  // every warp is done with this V tile
    if (more) load_tile(vs, w.v, rs, k0 + COLS, s);
    cp_async_commit();
    const unsigned kb = dr.bits(bh, s, row[0], row[1], k0 + 2 * t, false);
    const bool edge = edge_tile(has_mask, causal, s, r0, k0, false);
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e >> 1, i = row[r], j = k0 + nt * 8 + 2 * t + (e & 1);
        float ds = 0.f;
        if (!edge) {
          ds = exp2f(p[nt][e] * sl - ll[r]) * (dp[nt][e] * dr.factor(kb, nt, e) - dd[r]);
        } else if (i < s && j < s) {
          const bool off = masked(i, j, causal, bm, mq, mk);
          const float pr = exp2f((off ? fl : p[nt][e] * sl) - ll[r]);
          ds = off ? 0.f : pr * (dp[nt][e] * dr.factor(kb, nt, e) - dd[r]);
        }
        p[nt][e] = ds;
      }
    mma_p_tile(dq, p, ks, lane);
    __syncthreads();  // every warp is done with this K tile
    if (more) load_tile(ks, w.k, rs, k0 + COLS, s);
    cp_async_commit();
  }
  __half* dqb = dqkv + (w.q - qkv);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (row[r] >= s) continue;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
      *reinterpret_cast<unsigned*>(dqb + row[r] * rs + nt * 8 + 2 * t) = pack2(dq[nt][2 * r] * scale, dq[nt][2 * r + 1] * scale);
  }
}

// Starts copying the lse and D of queries [i0, i0 + 64) into shared memory (zeros past s)
__device__ __forceinline__ void load_rows(float* ls, float* ds, const float* lse, const float* dsum, long long bh, int i0,
                                          int s) {
  const int c = threadIdx.x & (COLS - 1);
  const bool in = i0 + c < s;
  const long long at = bh + (in ? i0 + c : 0);
  if (threadIdx.x < COLS) cp_async4(&ls[c], lse + at, in);
  else cp_async4(&ds[c], dsum + at, in);
}

// dv = sum_i p_ij dO_i (the kept p), dk = scale * sum_i ds_ij q_i, for a tile of 64 keys (4 warps x
// 16). With FUSED_DQ the same pass also adds each query tile's dq = sum_j ds_ij k_j of these keys
// to dq_acc [b, heads, s, HD] in float32, with atomics (FlashAttention-2's backward): the block
// writes its ds (keys x queries) to shared memory, and warp w then multiplies queries 16 w + [0, 16)
// of it, as A fragments read transposed, by this key tile (kept in shared memory for the whole
// loop). This does 5 tile products per (key tile, query tile) where flash_dq + flash_dkdv do 7,
// but the float32 sums' order then depends on the blocks' timing: not bit for bit from run to run.
template <bool FUSED_DQ>
__device__ __forceinline__ void dkdv_body(const __half* __restrict__ qkv, const unsigned char* __restrict__ mask,
                                          const __half* __restrict__ dout, const float* __restrict__ lse,
                                          const float* __restrict__ dsum, __half* __restrict__ dqkv,
                                          float* __restrict__ dq_acc, int s, int heads, float scale, float fill,
                                          int causal, int has_mask, long long mb, long long mh, long long mq,
                                          long long mk, u64 seed, u64 offset, float drop_p, float keep_scale,
                                          const u64* __restrict__ rng_state) {
  __shared__ __align__(16) __half qs[COLS][PAD];
  __shared__ __align__(16) __half gs[COLS][PAD];
  __shared__ __align__(16) float ls[COLS], ds_[COLS];
  // FUSED_DQ: this block's keys (the B operand of dq) and its ds, [key][query] (a 1 x 1 dummy else)
  __shared__ __align__(16) __half kt[FUSED_DQ ? ROWS : 1][FUSED_DQ ? PAD : 1];
  __shared__ __align__(16) __half dst[FUSED_DQ ? ROWS : 1][FUSED_DQ ? COLS + 8 : 1];
  const Place w(qkv, mask, s, heads, has_mask, mb, mh, false);  // causal: the first key tiles are the longest
  stream_position(rng_state, seed, offset);
  const Dropout dr = {seed, offset, drop_p, keep_scale};
  const int tile = w.tile, g = w.g, t = w.t, r0 = w.r0, lane = w.lane;  // the warp's 16 keys from r0
  const long long rs = w.rs, os = w.os, bh = w.bh;
  const unsigned char* bm = w.mask;
  const __half* gb = dout + w.ob;
  const int key[2] = {r0 + g, r0 + g + 8};
  const float sl = scale * LOG2E, fl = fill * LOG2E;
  const int qstart = (causal && !has_mask) ? tile * ROWS : 0;  // earlier queries see none of these keys
  if constexpr (FUSED_DQ) load_tile(kt, w.k, rs, tile * ROWS, s);
  load_tile(qs, w.q, rs, qstart, s);
  load_tile(gs, gb, os, qstart, s);
  load_rows(ls, ds_, lse, dsum, bh, qstart, s);
  cp_async_commit();
  unsigned ka[KS][4], va[KS][4];
  load_a(ka, w.k, rs, r0, s, g, t);
  load_a(va, w.v, rs, r0, s, g, t);
  float dk[NT][4], dv[NT][4];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    dk[nt][0] = dk[nt][1] = dk[nt][2] = dk[nt][3] = 0.f;
    dv[nt][0] = dv[nt][1] = dv[nt][2] = dv[nt][3] = 0.f;
  }
  for (int i0 = qstart; i0 < s; i0 += COLS) {
    const bool more = i0 + COLS < s;
    cp_async_wait_all();
    __syncthreads();  // these Q and dO tiles, lse and D are here; every warp is done with the last ones (and ds)
    float p[8][4], dp[8][4];
    mma_rows_t(p, ka, qs, lane);  // scores transposed: [key, query]
    mma_rows_t(dp, va, gs, lane);
    const unsigned kb = dr.bits(bh, s, key[0], key[1], i0 + 2 * t, true);
    const bool edge = edge_tile(has_mask, causal, s, i0, r0, true);
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int c = nt * 8 + 2 * t + (e & 1), i = i0 + c, j = key[e >> 1];
        const float f = dr.factor(kb, nt, e);
        float pr = 0.f, ds = 0.f;
        if (!edge) {
          pr = exp2f(p[nt][e] * sl - ls[c] * LOG2E);
          ds = pr * (dp[nt][e] * f - ds_[c]);
        } else if (i < s && j < s) {
          const bool off = masked(i, j, causal, bm, mq, mk);
          pr = exp2f((off ? fl : p[nt][e] * sl) - ls[c] * LOG2E);
          ds = off ? 0.f : pr * (dp[nt][e] * f - ds_[c]);
        }
        p[nt][e] = pr * f;  // dv takes the kept probabilities
        dp[nt][e] = ds;
      }
    if constexpr (FUSED_DQ) {  // the warp's 16 rows of ds [key, query], rounded as dk's A fragments are
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) {
        *reinterpret_cast<unsigned*>(&dst[16 * w.warp + g][nt * 8 + 2 * t]) = pack2(dp[nt][0], dp[nt][1]);
        *reinterpret_cast<unsigned*>(&dst[16 * w.warp + g + 8][nt * 8 + 2 * t]) = pack2(dp[nt][2], dp[nt][3]);
      }
    }
    mma_p_tile(dv, p, gs, lane);
    __syncthreads();  // every warp is done with this dO tile (and has written its ds)
    if (more) load_tile(gs, gb, os, i0 + COLS, s);
    cp_async_commit();
    mma_p_tile(dk, dp, qs, lane);
    if constexpr (FUSED_DQ) {
      // queries i0 + 16 warp + [0, 16) x HD: ds [query, key] (A: ldmatrix.trans of dst [key, query],
      // matrices (keys +0, queries +0), (+0, +8), (+8, +0), (+8, +8) of each 16-key step) times kt
      const int lr = lane & 7, lm = lane >> 3, qw = 16 * w.warp;
      unsigned da[1][4][4];
#pragma unroll
      for (int j = 0; j < 4; ++j) ldsm_x4_t(da[0][j], &dst[16 * j + (lm >> 1) * 8 + lr][qw + (lm & 1) * 8]);
      float dq[1][NT][4];
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) dq[0][nt][0] = dq[0][nt][1] = dq[0][nt][2] = dq[0][nt][3] = 0.f;
      mma_pa<1>(dq, da, kt, lane, 0);
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int i = i0 + qw + g + 8 * r;
        if (i >= s) continue;
        float* row = dq_acc + (bh + i) * HD + 2 * t;
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          atomicAdd(row + nt * 8, dq[0][nt][2 * r]);
          atomicAdd(row + nt * 8 + 1, dq[0][nt][2 * r + 1]);
        }
      }
    }
    __syncthreads();  // every warp is done with this Q tile, lse and D (and with ds)
    if (more) {
      load_tile(qs, w.q, rs, i0 + COLS, s);
      load_rows(ls, ds_, lse, dsum, bh, i0 + COLS, s);
    }
    cp_async_commit();
  }
  __half* dkb = dqkv + (w.k - qkv);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (key[r] >= s) continue;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      *reinterpret_cast<unsigned*>(dkb + key[r] * rs + nt * 8 + 2 * t) = pack2(dk[nt][2 * r] * scale, dk[nt][2 * r + 1] * scale);
      *reinterpret_cast<unsigned*>(dkb + HD + key[r] * rs + nt * 8 + 2 * t) = pack2(dv[nt][2 * r], dv[nt][2 * r + 1]);
    }
  }
}

extern "C" __global__ void __launch_bounds__(128)
flash_dkdv__hd__HEAD_SIZE__(const __half* __restrict__ qkv, const unsigned char* __restrict__ mask,
               const __half* __restrict__ dout, const float* __restrict__ lse, const float* __restrict__ dsum,
               __half* __restrict__ dqkv, int s, int heads, float scale, float fill, int causal, int has_mask, long long mb,
               long long mh, long long mq, long long mk, u64 seed, u64 offset, float drop_p, float keep_scale,
               const u64* __restrict__ rng_state) {
  dkdv_body<false>(qkv, mask, dout, lse, dsum, dqkv, nullptr, s, heads, scale, fill, causal, has_mask, mb, mh, mq, mk,
                   seed, offset, drop_p, keep_scale, rng_state);
}

"""

# The fused backward's kernels, in the source of head sizes up to FUSED_MAX_HEAD_SIZE
_FUSED_SOURCE = r"""
// The fused backward's three kernels: flash_bwd_pre (D = rowsum(dO * O), and dq_acc zeroed), flash_bwd
// (dk, dv and the dq sums), flash_bwd_dq (dq = scale * dq_acc, rounded into dqkv). One thread per
// row of a head ([b, heads, s] rows).
// 16 (or 8) bytes in one access
struct alignas(16) Halves8 { unsigned w[4]; };
struct alignas(16) Floats4 { float f[4]; };
struct alignas(8) Halves4 { unsigned w[2]; };

extern "C" __global__ void __launch_bounds__(128)
flash_bwd_pre__hd__HEAD_SIZE__(const __half* __restrict__ out, const __half* __restrict__ dout, float* __restrict__ dsum,
                  float* __restrict__ dq_acc, int s, int heads, long long rows) {
  const long long row = (long long)blockIdx.x * blockDim.x + threadIdx.x;  // (b h) s + i
  if (row >= rows) return;
  const long long bh = row / s, i = row % s, b = bh / heads, h = bh % heads;
  const long long at = (b * s + i) * heads * HD + h * HD;  // [b, s, heads, HD]
  const Halves8* o = reinterpret_cast<const Halves8*>(out + at);
  const Halves8* go = reinterpret_cast<const Halves8*>(dout + at);
  float sum = 0.f;
#pragma unroll
  for (int c = 0; c < HD / 8; ++c) {
    const Halves8 a = o[c], d = go[c];
#pragma unroll
    for (int e = 0; e < 4; ++e) sum += lo_f(a.w[e]) * lo_f(d.w[e]) + hi_f(a.w[e]) * hi_f(d.w[e]);
  }
  dsum[row] = sum;
  Floats4* acc = reinterpret_cast<Floats4*>(dq_acc + row * HD);
  const Floats4 zero = {{0.f, 0.f, 0.f, 0.f}};
#pragma unroll
  for (int c = 0; c < HD / 4; ++c) acc[c] = zero;
}

extern "C" __global__ void __launch_bounds__(128)
flash_bwd__hd__HEAD_SIZE__(const __half* __restrict__ qkv, const unsigned char* __restrict__ mask,
              const __half* __restrict__ dout, const float* __restrict__ lse, const float* __restrict__ dsum,
              __half* __restrict__ dqkv, float* __restrict__ dq_acc, int s, int heads, float scale, float fill,
              int causal, int has_mask, long long mb, long long mh, long long mq, long long mk, u64 seed, u64 offset,
              float drop_p, float keep_scale, const u64* __restrict__ rng_state) {
  dkdv_body<true>(qkv, mask, dout, lse, dsum, dqkv, dq_acc, s, heads, scale, fill, causal, has_mask, mb, mh, mq, mk,
                  seed, offset, drop_p, keep_scale, rng_state);
}

extern "C" __global__ void __launch_bounds__(128)
flash_bwd_dq__hd__HEAD_SIZE__(const float* __restrict__ dq_acc, __half* __restrict__ dqkv, int s, int heads, float scale,
                 long long rows) {
  const long long row = (long long)blockIdx.x * blockDim.x + threadIdx.x;  // (b h) s + i
  if (row >= rows) return;
  const long long bh = row / s, i = row % s, b = bh / heads, h = bh % heads;
  const Floats4* acc = reinterpret_cast<const Floats4*>(dq_acc + row * HD);
  Halves4* dq = reinterpret_cast<Halves4*>(dqkv + (b * s + i) * heads * 3 * HD + h * 3 * HD);  // q's slot
#pragma unroll
  for (int c = 0; c < HD / 4; ++c) {
    const Floats4 a = acc[c];
    const Halves4 r = {{pack2(a.f[0] * scale, a.f[1] * scale), pack2(a.f[2] * scale, a.f[3] * scale)}};
    dq[c] = r;
  }
}
"""


def forward_m_tiles(head_size):
    """Query m-tiles of 16 rows per warp in the forward: 2 (128-query blocks, FlashAttention-2's)
    up to head size 64; above, the second tile's Q fragments and output accumulators would not fit
    in the 255 registers a thread has (tests/test_flash_attention.py checks that no kernel spills)."""
    return 2 if head_size <= 64 else 1


def source(head_size, m_tiles=None):
    """The CUDA source of the kernels for one head size (a multiple of 16, at most 128), the
    forward with `m_tiles` query m-tiles per warp (default: forward_m_tiles(head_size))."""
    if head_size not in HEAD_SIZES:
        raise ValueError(f"flash attention: head size {head_size} is not a multiple of 16 in [16, 128]")
    m_tiles = forward_m_tiles(head_size) if m_tiles is None else m_tiles
    if m_tiles not in (1, 2):
        raise ValueError(f"flash attention: {m_tiles} m-tiles per warp in the forward; 1 or 2")
    return _source_text(head_size, m_tiles)


@functools.lru_cache(maxsize=None)
def _source_text(head_size, m_tiles):
    """One string object per source: each launch looks its kernel up by this text
    (engine.kernels._cuda.raw_kernel), whose hash the object keeps, instead of building and
    hashing ~40 KB at every call."""
    text = _SOURCE + (_FUSED_SOURCE if head_size <= FUSED_MAX_HEAD_SIZE else "")
    return text.replace("__HEAD_SIZE__", str(head_size)).replace("__M_TILES__", str(m_tiles))


def backward_kernels(head_size):
    """The backward kernels in source(head_size), by the part of their name before __hd: dq and
    dkdv, and the fused backward's bwd_pre, bwd and bwd_dq up to FUSED_MAX_HEAD_SIZE."""
    return ("dq", "dkdv") + (("bwd_pre", "bwd", "bwd_dq") if head_size <= FUSED_MAX_HEAD_SIZE else ())


def forward_name(head_size, m_tiles=None):
    """The forward kernel's name in source(head_size, m_tiles)."""
    return f"flash_fwd_m{forward_m_tiles(head_size) if m_tiles is None else m_tiles}__hd{head_size}"


# The largest |fill| the kernels take. The backward recomputes p = exp(z - lse) from the row's
# log-sum-exp in float32; in a fully masked row lse = fill + log(s), and log(s) survives the
# rounding only while half an ulp of fill is small: below 2^15 it is at most 2^-10, so those rows'
# probabilities stay within 0.1% of 1 / s (at np.finfo(np.float32).min, a common fill, the
# log2-unit fill would not even be finite: -inf - -inf = NaN). Larger fills take the unfused core,
# which keeps the probabilities themselves.
MAX_FILL = 2.0 ** 15


def supports(dtype, head_size, fill):
    """Whether these kernels compute this attention: float16, a supported head size, |fill| below
    MAX_FILL."""
    return np.dtype(dtype) == np.float16 and head_size in HEAD_SIZES and abs(fill) < MAX_FILL


# ------------------------------------------------------------------ numpy references
def _scores(qkv4, mask, scale, fill, causal):
    """(q, k, v in float32 [b, heads, s, d], z: the scaled, masked scores [b, heads, s, s] in
    float32, off: where they are masked)."""
    d = qkv4.shape[-1] // 3
    q, k, v = (qkv4[..., i * d:(i + 1) * d].astype(np.float32).transpose(0, 2, 1, 3) for i in range(3))
    s = qkv4.shape[1]
    off = np.zeros((1, 1, s, s), bool)
    if causal:
        off = off | (np.arange(s)[None, :] > np.arange(s)[:, None])
    if mask is not None:
        off = off | mask
    z = np.where(off, np.float32(fill), (q @ k.transpose(0, 1, 3, 2)) * np.float32(scale))
    return q, k, v, z, np.broadcast_to(off, z.shape)


def keep_factors(shape, dropout):
    """The dropout factors [b, heads, s, s] (0 or 1 / (1 - p), float32) the kernels compute for
    `dropout` = (p, seed, offset): those of generator.random(shape) at (seed, offset); 1 for None."""
    if dropout is None:
        return np.float32(1.0)
    p, seed, offset = dropout
    return dropout_add.scaled_mask(shape, np.float16, p, seed, offset)


def forward_reference(qkv4, mask, scale, fill, causal, dropout=None):
    """(ctx [b, s, heads, d] in qkv's dtype, lse [b, heads, s] float32) of qkv4 [b, s, heads, 3d];
    `mask` bool broadcastable to [b, heads, s, s] or None; `dropout` (p, seed, offset) or None."""
    q, k, v, z, _ = _scores(qkv4, mask, scale, fill, causal)
    mx = z.max(-1, keepdims=True)
    e = np.exp(z - mx)
    l = e.sum(-1, keepdims=True)
    ctx = (e / l * keep_factors(z.shape, dropout)) @ v
    lse = (mx + np.log(l))[..., 0]
    return ctx.transpose(0, 2, 1, 3).astype(qkv4.dtype), lse.astype(np.float32)


def backward_reference(g4, qkv4, out4, lse, mask, scale, fill, causal, dropout=None, dsum=None):
    """(dqkv [b, s, heads, 3d] in qkv's dtype, D = rowsum(dO * O) [b, heads, s] float32) from the
    output gradient g4 and output out4 [b, s, heads, d] (or from D itself, when given). With
    dropout, D = rowsum(dO * O) is still sum_j p_ij dp_ij, dp being the gradient of the kept p."""
    dq_sums, dk, dv, dsum = backward_parts(g4, qkv4, out4, lse, mask, scale, fill, causal, dropout, dsum)
    dqkv = np.concatenate([t.transpose(0, 2, 1, 3) for t in (dq_sums * np.float32(scale), dk, dv)], axis=-1)
    return dqkv.astype(qkv4.dtype), dsum


def backward_parts(g4, qkv4, out4, lse, mask, scale, fill, causal, dropout=None, dsum=None):
    """backward_reference's pieces in float32, [b, heads, s, d] each: (sum_j ds_ij k_j, what the
    fused backward accumulates for dq before its scale; dk; dv; D [b, heads, s])."""
    q, k, v, z, off = _scores(qkv4, mask, scale, fill, causal)
    go = g4.astype(np.float32).transpose(0, 2, 1, 3)
    if dsum is None:
        dsum = (go * out4.astype(np.float32).transpose(0, 2, 1, 3)).sum(-1)
    p = np.exp(z - lse[..., None])
    keep = keep_factors(z.shape, dropout)
    dv = (p * keep).transpose(0, 1, 3, 2) @ go
    ds = np.where(off, np.float32(0), p * ((go @ v.transpose(0, 1, 3, 2)) * keep - dsum[..., None]))
    dk = ds.transpose(0, 1, 3, 2) @ q * np.float32(scale)
    return ds @ k, dk, dv, dsum.astype(np.float32)


# ------------------------------------------------------------------ CUDA launchers
def mask_strides(xp, mask, shape):
    """(mask as the kernels read it, its element strides (b, heads, i, j) broadcast to `shape`):
    a broadcast mask is read in place, never written out to the scores' size."""
    mask = xp.ascontiguousarray(unbroadcast(mask.reshape((1,) * (4 - mask.ndim) + tuple(mask.shape))))
    strides = [0 if n == 1 else st // mask.itemsize for n, st in zip(mask.shape, mask.strides)]
    for n, full in zip(mask.shape, shape):
        if n not in (1, full):
            raise ValueError(f"flash attention: mask of shape {list(mask.shape)} does not broadcast to {list(shape)}")
    return mask, strides


def _grid(s, heads, b, rows=ROWS):
    """One block per `rows` rows of each (batch row, head): (heads, batch, tiles), see Place."""
    return (heads, b, -(-s // rows))


def _tail(cp, mask, shape, scale, fill, causal, dropout, dummy):
    """The kernels' common trailing arguments: (mask or a dummy pointer, s, heads, scale, fill,
    causal, has_mask, the mask's four element strides, the dropout's seed, offset, p and 1 / (1 - p), and
    the device stream position of a draw captured in a CUDA graph or a null pointer: philox.state_arg)."""
    b, heads, s, _ = shape
    if mask is None:
        ptr, strides = dummy, (0, 0, 0, 0)
    else:
        ptr, strides = mask_strides(cp, mask, shape)
    p, seed, offset = dropout or (0.0, 0, 0)
    return ((ptr, i32(s), i32(heads), f32(scale), f32(fill), i32(causal), i32(mask is not None))
            + tuple(i64(t) for t in strides)
            + (np.uint64(seed & philox.MASK64), np.uint64(offset), f32(p), f32(dropout_add.keep_scale(p)),
               philox.state_arg(offset)))


def _aligned(cp, a):
    """`a` C-contiguous, its first element on a 16-byte boundary: the kernels copy rows of qkv and
    of the output gradient in 16-byte pieces (cp.async), which fault on a view that starts in the
    middle of its allocation; such a view is copied."""
    a = cp.ascontiguousarray(a)
    return a if a.data.ptr % 16 == 0 else a.copy()


def forward_cuda(qkv4, mask, scale, fill, causal, dropout=None, m_tiles=None):
    cp = backend.cupy()
    b, s, heads, d3 = qkv4.shape
    d = d3 // 3
    m_tiles = forward_m_tiles(d) if m_tiles is None else m_tiles
    qkv4 = _aligned(cp, qkv4)
    out = cp.empty((b, s, heads, d), np.float16)
    lse = cp.empty((b, heads, s), np.float32)
    m, *tail = _tail(cp, mask, (b, heads, s, s), scale, fill, causal, dropout, qkv4)
    raw_kernel(source(d, m_tiles), forward_name(d, m_tiles))(_grid(s, heads, b, ROWS * m_tiles), (THREADS,),
                                                             (qkv4, m, out, lse, *tail))
    return out, lse


def backward_cuda(g4, qkv4, out4, lse, mask, scale, fill, causal, dropout=None, fused=False):
    cp = backend.cupy()
    b, s, heads, d3 = qkv4.shape
    d = d3 // 3
    qkv4, g4, out4 = (_aligned(cp, a) for a in (qkv4, g4.astype(np.float16, copy=False), out4))
    dqkv = cp.empty(qkv4.shape, np.float16)
    dsum = cp.empty((b, heads, s), np.float32)
    m, *tail = _tail(cp, mask, (b, heads, s, s), scale, fill, causal, dropout, qkv4)
    src, grid = source(d), _grid(s, heads, b)
    if fused and d <= FUSED_MAX_HEAD_SIZE:
        rows = b * heads * s
        dq_acc = cp.empty((b, heads, s, d), np.float32)
        row_grid = (-(-rows // THREADS),)
        raw_kernel(src, f"flash_bwd_pre__hd{d}")(row_grid, (THREADS,), (out4, g4, dsum, dq_acc, i32(s), i32(heads),
                                                                          i64(rows)))
        raw_kernel(src, f"flash_bwd__hd{d}")(grid, (THREADS,), (qkv4, m, g4, lse, dsum, dqkv, dq_acc, *tail))
        raw_kernel(src, f"flash_bwd_dq__hd{d}")(row_grid, (THREADS,), (dq_acc, dqkv, i32(s), i32(heads), f32(scale),
                                                                         i64(rows)))
        return dqkv, dsum
    raw_kernel(src, f"flash_dq__hd{d}")(grid, (THREADS,), (qkv4, m, out4, g4, lse, dsum, dqkv, *tail))
    raw_kernel(src, f"flash_dkdv__hd{d}")(grid, (THREADS,), (qkv4, m, g4, lse, dsum, dqkv, *tail))
    return dqkv, dsum


# ------------------------------------------------------------------ dispatch
def flash_forward(qkv4, mask=None, scale=1.0, fill=-10000.0, causal=False, dropout=None, m_tiles=None):
    """(ctx [b, s, heads, d], lse [b, heads, s]) of qkv4 [b, s, heads, 3d] (see the module doc);
    `dropout`: (p, seed, offset) of the generator stream the probabilities' dropout draws from;
    `m_tiles`: the CUDA forward's query m-tiles per warp (None: forward_m_tiles; the benchmark
    times both)."""
    if isinstance(qkv4, np.ndarray):
        return forward_reference(qkv4, mask, scale, fill, causal, dropout)
    return forward_cuda(qkv4, mask, scale, fill, causal, dropout, m_tiles)


def flash_backward(g4, qkv4, out4, lse, mask=None, scale=1.0, fill=-10000.0, causal=False, dropout=None,
                   fused=False):
    """(dqkv [b, s, heads, 3d], D [b, heads, s]) from the output gradient g4 [b, s, heads, d]
    (`dropout` as the forward's: its factors are drawn again, not stored). `fused`: the CUDA
    backward as one pass over the key tiles that adds dq with float32 atomics (fewer products, not
    bit for bit from run to run) instead of the dq and dkdv kernels (see the module doc)."""
    if isinstance(qkv4, np.ndarray):
        return backward_reference(g4, qkv4, out4, lse, mask, scale, fill, causal, dropout)
    return backward_cuda(g4, qkv4, out4, lse, mask, scale, fill, causal, dropout, fused)
