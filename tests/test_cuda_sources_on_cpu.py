"""CI's run of the fused kernels' GPU tests (tests/test_fused_kernels_gpu.py) with each raw
kernel's own CUDA source compiled by g++ and run on CPU threads (tests/cuda_on_cpu), through the
CuPy double with CUPY_DOUBLE_RUN_SOURCES=1: the device code's arithmetic against the numpy
references, on a machine without a GPU. The sizes are the small ones of each test (a CPU thread
per CUDA thread is slow); ElementwiseKernels (GELU on strided operands), which CuPy generates,
keep their emulators."""
import os
import re
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
SMALL = " or ".join([
    "(layer_norm and (shape0 or shape1))",
    "(scale_mask_softmax and (shape0 or shape1))",
    "(flash_attention and shape0)",
    "(flash_attention and shape1 and 64 and 0.0-)",  # dropout at this size: test_flash_attention.py
    "bias_dropout_add",
    "bias_add",
    "test_add",
    "test_cast",
    "(bias_gelu and not strided and (16B-rows or odd-rows))",
    "(philox and (-1] or -5] or -4099]))",
    "(cross_entropy and (-1- or -37- or -64-))",
    "multi_tensor_adam",
    "multi_tensor_grad_norm",
    "multi_tensor_unscale",
    "loss_scale_update_kernel",
    "segment_add",
    "segment_store",
])


def test_fused_kernel_sources_match_their_references_on_cpu_threads(tmp_path):
    from cuda_on_cpu import compiler
    compiler()  # skips with the reason when g++ is missing
    env = dict(os.environ, ENGINE_CUPY_DOUBLE="1", CUPY_DOUBLE_RUN_SOURCES="1", CUPY_DOUBLE_REPORT=str(tmp_path / "n"),
               OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    env.pop("ENGINE_TEST_DEVICE", None)
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
           os.path.join(HERE, "test_fused_kernels_gpu.py"), "-k", SMALL]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1200, cwd=os.path.dirname(HERE))
    tail = proc.stdout[-3000:] + proc.stderr[-2000:]
    assert proc.returncode == 0, tail
    passed = int(re.search(r"(\d+) passed", proc.stdout).group(1))
    launches, from_source = map(int, (tmp_path / "n").read_text().split())
    print(f"fused kernel sources on CPU threads: {passed} tests passed, {from_source} of {launches} launches "
          "ran a kernel's CUDA source")
    assert passed >= 140 and from_source >= passed, tail  # every test ran at least one source


