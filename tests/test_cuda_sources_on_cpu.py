"""CI's run of the fused kernels' GPU tests (tests/test_fused_kernels_gpu.py) with each raw
kernel's own CUDA source compiled by g++ and run on CPU threads (tests/cuda_on_cpu), through the
CuPy double with CUPY_DOUBLE_RUN_SOURCES=1: the device code's arithmetic against the numpy
references, on a machine without a GPU. The sizes are the small ones of each test (a CPU thread
per CUDA thread is slow); ElementwiseKernels (bias + GELU), which CuPy generates, keep their
emulators."""
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
    "(philox and (-1] or -5] or -4099]))",
    "(cross_entropy and (-1- or -37-))",
    "multi_tensor_adam",
    "multi_tensor_grad_norm",
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
