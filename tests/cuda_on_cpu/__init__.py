"""Run a CUDA kernel's own source on the CPU: a check of the kernel's logic (indexing, tiling,
masking, the warp-level data flow of tensor-core fragments) on a machine without a GPU.

`compile_kernels(source)` builds the source with g++ against cuda_cpu.h (a CUDA stand-in: each
CUDA thread of a block a fiber on the calling thread, resumed in a shuffled order at every
barrier, a random quarter of the warps held back each round; blocks run one after another;
__syncthreads a barrier; warp shuffles and `mma.sync.m16n8k16` emulated by warp-wide exchanges
in the PTX ISA's documented fragment layout; a deadlock reported, not hung) and returns a launcher per `extern "C" __global__` function:

    kernels = compile_kernels(src)
    kernels["name"](grid, block, (numpy arrays and numpy scalars in the kernel's order))

Arrays are passed by pointer (C-contiguous, their memory is the kernel's global memory); None
or np.uint64(0) is a null pointer; scalars must carry the kernel parameter's exact type, as CuPy needs them to.

What this does not check: the memory model beyond barriers and cp.async (threads switch only at
barriers and warp exchanges, so a race between two barriers shows only where the shuffled order
and the held-back warps run the reader first; a missing __syncwarp between lanes that the GPU
runs in lockstep), occupancy, register spills, bank conflicts, and the GPU's float details
(-ftz, expf's ulps): the kernels' real-GPU tests do (tests/test_fused_kernels_gpu.py).
"""
import ctypes
import hashlib
import os
import re
import shutil
import subprocess
import tempfile

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
_CACHE = os.path.join(tempfile.gettempdir(), "engine_cuda_on_cpu")
_DECL = re.compile(r'extern\s+"C"\s+__global__\s+void\s+(?:__launch_bounds__\([^)]*\)\s*)?(\w+)\s*\(([^)]*)\)')
_CTYPES = {"int": ctypes.c_int, "unsigned": ctypes.c_uint, "unsigned int": ctypes.c_uint, "u32": ctypes.c_uint,
           "long long": ctypes.c_longlong, "unsigned long long": ctypes.c_ulonglong, "u64": ctypes.c_ulonglong,
           "float": ctypes.c_float, "double": ctypes.c_double}
_NUMPY = {"int": np.int32, "unsigned": np.uint32, "unsigned int": np.uint32, "u32": np.uint32, "long long": np.int64,
          "unsigned long long": np.uint64, "u64": np.uint64, "float": np.float32, "double": np.float64}


_TYPEDEF = re.compile(r"\btypedef\s+([\w\s]+?)\s+(\w+)\s*;")


def _params(text, typedefs):
    """[(kind: the C type with typedefs resolved, or "pointer"; name; the C type as written, less
    its qualifiers)] of a parameter list."""
    out = []
    for p in filter(None, (p.strip() for p in text.split(","))):
        p = re.sub(r"\b(const|__restrict__)\b", " ", p)
        name = re.findall(r"\w+", p)[-1]
        ctype = kind = " ".join(p[:p.rindex(name)].split())
        while kind in typedefs:
            kind = typedefs[kind]
        out.append(("pointer" if "*" in kind else kind, name, ctype))
    return out


def compiler():
    cxx = shutil.which("g++")
    if cxx is None:
        pytest.skip("g++ is not installed: the CUDA sources cannot be run on the CPU")
    return cxx


# -O1: the kernels run at tests' sizes, where g++'s time dominates (-O2 took a third longer to
# build a flash-attention source, ~3.3 s, for no gain in the suite's run)
# -fno-gnu-unique: g++ otherwise gives a template function's static variables (the __shared__
# arrays of a templated kernel body) and inline variables a process-wide symbol (STB_GNU_UNIQUE)
# that every library loaded here would share, whatever their sizes in each source (a head size
# 16 library's shared tiles then served head size 32's: a segfault)
_FLAGS = ("-std=c++20", "-O1", "-shared", "-fPIC", "-fno-gnu-unique")
_loaded = {}
LAUNCHES = [0]  # kernels run from their source in this process


