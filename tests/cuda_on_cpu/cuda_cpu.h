// Just enough of CUDA to run a kernel's source on CPU threads (see __init__.py): one OS thread
// per CUDA thread, the blocks one after another. __syncthreads is a barrier over the block;
// __shfl_xor_sync, mma.sync.m16n8k16 and ldmatrix are warp-wide exchanges through a per-warp
// board, in the PTX ISA's fragment layout; cp.async reads its source when issued, fills its
// destination with NaN bytes at once and writes it only at the issuing thread's wait, so a read
// before the wait, or a copy into a buffer another warp still reads, shows as NaN. __shared__
// variables are function statics: one copy, reused by each block in turn (the blocks never
// overlap). A misused instruction (a misaligned address) is recorded and raised by the launcher
// in Python after the grid: a C++ throw on a CUDA thread's OS thread would end the process.
#pragma once
#include <algorithm>
#include <atomic>
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
inline dim3 blockIdx, blockDim, gridDim;  // blockIdx: set between blocks, when no thread runs

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __restrict__
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))
#define __launch_bounds__(...)
#define CUDA_ON_CPU 1  // kernel sources use it to replace inline PTX

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
inline std::atomic<const char*> first_error{nullptr};
inline void fail(const char* what) {
  const char* none = nullptr;
  first_error.compare_exchange_strong(none, what);
}
inline const char* take_error() { return first_error.exchange(nullptr); }

// This thread's cp.async copies not yet waited for: destination and the source bytes read at issue
struct Pending {
  void* dst;
  unsigned char bytes[16];
  int n;
};
inline thread_local std::vector<Pending> pending;

struct Warp {
  std::barrier<> bar{32};
  uint64_t board[32][8];
};
// The block being run: its barrier (__syncthreads) and its warps' exchange boards. A thread that
// leaves the kernel drops out of both, as an exited GPU thread stops counting at barriers.
struct Block {
  std::barrier<> bar;
  std::vector<Warp> warps;
  explicit Block(unsigned n) : bar(n), warps(n / 32) {}
};
inline Block* block = nullptr;

inline int lane() { return threadIdx.x & 31; }
inline Warp& warp() { return block->warps[threadIdx.x >> 5]; }

// Everyone posts `n` words, then reads; the second wait keeps the board until all have read.
template <typename F>
inline void exchange(const uint64_t* mine, int n, F&& read) {
  Warp& w = warp();
  std::memcpy(w.board[lane()], mine, n * sizeof(uint64_t));
  w.bar.arrive_and_wait();
  read(w.board);
  w.bar.arrive_and_wait();
}

// One OS thread per CUDA thread of a block, kept for the whole grid: the blocks run one after
// another (x fastest), each starting when every thread has left the previous one.
inline void launch(dim3 grid, dim3 block_dim, const std::function<void()>& body) {
  gridDim = grid;
  blockDim = block_dim;
  const unsigned n = block_dim.x * block_dim.y * block_dim.z;
  if (block_dim.y != 1 || block_dim.z != 1 || n % 32 || n > 1024) throw "cuda_cpu: only 1-D blocks of whole warps";
  const unsigned long long total = (unsigned long long)grid.x * grid.y * grid.z;
  unsigned long long next = 0;
  bool done = false;
  auto advance = [&]() noexcept {  // runs alone, between blocks
    delete block;
    block = nullptr;
    if (next == total) {
      done = true;
      return;
    }
    blockIdx = {unsigned(next % grid.x), unsigned(next / grid.x % grid.y), unsigned(next / grid.x / grid.y)};
    ++next;
    block = new Block(n);
  };
  advance();
  std::barrier between(n, advance);
  std::vector<std::thread> threads;
  for (unsigned i = 0; i < n; ++i)
    threads.emplace_back([&, i] {
      threadIdx = {i, 0, 0};
      while (!done) {
        body();
        pending.clear();  // copies never waited for end with the block, as its shared memory does
        block->warps[i >> 5].bar.arrive_and_drop();
        block->bar.arrive_and_drop();
        between.arrive_and_wait();
      }
    });
  for (auto& t : threads) t.join();
}
}  // namespace cuda_cpu

inline void __syncthreads() { cuda_cpu::block->bar.arrive_and_wait(); }

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

