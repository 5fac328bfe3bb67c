"""User kernels in the double: RawKernel, RawModule, ElementwiseKernel and ReductionKernel.

A launch is validated as a GPU would need it (geometry, contiguous arrays on the current device,
numpy-typed scalars) and then runs the CPU emulator registered for the kernel in
tests/cupy_double/kernel_emulators, on the memory a real kernel would see.

With CUPY_DOUBLE_RUN_SOURCES=1 a RawKernel runs its own CUDA source instead, compiled with g++
and run on CPU threads (tests/cuda_on_cpu), on the same memory: the kernels' GPU tests
(tests/test_fused_kernels_gpu.py) then check the device code's arithmetic against the numpy
references, not only the launches. ElementwiseKernel and ReductionKernel, whose code CuPy
generates, keep their emulators.
"""
import re

import numpy as np

from . import _double
from ._double import ndarray, stats


def _emulator(name, kind):
    from .kernel_emulators import EMULATORS, load_all
    if not EMULATORS:
        load_all()
    base = re.split(r"<|__", name, maxsplit=1)[0]
    fn = EMULATORS.get(base)
    if fn is None:
        raise NotImplementedError(f"the CuPy double has no CPU emulator for {kind} {name!r}; "
                                  "add one in tests/cupy_double/kernel_emulators")
    return fn


def _dims(value, what):
    dims = (value,) if isinstance(value, (int, np.integer)) else tuple(value)
    if not 1 <= len(dims) <= 3 or any(not isinstance(d, (int, np.integer)) or d < 1 for d in dims):
        raise ValueError(f"{what} must be 1 to 3 positive ints, got {value!r}")
    return tuple(int(d) for d in dims) + (1,) * (3 - len(dims))


class RawKernel:
    def __init__(self, code, name, options=(), backend="nvrtc", translate_cucomplex=False, *,
                 enable_cooperative_groups=False, jitify=False):
        if not isinstance(code, str) or f"{name}" not in code:
            raise ValueError(f"RawKernel: kernel {name!r} is not defined in the given source")
        self.code, self.name, self.options = code, name, tuple(options)

    def __call__(self, grid, block, args, *, shared_mem=0):
        grid, block = _dims(grid, "grid"), _dims(block, "block")
        if block[0] * block[1] * block[2] > 1024:
            raise ValueError(f"{self.name}: {block} is more than 1024 threads per block")
        if shared_mem > 48 * 1024:
            raise ValueError(f"{self.name}: {shared_mem} bytes of dynamic shared memory exceed 48 KiB")
        dev = _double.current_device()
        views = []
        for i, a in enumerate(args):
            if isinstance(a, ndarray):
                if a._dev != dev:
                    raise ValueError(f"{self.name}: argument {i} is on device {a._dev}, the launch on {dev}")
                if not a._a.flags.c_contiguous:
                    raise ValueError(f"{self.name}: argument {i} is not C-contiguous; a raw kernel would "
                                     "read its memory as if it were")
                views.append(a._a.reshape(-1))
            elif isinstance(a, np.generic):
                views.append(a)
            elif isinstance(a, np.ndarray):
                raise TypeError(f"{self.name}: argument {i} is a numpy array; raw kernels take device arrays")
            else:
                raise TypeError(f"{self.name}: argument {i} is a Python {type(a).__name__}; pass a numpy "
                                "scalar of the kernel's C type (np.int32, np.float32, ...)")
        if _double.RUN_SOURCES:
            from cuda_on_cpu import compile_kernels  # tests/ is on sys.path (pytest's pythonpath)
            kernel = compile_kernels(self.code)[self.name]
            run = lambda: kernel(grid, block, views)  # noqa: E731
        else:
            emulate, args = _emulator(self.name, "RawKernel"), (self.name, grid, block, tuple(views), shared_mem)
            run = lambda: emulate(*args)  # noqa: E731
        run()
        _double.record(run)
        stats.launches += 1
        stats.by_name[self.name] += 1
        stats.names.add("cupy.RawKernel")


class RawModule:
    def __init__(self, *, code=None, path=None, options=(), backend="nvrtc", translate_cucomplex=False,
                 enable_cooperative_groups=False, name_expressions=None, jitify=False):
        if code is None:
            raise NotImplementedError("RawModule(path=...) is not emulated by the CuPy double")
        self.code, self.options, self.name_expressions = code, options, name_expressions

    def get_function(self, name):
        return RawKernel(self.code if name.split("<")[0] in self.code else self.code + name, name, self.options)


def _count_params(params):
    return len([p for p in params.split(",") if p.strip()])


class ElementwiseKernel:
    def __init__(self, in_params, out_params, operation, name="kernel", reduce_dims=True, preamble="",
                 no_return=False, return_tuple=False, loop_prep="", after_loop=""):
        self.name, self.nin, self.nout = name, _count_params(in_params), _count_params(out_params)
        self.return_tuple = return_tuple

    def __call__(self, *args, size=None, block_size=None):
        if len(args) not in (self.nin, self.nin + self.nout):
            raise TypeError(f"{self.name}: wrong number of arguments ({len(args)}; {self.nin} inputs and "
                            f"{self.nout} outputs)")
        dev = _double.current_device()
        inputs = [_double.unwrap(a, dev, self.name) for a in args[: self.nin]]
        emulate = _emulator(self.name, "ElementwiseKernel")
        result = emulate(*inputs)
        stats.launches += 1
        results = result if isinstance(result, tuple) else (result,)
        if len(results) != self.nout:
            raise ValueError(f"emulator of {self.name} returned {len(results)} outputs, the kernel has {self.nout}")
        if len(args) > self.nin:
            outs = args[self.nin:]
            for o, r in zip(outs, results):
                o._a[...] = r
        else:
            outs = tuple(_double.wrap(np.asarray(r), dev) for r in results)
        dsts = [o._a for o in outs]
        _double.record(lambda: _double.refill(dsts, emulate(*inputs)))
        return outs if (self.return_tuple or self.nout > 1) else outs[0]


class ReductionKernel:
    def __init__(self, in_params, out_params, map_expr, reduce_expr, post_map_expr, identity, name="reduce_kernel",
                 reduce_type=None, reduce_dims=True, preamble="", options=()):
        self.name, self.nin = name, _count_params(in_params)

    def __call__(self, *args, out=None, axis=None, keepdims=False, stream=None):
        dev = _double.current_device()
        inputs = [_double.unwrap(a, dev, self.name) for a in args[: self.nin]]
        emulate = _emulator(self.name, "ReductionKernel")
        r = np.asarray(emulate(*inputs, axis=axis, keepdims=keepdims))
        stats.launches += 1
        result = out if out is not None else _double.wrap(r, dev)
        if out is not None:
            out._a[...] = r
        dst = result._a
        _double.record(lambda: _double.refill([dst], emulate(*inputs, axis=axis, keepdims=keepdims)))
        return result