@pytest.mark.parametrize("kind", ["xor", "down"])
def test_the_stand_in_shuffles_as_a_warp_does(kind):
    """__shfl_xor_sync / __shfl_down_sync on the CPU stand-in: lane i gets lane i ^ m / i + d
    (its own value past the last lane), over two blocks of 64 threads."""
    import numpy as np

    from cuda_on_cpu import compile_kernels
    op = "__shfl_xor_sync(0xffffffffu, v, m)" if kind == "xor" else "__shfl_down_sync(0xffffffffu, v, m)"
    src = ('#include <cuda_fp16.h>\nextern "C" __global__ void k(float* out, int m) {\n'
           '  float v = blockIdx.x * 1000 + threadIdx.x;\n'
           f'  out[blockIdx.x * blockDim.x + threadIdx.x] = {op};\n}}\n')
    kernel = compile_kernels(src)["k"]
    for m in (1, 2, 5, 16):
        out = np.full(128, np.nan, np.float32)
        kernel((2,), (64,), (out, np.int32(m)))
        lane = np.arange(128) % 32
        src_lane = lane ^ m if kind == "xor" else np.where(lane + m < 32, lane + m, lane)
        want = (np.arange(128) // 64) * 1000 + (np.arange(128) // 32 % 2) * 32 + src_lane
        np.testing.assert_array_equal(out, want.astype(np.float32))


_LDMATRIX = r'''#include <cuda_fp16.h>
extern "C" __global__ void k(float* out, int trans) {
  __shared__ __align__(16) __half m[32][8];  // matrix i = rows 8i .. 8i + 7, each row 16 bytes
  for (int c = 0; c < 8; ++c) m[threadIdx.x][c] = __float2half_rn(100.f * (threadIdx.x / 8) + 10.f * (threadIdx.x % 8) + c);
  __syncthreads();
  unsigned r[4];
  if (trans) ldsm_x4_t(r, &m[threadIdx.x][0]);
  else ldsm_x4(r, &m[threadIdx.x][0]);
  for (int i = 0; i < 4; ++i) {
    out[threadIdx.x * 8 + 2 * i] = __half2float(__ushort_as_half((unsigned short)(r[i] & 0xffffu)));
    out[threadIdx.x * 8 + 2 * i + 1] = __half2float(__ushort_as_half((unsigned short)(r[i] >> 16)));
  }
}
'''


@pytest.mark.parametrize("trans", [False, True])
def test_the_stand_in_ldmatrix_gives_each_lane_its_pairs(trans):
    """ldmatrix.x4 on the CPU stand-in, against the PTX ISA's layout: lanes 8i..8i+7 address the
    rows of matrix i; lane l = 4g + t gets, of each matrix, (row g, columns 2t, 2t + 1), or with
    .trans (rows 2t, 2t + 1, column g)."""
    import numpy as np

    from cuda_on_cpu import compile_kernels
    out = np.full(32 * 8, np.nan, np.float32)
    compile_kernels(_LDMATRIX)["k"]((1,), (32,), (out, np.int32(trans)))
    want = np.empty((32, 4, 2), np.float32)
    for lane in range(32):
        g, t = divmod(lane, 4)
        for i in range(4):
            for h in range(2):
                row, col = (2 * t + h, g) if trans else (g, 2 * t + h)
                want[lane, i, h] = 100 * i + 10 * row + col
    np.testing.assert_array_equal(out.reshape(32, 4, 2), want)


_CP_ASYNC = r"""#include <cuda_fp16.h>
extern "C" __global__ void k(const float* src, float* before, float* after, int misuse) {
  __shared__ __align__(16) float buf[36];
  const int t = threadIdx.x;
  cp_async4(&buf[t], &src[t], t % 2 == 0);  // odd threads: src-size 0, zeros
  cp_async_commit();
  before[t] = buf[t];  // not waited for: NaN on the stand-in, anything on a GPU
  cp_async_wait_all();
  __syncthreads();
  after[t] = buf[(t + 1) % 32];
  unsigned r[4];
  if (misuse == 1) cp_async16(&buf[1], src, true);  // 4 bytes past a 16-byte boundary
  if (misuse == 2) ldsm_x4(r, reinterpret_cast<const __half*>(&buf[1]));
  cp_async_wait_all();
}
"""


def test_the_stand_in_cp_async_writes_at_the_wait_and_reports_misuse():
    """cp.async on the CPU stand-in: the destination holds NaN until the issuing thread waits (a
    kernel that reads it earlier, or copies into a buffer another warp still reads, gets NaN);
    src-size 0 gives zeros; a misaligned cp.async or ldmatrix raises in Python, naming the kernel,
    instead of ending the process."""
    import numpy as np

    from cuda_on_cpu import compile_kernels
    kernel = compile_kernels(_CP_ASYNC)["k"]
    src = np.arange(1, 33, dtype=np.float32)
    before, after = np.zeros(32, np.float32), np.zeros(32, np.float32)
    kernel((1,), (32,), (src, before, after, np.int32(0)))
    assert np.isnan(before).all()
    nxt = (np.arange(32) + 1) % 32
    np.testing.assert_array_equal(after, np.where(nxt % 2 == 0, src[nxt], 0))
    with pytest.raises(RuntimeError, match="^k: cp.async: an address is not aligned to the copy's size$"):
        kernel((1,), (32,), (src, before, after, np.int32(1)))
    with pytest.raises(RuntimeError, match="^k: ldmatrix: a row address is not 16-byte aligned$"):
        kernel((1,), (32,), (src, before, after, np.int32(2)))
    kernel((1,), (32,), (src, before, after, np.int32(0)))  # each error was taken: this launch is clean


_NEIGHBOUR = r"""#include <cuda_fp16.h>
extern "C" __global__ void k(float* out, int sync) {
  __shared__ float buf[128];
  buf[threadIdx.x] = blockIdx.x * 1000 + threadIdx.x;
  if (sync) __syncthreads();
  out[blockIdx.x * blockDim.x + threadIdx.x] = buf[(threadIdx.x + 1) % blockDim.x];
}
"""


def test_the_stand_in_shows_a_missing_syncthreads():
    """The CUDA threads of a block run as fibers in an order shuffled at every barrier: a read of
    a neighbour's shared-memory write without __syncthreads between them gets the stale value for
    some threads (here every run: the order comes from a fixed seed), and with the barrier all
    read the new values."""
    import numpy as np

    from cuda_on_cpu import compile_kernels
    kernel = compile_kernels(_NEIGHBOUR)["k"]
    want = (np.arange(3)[:, None] * 1000 + (np.arange(128) + 1) % 128).reshape(-1).astype(np.float32)
    out = np.zeros(3 * 128, np.float32)
    kernel((3,), (128,), (out, np.int32(1)))
    np.testing.assert_array_equal(out, want)
    kernel((3,), (128,), (out, np.int32(0)))
    stale = (out != want).reshape(3, 128).sum(axis=1)
    assert (stale > 0).all() and (stale < 128).all(), stale  # some threads read too early in each block


# Each warp writes its slot after one shuffle and reads the next warp's after a second one: every
# warp passes the same warp exchanges, so in lockstep the writes would always come first
_DRIFT = r"""#include <cuda_fp16.h>
extern "C" __global__ void k(float* out, int sync) {
  __shared__ float slot[4];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (lane == 0) slot[warp] = -1.f;
  __syncthreads();
  float v = __shfl_xor_sync(0xffffffffu, (float)lane, 1);
  if (lane == 0) slot[warp] = blockIdx.x * 10 + warp;
  v += __shfl_xor_sync(0xffffffffu, v, 2);
  if (sync) __syncthreads();
  if (lane == 0) out[blockIdx.x * 4 + warp] = slot[(warp + 1) % 4];
}
"""


def test_the_stand_in_lets_warps_drift_apart_between_barriers():
    """Warps held back at random rounds: a warp that reads another's shared-memory write after the
    same number of warp exchanges, without a barrier, sometimes finds it not yet written (here in
    some of 64 blocks: the seed is fixed), and with the barrier never."""
    import numpy as np

    from cuda_on_cpu import compile_kernels
    kernel = compile_kernels(_DRIFT)["k"]
    want = (np.arange(64)[:, None] * 10 + (np.arange(4) + 1) % 4).reshape(-1).astype(np.float32)
    out = np.zeros(64 * 4, np.float32)
    kernel((64,), (128,), (out, np.int32(1)))
    np.testing.assert_array_equal(out, want)
    kernel((64,), (128,), (out, np.int32(0)))
    stale = int((out == -1).sum())
    assert 0 < stale < out.size and set(np.unique(out[out != want])) == {-1.0}, stale


_DEADLOCK = r"""#include <cuda_fp16.h>
extern "C" __global__ void k(float* out, int diverge) {
  float v = threadIdx.x;
  if (diverge && threadIdx.x < 16) v = __shfl_xor_sync(0xffffffffu, v, 1);  // half a warp
  else __syncthreads();
  out[threadIdx.x] = v;
}
"""


def test_the_stand_in_reports_a_deadlock_instead_of_hanging():
    """Half a warp at a shuffle and the other half at __syncthreads wait for each other forever
    (undefined on a GPU): the launch raises, naming the kernel, and the next launch runs."""
    import numpy as np

    from cuda_on_cpu import compile_kernels
    kernel = compile_kernels(_DEADLOCK)["k"]
    out = np.zeros(64, np.float32)
    with pytest.raises(RuntimeError, match="^k: deadlock: every running thread of a block waits at a barrier"):
        kernel((2,), (64,), (out, np.int32(1)))
    kernel((2,), (64,), (out, np.int32(0)))
    np.testing.assert_array_equal(out, np.arange(64, dtype=np.float32))


def test_a_captured_draw_reads_its_stream_position_from_device_memory():
    """The draw kernels' own sources on CPU threads with a stream-state pointer (a draw captured in
    a CUDA graph, engine/cuda_graphs.py): the seed and base offset come from that memory and the
    offset passed is added to the base, so the numbers are those of (state seed, base + offset);
    a null pointer keeps the passed position. The Philox draw, bias + dropout + add and flash
    attention's dropout (forward and backward)."""
    import numpy as np

    from cuda_on_cpu import compile_kernels
    from engine.kernels import dropout_add, philox
    from engine.kernels import flash_attention as fa

    seed, base, place = 2 ** 40 + 7, 1234, 5
    state = np.array([seed, base], np.uint64)
    bits = compile_kernels(philox.SOURCE)["engine_philox_bits"]
    for ptr, want in ((state, philox.reference("bits", 37, seed, base + place)),
                      (np.uint64(0), philox.reference("bits", 37, 99, place))):
        out = np.zeros(37, np.uint32)
        bits((2,), (32,), (out, np.uint64(37), np.uint64(99), np.uint64(place), ptr))
        np.testing.assert_array_equal(out, want)

    x = np.random.default_rng(0).standard_normal((6, 10)).astype(np.float32)
    kernel = compile_kernels(dropout_add.SOURCE)["engine_bias_dropout_add__float"]
    y = np.full_like(x, np.nan)
    kernel((4,), (32,), (x, x, x, y, np.uint64(x.size), np.int32(10), np.uint64(0), np.uint64(place), state,
                         np.float64(0.4), np.float64(dropout_add.keep_scale(0.4)), np.int32(0), np.int32(1)))
    np.testing.assert_array_equal(y, dropout_add.bias_dropout_add_reference(x, None, x, 0.4, seed, base + place))

    b, s, heads, d = 1, 40, 2, 16
    rng = np.random.default_rng(1)
    qkv = (rng.standard_normal((b, s, heads, 3 * d)) * 1.5).astype(np.float16)
    g = rng.standard_normal((b, s, heads, d)).astype(np.float16)
    dropout = (0.3, seed, base + place)  # what the kernels must draw
    tail = list(fa._tail(np, None, (b, heads, s, s), 0.3, -10000.0, True, (0.3, 0, place), qkv))
    tail[-1] = state  # the captured draw's position: in device memory
    kernels = compile_kernels(fa.source(d))
    out = np.full((b, s, heads, d), np.nan, np.float16)
    lse = np.full((b, heads, s), np.nan, np.float32)
    kernels[fa.forward_name(d)](fa._grid(s, heads, b, fa.ROWS * fa.forward_m_tiles(d)), (fa.THREADS,),
                                (qkv, tail[0], out, lse, *tail[1:]))
    want_out, want_lse = fa.forward_reference(qkv, None, 0.3, -10000.0, True, dropout)
    rel = np.linalg.norm(out.astype(np.float64) - want_out) / np.linalg.norm(want_out.astype(np.float64))
    assert rel < 2e-3, rel
    dqkv = np.full(qkv.shape, np.nan, np.float16)
    dsum = np.full((b, heads, s), np.nan, np.float32)
    grid = fa._grid(s, heads, b)
    kernels[f"flash_dq__hd{d}"](grid, (fa.THREADS,), (qkv, tail[0], out, g, lse, dsum, dqkv, *tail[1:]))
    kernels[f"flash_dkdv__hd{d}"](grid, (fa.THREADS,), (qkv, tail[0], g, lse, dsum, dqkv, *tail[1:]))
    want, _ = fa.backward_reference(g, qkv, out, lse, None, 0.3, -10000.0, True, dropout)
    rel = np.linalg.norm(dqkv.astype(np.float64) - want) / np.linalg.norm(want.astype(np.float64))
    assert rel < 2e-3, rel