template <typename T>
inline T __shfl_down_sync(unsigned, T v, unsigned delta) {
  static_assert(sizeof(T) <= 8, "shuffle of a word");
  uint64_t mine = 0, theirs = 0;
  std::memcpy(&mine, &v, sizeof(T));
  cuda_cpu::exchange(&mine, 1, [&](uint64_t (*board)[8]) {
    const int src = cuda_cpu::lane() + (int)delta;
    theirs = board[src < 32 ? src : cuda_cpu::lane()][0];  // past the last lane: its own value
  });
  T r;
  std::memcpy(&r, &theirs, sizeof(T));
  return r;
}

inline unsigned __umulhi(unsigned a, unsigned b) { return (unsigned)(((unsigned long long)a * b) >> 32); }
inline double __longlong_as_double(long long i) { double d; std::memcpy(&d, &i, 8); return d; }
inline float rsqrtf(float v) { return 1.f / std::sqrt(v); }
inline double rsqrt(double v) { return 1.0 / std::sqrt(v); }
// sin(pi x), cos(pi x) in long double (the GPU's sincospi differs in the last ulps)
inline void sincospif(float x, float* s, float* c) {
  const long double a = 3.14159265358979323846264338327950288L * x;
  *s = (float)std::sin(a);
  *c = (float)std::cos(a);
}
inline void sincospi(double x, double* s, double* c) {
  const long double a = 3.14159265358979323846264338327950288L * x;
  *s = (double)std::sin(a);
  *c = (double)std::cos(a);
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

// ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16, from the PTX ISA: lanes 8i..8i+7 give the
// addresses of the 8 rows (8 halves, 16-byte aligned) of matrix i; lane l = 4 g + t gets in r[i]
// the pair (row g, columns 2t, 2t + 1) of matrix i, or with .trans (rows 2t, 2t + 1, column g),
// the lower-numbered element in the low half.
inline void ldmatrix_x4(unsigned* r, const __half* row, bool trans) {
  if (reinterpret_cast<uintptr_t>(row) % 16) cuda_cpu::fail("ldmatrix: a row address is not 16-byte aligned");
  const uint64_t mine = reinterpret_cast<uintptr_t>(row);
  const int g = cuda_cpu::lane() >> 2, t = cuda_cpu::lane() & 3;
  cuda_cpu::exchange(&mine, 1, [&](uint64_t (*board)[8]) {
    auto at = [&](int lane, int col) { return reinterpret_cast<const __half*>(board[lane][0])[col]; };
    for (int i = 0; i < 4; ++i) {
      const __half lo = trans ? at(8 * i + 2 * t, g) : at(8 * i + g, 2 * t);
      const __half hi = trans ? at(8 * i + 2 * t + 1, g) : at(8 * i + g, 2 * t + 1);
      r[i] = (unsigned)__half_as_ushort(lo) | ((unsigned)__half_as_ushort(hi) << 16);
    }
  });
}
inline void ldsm_x4(unsigned* r, const __half* row) { ldmatrix_x4(r, row, false); }
inline void ldsm_x4_t(unsigned* r, const __half* row) { ldmatrix_x4(r, row, true); }

// cp.async.{cg,ca}.shared.global with src-size 0 (zeros) or the full size; the destination holds
// NaN bytes until the issuing thread's cp.async.wait_group 0
template <int N>
inline void cp_async(void* dst, const void* src, bool full) {
  if (reinterpret_cast<uintptr_t>(dst) % N || reinterpret_cast<uintptr_t>(src) % N)
    cuda_cpu::fail("cp.async: an address is not aligned to the copy's size");
  cuda_cpu::Pending p{dst, {}, N};
  if (full) std::memcpy(p.bytes, src, N);
  std::memset(dst, 0xff, N);
  cuda_cpu::pending.push_back(p);
}
inline void cp_async16(void* dst, const void* src, bool full) { cp_async<16>(dst, src, full); }
inline void cp_async4(void* dst, const void* src, bool full) { cp_async<4>(dst, src, full); }
inline void cp_async_commit() {}
inline void cp_async_wait_all() {
  for (const cuda_cpu::Pending& p : cuda_cpu::pending) std::memcpy(p.dst, p.bytes, p.n);
  cuda_cpu::pending.clear();
}
