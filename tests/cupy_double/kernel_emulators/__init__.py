"""CPU emulations of the engine's CUDA kernels, for the strict CuPy double (tests/cupy_double).

A raw kernel cannot run without a GPU; the double hands its launch to the emulator registered
under the kernel's base name (its name before any `<` or `__`). An emulator sees what the real
kernel sees: flat 1-D numpy views of each array argument's memory (writes go to the device
array) and the scalar arguments, and it checks that the grid and block cover the work the kernel
assumes, so a launcher that passes wrong sizes, strides or geometry fails here as it would on a
GPU. Its arithmetic comes from the kernel's numpy reference in engine/kernels.

Raw kernels:     EMULATORS[base](name, grid, block, args, shared_mem) -> None (writes in place)
Elementwise:     EMULATORS[name](*inputs) -> output array or tuple of them
Reduction:       EMULATORS[name](*inputs, axis=..., keepdims=...) -> output array
"""
import importlib
import pkgutil

EMULATORS = {}


def emulates(name):
    def register(fn):
        if name in EMULATORS:
            raise ValueError(f"two emulators for kernel {name!r}")
        EMULATORS[name] = fn
        return fn

    return register


def load_all():
    for info in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{info.name}")
