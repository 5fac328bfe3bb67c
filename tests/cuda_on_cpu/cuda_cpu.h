// Just enough of CUDA to run a kernel's source on the CPU (see __init__.py): each CUDA thread of
// a block is a fiber (its own stack) on the calling OS thread, and the blocks run one
// after another. A fiber runs until it waits: at __syncthreads (a barrier over the block) or at
// a warp-wide exchange (__shfl_xor_sync, mma.sync.m16n8k16 and ldmatrix, through a per-warp
// board, in the PTX ISA's fragment layout). The scheduler then resumes, in a shuffled order that
// changes every round (a fixed seed, so a failure reproduces), each fiber whose barrier has
// completed, but for the warps it holds back that round (a random quarter); a round where every live fiber waits on a barrier that cannot complete (a
// __syncthreads some threads never reach) is a deadlock, reported instead of hanging. Fibers
// switch in ~0.1 us where OS threads (one per CUDA thread, as this stand-in first used) paid a
// futex wake per thread at every barrier: the flash-attention kernels ran ~20x slower.
// cp.async reads its source when issued, fills its destination with NaN bytes at once and
// writes it only at the issuing thread's wait, so a read before the wait, or a copy into a
// buffer another warp still reads, shows as NaN. __shared__ variables are function statics: one
// copy, reused by each block in turn (the blocks never overlap). A misused instruction (a
// misaligned address) is recorded and raised by the launcher in Python after the grid: a C++
// throw cannot cross a fiber's entry.
#pragma once
// (few standard headers: parsing <atomic>, <functional>, <vector> and <algorithm> was two thirds
// of g++'s time on most kernel sources, and every test run on a fresh machine compiles ~20)
#include <cmath>
#include <cstdint>
#include <cstring>

#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

struct dim3 {
  unsigned x = 1, y = 1, z = 1;
};
inline dim3 threadIdx;  // the running fiber's, set by the scheduler at each switch
inline dim3 blockIdx, blockDim, gridDim;

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
template <typename T>
inline T max(T a, T b) { return a < b ? b : a; }  // as std::max
template <typename T>
inline T min(T a, T b) { return b < a ? b : a; }  // as std::min

