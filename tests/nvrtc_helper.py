"""Compile CUDA sources with NVRTC on a machine without a GPU (the fused kernels' CI check).

NVRTC and the CUDA runtime headers come from pip (nvidia-cuda-nvrtc-cu12,
nvidia-cuda-runtime-cu12, in the test extra); CuPy's own compile call needs a device to pick the
architecture, so this drives `cupy.cuda.nvrtc` directly with the engine's options and CuPy's
`-ftz=true`, down to sm_80 machine code (so the assembler checks inline PTX and register use).
"""
import pytest

from engine.kernels import _cuda


def nvrtc_compiler():
    """`compile(source, entries=()) -> log`: fails the test on a compile error or a missing
    `extern "C"` entry point; skips the test (with the reason) when NVRTC is not installed."""
    try:
        import cuda.pathfinder as pathfinder
        from cupy.cuda import nvrtc

        nvrtc.getVersion()
        include = pathfinder.find_nvidia_header_directory("cudart")
    except Exception as e:  # no NVRTC library or no CUDA headers
        pytest.skip(f"NVRTC or the CUDA headers are not installed (pip install nvidia-cuda-nvrtc-cu12 "
                    f"nvidia-cuda-runtime-cu12): {e}")
    if include is None:
        pytest.skip("the CUDA runtime headers are not installed (pip install nvidia-cuda-runtime-cu12)")

    def compile_(source, entries=()):
        prog = nvrtc.createProgram(source, "kernel.cu", [], [])
        try:
            nvrtc.compileProgram(prog, list(_cuda._OPTIONS) + ["-arch=sm_80", "-ftz=true", f"-I{include}"])
        except Exception:
            pytest.fail(f"{entries[0] if entries else 'kernel'}: {nvrtc.getProgramLog(prog)}")
        cubin = nvrtc.getCUBIN(prog)
        for name in entries:
            assert name.encode() in cubin, f"{name} is not an entry point of the compiled source"
        return nvrtc.getProgramLog(prog)

    return compile_
