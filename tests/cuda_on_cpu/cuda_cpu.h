// Just enough of CUDA to run a kernel's source on CPU threads (see __init__.py): one OS thread
// per CUDA thread, the blocks one after another. __syncthreads is a barrier over the block;
// __shfl_xor_sync and mma.sync.m16n8k16 are warp-wide exchanges through a per-warp board, in the
// PTX ISA's fragment layout. __shared__ variables are function statics: one copy, reused by each
// block in turn (the blocks never overlap).
#pragma once
#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <thread>
#include <vector>

struct dim3 {
  unsigned x = 1, y = 1, z = 1;
};
inline thread_local dim3 threadIdx;
inline dim3 blockIdx, blockDim, gridDim;

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __restrict__
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))
#define __launch_bounds__(...)
#define FLASH_MMA_EMULATED 1

typedef _Float16 __half;
inline float __half2float(__half h) { return (float)h; }
inline __half __float2half_rn(float f) { return (__half)f; }  // round to nearest even, as the GPU
inline unsigned short __half_as_ushort(__half h) { unsigned short u; std::memcpy(&u, &h, 2); return u; }
inline __half __ushort_as_half(unsigned short u) { __half h; std::memcpy(&h, &u, 2); return h; }
inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
inline int __float_as_int(float f) { int i; std::memcpy(&i, &f, 4); return i; }
using std::max;
using std::min;

namespace cuda_cpu {
struct Warp {
  std::barrier<> bar{32};
  uint64_t board[32][8];
};
inline std::barrier<>* block_barrier = nullptr;
inline std::vector<Warp*> warps;

inline int lane() { return threadIdx.x & 31; }
inline Warp& warp() { return *warps[threadIdx.x >> 5]; }

// Everyone posts `n` words, then reads; the second wait keeps the board until all have read.
template <typename F>
inline void exchange(const uint64_t* mine, int n, F&& read) {
  Warp& w = warp();
  std::memcpy(w.board[lane()], mine, n * sizeof(uint64_t));
  w.bar.arrive_and_wait();
  read(w.board);
  w.bar.arrive_and_wait();
}

inline void launch(dim3 grid, dim3 block, const std::function<void()>& body) {
  gridDim = grid;
  blockDim = block;
  const unsigned n = block.x * block.y * block.z;
  if (block.y != 1 || block.z != 1 || n % 32) throw "cuda_cpu: only 1-D blocks of whole warps";
  for (unsigned z = 0; z < grid.z; ++z)
    for (unsigned y = 0; y < grid.y; ++y)
      for (unsigned x = 0; x < grid.x; ++x) {
        blockIdx = {x, y, z};
        std::barrier<> bar(n);
        block_barrier = &bar;
        warps.clear();
        for (unsigned i = 0; i < n / 32; ++i) warps.push_back(new Warp);
        std::vector<std::thread> threads;
        for (unsigned i = 0; i < n; ++i)
          threads.emplace_back([&, i] {
            threadIdx = {i, 0, 0};
            body();
          });
        for (auto& t : threads) t.join();
        for (auto* w : warps) delete w;
        warps.clear();
      }
}
}  // namespace cuda_cpu

inline void __syncthreads() { cuda_cpu::block_barrier->arrive_and_wait(); }

template <typename T>
inline T __shfl_xor_sync(unsigned, T v, int mask) {
  static_assert(sizeof(T) <= 8, "shuffle of a word");
  uint64_t mine = 0, theirs = 0;
  std::memcpy(&mine, &v, sizeof(T));
  cuda_cpu::exchange(&mine, 1, [&](uint64_t (*board)[8]) { theirs = board[cuda_cpu::lane() ^ mask][0]; });
  T r;
  std::memcpy(&r, &theirs, sizeof(T));
  return r;
}

// mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32, from the PTX ISA's fragment tables:
// groupID = lane >> 2, tig = lane % 4; A: a0..a7 at rows g (i in 0,1,4,5) / g + 8, columns
// 2 tig + (i & 1) (+ 8 for i >= 4); B: b0..b3 at rows 2 tig + (i & 1) (+ 8 for i >= 2), column
// g; C/D: c0..c3 at rows g (i < 2) / g + 8, columns 2 tig + (i & 1). Registers hold their two
// float16 low half first.
inline void mma16816(float* c, const unsigned* a, const unsigned* b) {
  const uint64_t mine[6] = {a[0], a[1], a[2], a[3], b[0], b[1]};
  float A[16][16], B[16][8];
  cuda_cpu::exchange(mine, 6, [&](uint64_t (*board)[8]) {
    for (int l = 0; l < 32; ++l) {
      const int g = l >> 2, t = l & 3;
      for (int i = 0; i < 8; ++i) {
        const unsigned reg = (unsigned)board[l][i >> 1];
        const __half h = __ushort_as_half((unsigned short)(i & 1 ? reg >> 16 : reg & 0xffffu));
        const int row = (i < 2 || (i >= 4 && i < 6)) ? g : g + 8;
        const int col = 2 * t + (i & 1) + (i >= 4 ? 8 : 0);
        A[row][col] = (float)h;
      }
      for (int i = 0; i < 4; ++i) {
        const unsigned reg = (unsigned)board[l][4 + (i >> 1)];
        const __half h = __ushort_as_half((unsigned short)(i & 1 ? reg >> 16 : reg & 0xffffu));
        B[2 * t + (i & 1) + (i >= 2 ? 8 : 0)][g] = (float)h;
      }
    }
  });
  const int g = cuda_cpu::lane() >> 2, t = cuda_cpu::lane() & 3;
  for (int i = 0; i < 4; ++i) {
    const int row = i < 2 ? g : g + 8, col = 2 * t + (i & 1);
    float acc = 0.f;
    for (int k = 0; k < 16; ++k) acc += A[row][k] * B[k][col];  // products of float16 are exact in float
    c[i] += acc;
  }
}