def compile_kernels(source):
    """{name: launch(grid, block, args)} for each extern "C" kernel of `source` (see the module doc)."""
    if source not in _loaded:
        _loaded[source] = _compile(source)
    return _loaded[source]


def _compile(source):
    typedefs = {name: " ".join(t.split()) for t, name in _TYPEDEF.findall(source)}
    decls = [(name, _params(params, typedefs)) for name, params in _DECL.findall(source)]
    if not decls:
        raise ValueError("no extern \"C\" __global__ function in the source")
    wrappers = []
    for name, params in decls:
        args = ", ".join(f"{'void*' if t == 'pointer' else t} a{i}" for i, (t, _, _) in enumerate(params))
        casts = ", ".join(f"({ctype})a{i}" if t == "pointer" else f"a{i}" for i, (t, _, ctype) in enumerate(params))
        wrappers.append(f'extern "C" void launch_{name}(unsigned gx, unsigned gy, unsigned gz, unsigned bx, {args}) '
                        f'{{ cuda_cpu::launch(dim3{{gx, gy, gz}}, dim3{{bx, 1, 1}}, [&] {{ {name}({casts}); }}); }}')
    wrappers.append('extern "C" const char* cuda_cpu_take_error() { return cuda_cpu::take_error(); }')
    text = source + "\n" + "\n".join(wrappers) + "\n"
    key = hashlib.sha256(" ".join([text, open(os.path.join(HERE, "cuda_cpu.h")).read(), *_FLAGS]).encode()).hexdigest()[:20]
    os.makedirs(_CACHE, exist_ok=True)
    lib_path = os.path.join(_CACHE, f"k{key}.so")
    if not os.path.exists(lib_path):
        work = tempfile.mkdtemp(dir=_CACHE)
        with open(os.path.join(work, "cuda_fp16.h"), "w") as f:  # the kernels' only include
            f.write(f'#include "{os.path.join(HERE, "cuda_cpu.h")}"\n')
        src = os.path.join(work, "kernels.cpp")
        with open(src, "w") as f:
            f.write('#include "cuda_fp16.h"\n' + text)
        tmp = os.path.join(work, "k.so")
        r = subprocess.run([compiler(), *_FLAGS, f"-I{work}", src, "-o", tmp], capture_output=True, text=True)
        if r.returncode:
            raise RuntimeError(f"g++ failed on the kernel source:\n{r.stderr[-6000:]}")
        os.replace(tmp, lib_path)  # atomic: a concurrent test process sees a whole library or none
        shutil.rmtree(work, ignore_errors=True)
    lib = ctypes.CDLL(lib_path)
    take_error = lib.cuda_cpu_take_error
    take_error.restype = ctypes.c_char_p
    return {name: _launcher(getattr(lib, f"launch_{name}"), name, params, take_error) for name, params in decls}


def _launcher(fn, name, params, take_error):
    fn.restype = None
    fn.argtypes = [ctypes.c_uint] * 4 + [ctypes.c_void_p if t == "pointer" else _CTYPES[t] for t, _, _ in params]

    def launch(grid, block, args):
        grid = tuple(grid) + (1,) * (3 - len(grid))
        if len(args) != len(params):
            raise TypeError(f"{name}: {len(params)} arguments, got {len(args)}")
        values = []
        for (t, pname, _), a in zip(params, args):
            if t == "pointer":
                if type(a) is np.uint64 and int(a) == 0:  # a null pointer, as CuPy is passed one
                    a = None
                if a is not None and not (isinstance(a, np.ndarray) and a.flags.c_contiguous):
                    raise TypeError(f"{name}: {pname} must be a C-contiguous numpy array, None or np.uint64(0)")
                values.append(None if a is None else a.ctypes.data)
            else:
                if not isinstance(a, _NUMPY[t]):
                    raise TypeError(f"{name}: {pname} is {t}, got {type(a).__name__} (pass numpy's exact type)")
                values.append(a.item())
        fn(*grid, block[0] if isinstance(block, tuple) else block, *values)
        LAUNCHES[0] += 1
        error = take_error()
        if error:  # recorded by a CUDA thread (cuda_cpu.h): a misused instruction
            raise RuntimeError(f"{name}: {error.decode()}")

    return launch