namespace cuda_cpu {
inline const char* first_error = nullptr;  // (one OS thread runs every CUDA thread)
inline void fail(const char* what) {
  if (!first_error) first_error = what;
}
inline const char* take_error() {
  const char* e = first_error;
  first_error = nullptr;
  return e;
}

// A thread's cp.async copies not yet waited for: destination and the source bytes read at issue
struct Pending {
  void* dst;
  unsigned char bytes[16];
  int n;
};

// Switching between fibers. On x86-64: a stack switch that saves the callee-saved registers
// (swapcontext also saves and restores the signal mask, a system call at each switch that took
// half of a flash-attention test's time); elsewhere: ucontext.
#if defined(__x86_64__)
extern "C" void cuda_cpu_jump(void** save_sp, void* load_sp);
asm(".text\n.p2align 4\n.globl cuda_cpu_jump\n.hidden cuda_cpu_jump\n.type cuda_cpu_jump, @function\n"
    "cuda_cpu_jump:\n"
    "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
    "  movq %rsp, (%rdi)\n  movq %rsi, %rsp\n"
    "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n  ret\n"
    ".size cuda_cpu_jump, .-cuda_cpu_jump\n");
struct Context {
  void* sp = nullptr;
};
inline void jump(Context& from, Context& to) { cuda_cpu_jump(&from.sp, to.sp); }
// A context whose first jump enters `entry` (which must never return) at the top of `stack`:
// six zero registers for the pops, then `entry` for the ret, in a 16-byte aligned slot so
// that `entry` starts with the stack aligned as after a call
inline void prepare(Context& c, char* stack, size_t size, void (*entry)()) {
  auto* top = reinterpret_cast<uintptr_t*>(reinterpret_cast<uintptr_t>(stack + size) & ~uintptr_t(15));
  top[-1] = 0;  // entry's own return address (never used)
  top[-2] = reinterpret_cast<uintptr_t>(entry);
  for (int i = 3; i <= 8; ++i) top[-i] = 0;
  c.sp = top - 8;
}
#else
struct Context {
  ucontext_t uc;
};
inline void jump(Context& from, Context& to) { swapcontext(&from.uc, &to.uc); }
inline void prepare(Context& c, char* stack, size_t size, void (*entry)()) {
  getcontext(&c.uc);
  c.uc.uc_stack.ss_sp = stack;
  c.uc.uc_stack.ss_size = size;
  c.uc.uc_link = nullptr;
  makecontext(&c.uc, entry, 0);
}
#endif

struct Barrier;

constexpr unsigned kMaxThreads = 1024, kMaxPending = 64;

// A CUDA thread: its context, its pending copies, and the barrier phase it waits for (if any)
struct Fiber {
  Context ctx;
  Pending pending[kMaxPending];
  unsigned n_pending = 0;
  const Barrier* waiting = nullptr;
  unsigned long long phase = 0;
  bool finished = false;
};

inline Context scheduler;
inline Fiber fibers[kMaxThreads];
inline Fiber* current = nullptr;

// A barrier of `expected` threads, as std::barrier: the phase completes when all have arrived;
// a thread that leaves the kernel drops out (as an exited GPU thread stops counting at barriers)
struct Barrier {
  unsigned expected = 0, arrived = 0;
  unsigned long long phase = 0;
  void reset(unsigned n) {
    expected = n;
    arrived = 0;
  }
  void complete() {
    arrived = 0;
    ++phase;
  }
  void arrive_and_wait() {
    if (++arrived == expected) return complete();
    current->waiting = this;  // back to the scheduler until the phase completes
    current->phase = phase;
    jump(current->ctx, scheduler);
  }
  void arrive_and_drop() {
    --expected;
    if (arrived && arrived == expected) complete();
  }
  bool passed(unsigned long long p) const { return phase != p; }
};

struct Warp {
  Barrier bar;
  uint64_t board[32][8];
  // mma16816's operands, unpacked from the board once per exchange (by its first reader)
  float A[16][16], B[16][8];
  unsigned long long unpacked = ~0ull;  // the barrier phase they were unpacked in
};
// The block being run: its barrier (__syncthreads) and its warps' exchange boards
struct Block {
  Barrier bar;
  Warp warps[kMaxThreads / 32];
  void reset(unsigned n) {
    bar.reset(n);
    for (unsigned w = 0; w < n / 32; ++w) warps[w].bar.reset(32);
  }
};
inline Block block_state;
inline Block* block = &block_state;

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

// The kernel body of the running launch, type-erased (a lambda of the launch_<name> wrapper)
inline void* body_object = nullptr;
inline void (*body_call)(void*) = nullptr;

inline void fiber_main() {
  body_call(body_object);
  current->n_pending = 0;  // copies never waited for end with the block, as its shared memory does
  warp().bar.arrive_and_drop();
  block->bar.arrive_and_drop();
  current->finished = true;
  jump(current->ctx, scheduler);  // for good: a finished fiber is not resumed
}

// The fibers' stacks: one mapping, a guard page below each stack (an overflow faults), kept
// from launch to launch (a fresh mapping's pages are zeroed again at first touch)
struct Stacks {
  static constexpr size_t kStack = 256 << 10;
  size_t page = (size_t)sysconf(_SC_PAGESIZE), slot = kStack + page, count = 0;
  char* base = nullptr;
  void reserve(unsigned n) {
    if (n <= count) return;
    if (base) munmap(base, slot * count);
    base = (char*)mmap(nullptr, slot * n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (base == MAP_FAILED) throw "cuda_cpu: no memory for the threads' stacks";
    count = n;
    for (unsigned i = 0; i < n; ++i) mprotect(base + i * slot, page, PROT_NONE);
  }
  char* stack(unsigned i) const { return base + i * slot + page; }
};
inline Stacks stacks;

// Run one block on fibers[0, n): every fiber from the start of the body until all have left
// it. False on a deadlock (the launch records the error; the stuck fibers are abandoned).
inline bool run_block(unsigned n, uint64_t& seed) {
  unsigned order[kMaxThreads];
  for (unsigned i = 0; i < n; ++i) {
    Fiber& f = fibers[i];
    f.n_pending = 0;
    f.waiting = nullptr;
    f.finished = false;
    prepare(f.ctx, stacks.stack(i), Stacks::kStack, fiber_main);
    order[i] = i;
  }
  for (unsigned live = n; live;) {
    for (unsigned i = n - 1; i > 0; --i) {  // this round's order: a Fisher-Yates shuffle (xorshift)
      seed ^= seed << 13, seed ^= seed >> 7, seed ^= seed << 17;
      const unsigned j = seed % (i + 1), t = order[i];
      order[i] = order[j], order[j] = t;
    }
    // warps held back this round (a quarter of them, at random): so that warps drift apart
    // between barriers as a GPU's do, and a read of shared memory that another warp has not
    // written yet (a missing __syncthreads) reads stale data instead of arriving in lockstep
    seed ^= seed << 13, seed ^= seed >> 7, seed ^= seed << 17;
    const uint64_t held = seed & (seed >> 32);
    bool resumed = false, stalled = false;
    for (unsigned k = 0; k < n; ++k) {
      const unsigned i = order[k];
      Fiber& f = fibers[i];
      if (f.finished || (f.waiting && !f.waiting->passed(f.phase))) continue;
      if ((held >> (i >> 5)) & 1) {
        stalled = true;
        continue;
      }
      f.waiting = nullptr;
      current = &f;
      threadIdx = {i, 0, 0};
      resumed = true;
      jump(scheduler, f.ctx);
      live -= f.finished;
    }
    if (!resumed && !stalled) return false;  // every live fiber waits for a phase that cannot complete
  }
  return true;
}

// The grid's blocks one after another (x fastest), each on the same n fibers' stacks
template <typename F>
inline void launch(dim3 grid, dim3 block_dim, F body) {
  gridDim = grid;
  blockDim = block_dim;
  const unsigned n = block_dim.x * block_dim.y * block_dim.z;
  if (block_dim.y != 1 || block_dim.z != 1 || n % 32 || n > kMaxThreads) throw "cuda_cpu: only 1-D blocks of whole warps";
  const unsigned long long total = (unsigned long long)grid.x * grid.y * grid.z;
  stacks.reserve(n);
  body_object = &body;
  body_call = [](void* p) { (*static_cast<F*>(p))(); };
  uint64_t seed = 0x9E3779B97F4A7C15ull;
  for (unsigned long long b = 0; b < total; ++b) {
    blockIdx = {unsigned(b % grid.x), unsigned(b / grid.x % grid.y), unsigned(b / grid.x / grid.y)};
    block->reset(n);
    if (!run_block(n, seed)) {
      fail("deadlock: every running thread of a block waits at a barrier that the others never reach");
      break;
    }
  }
  current = nullptr;
  body_object = nullptr;
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
// One OS thread runs every fiber and fibers switch only at barriers and warp exchanges, so a
// read-modify-write is atomic as it stands (the blocks' order is fixed: the GPU's is not)
inline float atomicAdd(float* address, float v) {
  const float old = *address;
  *address = old + v;
  return old;
}
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
  cuda_cpu::Warp& w = cuda_cpu::warp();
  float acc[4];
  cuda_cpu::exchange(mine, 6, [&](uint64_t (*board)[8]) {
    if (w.unpacked != w.bar.phase) {  // the lanes read in the same phase: the first one unpacks
      w.unpacked = w.bar.phase;
      for (int l = 0; l < 32; ++l) {
        const int g = l >> 2, t = l & 3;
        for (int i = 0; i < 8; ++i) {
          const unsigned reg = (unsigned)board[l][i >> 1];
          const __half h = __ushort_as_half((unsigned short)(i & 1 ? reg >> 16 : reg & 0xffffu));
          const int row = (i < 2 || (i >= 4 && i < 6)) ? g : g + 8;
          const int col = 2 * t + (i & 1) + (i >= 4 ? 8 : 0);
          w.A[row][col] = (float)h;
        }
        for (int i = 0; i < 4; ++i) {
          const unsigned reg = (unsigned)board[l][4 + (i >> 1)];
          const __half h = __ushort_as_half((unsigned short)(i & 1 ? reg >> 16 : reg & 0xffffu));
          w.B[2 * t + (i & 1) + (i >= 2 ? 8 : 0)][g] = (float)h;
        }
      }
    }
    const int g = cuda_cpu::lane() >> 2, t = cuda_cpu::lane() & 3;
    for (int i = 0; i < 4; ++i) {
      const int row = i < 2 ? g : g + 8, col = 2 * t + (i & 1);
      float sum = 0.f;
      for (int k = 0; k < 16; ++k) sum += w.A[row][k] * w.B[k][col];  // products of float16 are exact in float
      acc[i] = sum;
    }
  });
  for (int i = 0; i < 4; ++i) c[i] += acc[i];
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
  cuda_cpu::Fiber& f = *cuda_cpu::current;
  if (f.n_pending == cuda_cpu::kMaxPending) return cuda_cpu::fail("cp.async: more copies pending in a thread than the stand-in keeps");
  f.pending[f.n_pending++] = p;
}
inline void cp_async16(void* dst, const void* src, bool full) { cp_async<16>(dst, src, full); }
inline void cp_async4(void* dst, const void* src, bool full) { cp_async<4>(dst, src, full); }
inline void cp_async_commit() {}
inline void cp_async_wait_all() {
  cuda_cpu::Fiber& f = *cuda_cpu::current;
  for (unsigned i = 0; i < f.n_pending; ++i) std::memcpy(f.pending[i].dst, f.pending[i].bytes, f.pending[i].n);
  f.n_pending = 0;
}
