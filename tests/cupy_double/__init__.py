"""A strict CuPy double: numpy underneath, CuPy's rules on top (see _double.py for the rules).

It exposes only names that the real CuPy wheel has (_names.py, generated from it): a real name
the double does not emulate raises NotImplementedError when called, a name CuPy lacks raises
AttributeError as CuPy would. Two ways to use it:
  * in one test: the fixture `cuda_double` (tests/conftest.py) calls `install()` for the test;
  * in a whole process: `tests/cupy_double/shim` first on sys.path makes `import cupy` the double
    (ENGINE_CUPY_DOUBLE=1 in tests/conftest.py, and in the environment of launched processes).
"""
import builtins
import sys
import types

import numpy as np

from . import _double
from ._double import ndarray, routine, ufunc, ufuncs
from ._kernels import ElementwiseKernel, RawKernel, RawModule, ReductionKernel
from ._names import NAMES, VERSION
from . import _rng as random_module
from . import _cuda as cuda

__version__ = VERSION + "+double"

_SPECIAL = {
    "ndarray": ndarray, "RawKernel": RawKernel, "RawModule": RawModule, "ElementwiseKernel": ElementwiseKernel,
    "ReductionKernel": ReductionKernel, "cuda": cuda, "random": random_module,
    "array": lambda obj, dtype=None, copy=True, order="K", subok=False, ndmin=0, blocking=False:
        _double.from_host(obj, dtype, copy, order, ndmin),
    "asarray": lambda a, dtype=None, order=None, *, blocking=False: _double.from_host(a, dtype, False, order or "K"),
    "asanyarray": lambda a, dtype=None, order=None: _double.from_host(a, dtype, False, order or "K"),
    "asnumpy": lambda a, stream=None, order="C", out=None, blocking=True:
        a.get(order=order, out=out) if isinstance(a, ndarray) else np.asarray(a, order=order),
    "get_array_module": lambda *args: (
        sys.modules[__name__] if builtins.any(isinstance(a, ndarray) for a in args) else np),
    "get_default_memory_pool": lambda: cuda.default_pool,
    "get_default_pinned_memory_pool": lambda: cuda.pinned_pool,
    "fuse": None,  # refused below: kernel fusion is not emulated
    # Thrust's sorts: stable, each a synchronisation (_double.SORTS)
    "argsort": _double.SORTS["argsort"], "sort": _double.SORTS["sort"], "lexsort": _double.SORTS["lexsort"],
    "unique": _double.SORTS["unique"],
    # CuPy's ravel_multi_index wraps out-of-range indices by default (numpy's raises)
    "ravel_multi_index": routine("ravel_multi_index", lambda multi_index, dims, mode="wrap", order="C":
                                 np.ravel_multi_index(multi_index, dims, mode=mode, order=order)),
}


def _namespace():
    """The module's public names: CuPy's, each emulated with numpy or refused when called."""
    ns = {}
    for name in NAMES["cupy"]:
        if name.startswith("__"):
            continue
        if name in _SPECIAL:
            ns[name] = _SPECIAL[name]
            continue
        obj = getattr(np, name, None)
        if isinstance(obj, np.ufunc):
            ns[name] = ufuncs[name] = ufunc(obj)
        elif isinstance(obj, type) or isinstance(obj, (int, float)) or obj is None and name == "newaxis":
            ns[name] = obj  # dtypes, scalar types, constants: CuPy re-exports numpy's
        elif callable(obj):
            ns[name] = routine(name, obj)
        else:
            ns[name] = _not_emulated(f"cupy.{name}")
    return ns


def _not_emulated(qualname):
    def refuse(*args, **kwargs):
        raise NotImplementedError(f"{qualname} exists in CuPy but the CuPy double does not emulate it")

    refuse.__name__ = qualname.rsplit(".", 1)[-1]
    return refuse


def _submodule(name, scope, real_to_numpy):
    """cupy.<name>: CuPy's names in `scope`, emulated with `real_to_numpy(name)` where it exists."""
    mod = types.ModuleType(f"{__name__}.{name}")
    for n in NAMES[scope]:
        if n.startswith("__"):
            continue
        obj = real_to_numpy(n)
        setattr(mod, n, routine(n, obj, scope) if callable(obj) else (obj if obj is not None else
                                                                       _not_emulated(f"{scope}.{n}")))
    mod.__getattr__ = _missing(scope)
    return mod


def _missing(scope):
    def __getattr__(name):
        raise AttributeError(f"module '{scope}' has no attribute '{name}' (not in real CuPy {VERSION})")

    return __getattr__


globals().update(_namespace())  # shadows builtins such as any/all/min: use builtins.* below
fuse = _not_emulated("cupy.fuse")
linalg = _submodule("linalg", "cupy.linalg", lambda n: getattr(np.linalg, n, None))
fft = _submodule("fft", "cupy.fft", lambda n: getattr(np.fft, n, None))
lib = types.ModuleType(f"{__name__}.lib")
lib.stride_tricks = _submodule("lib.stride_tricks", "cupy.lib.stride_tricks",
                               lambda n: getattr(np.lib.stride_tricks, n, None))


def _special_function(n):
    import scipy.special
    return getattr(scipy.special, n, None)


# cupy._core._routines_linalg: CuPy's private switch of the float32 matmul compute type (TF32),
# which engine.backends sets; the double records it
_core = types.ModuleType(f"{__name__}._core")
_core._routines_linalg = types.ModuleType(f"{__name__}._core._routines_linalg")
_compute_types = {}
_core._routines_linalg.set_compute_type = lambda dtype, compute_type: _compute_types.__setitem__(
    np.dtype(dtype), compute_type)
_core._routines_linalg.get_compute_type = lambda dtype: _compute_types.get(np.dtype(dtype), 1)

cupyx = types.ModuleType("cupyx")
cupyx.empty_pinned = _double.empty_pinned
cupyx.scipy = types.ModuleType("cupyx.scipy")
cupyx.scipy.special = _submodule("special", "cupyx.scipy.special", _special_function)
__getattr__ = _missing("cupy")

_MODULES = {"cupy": sys.modules[__name__], "cupy.cuda": cuda, "cupy.cuda.runtime": cuda.runtime,
            "cupy.random": random_module, "cupy.linalg": linalg, "cupy.fft": fft, "cupy.lib": lib,
            "cupy.lib.stride_tricks": lib.stride_tricks, "cupyx": cupyx, "cupyx.scipy": cupyx.scipy,
            "cupyx.scipy.special": cupyx.scipy.special, "cupy.cuda.nccl": cuda.nccl, "cupy._core": _core,
            "cupy._core._routines_linalg": _core._routines_linalg}


def install(modules=None):
    """Make `import cupy` (and cupyx.scipy.special) the double in sys.modules; returns what was
    there, for `uninstall`. `cupy.cuda.nccl` is NCCL's API over MPI (_nccl.py): each process of an
    mpiexec job is one GPU rank."""
    saved = {k: sys.modules.get(k) for k in _MODULES}
    for k, v in _MODULES.items():
        sys.modules[k] = v
    return saved


def uninstall(saved):
    for k, v in saved.items():
        if v is None:
            sys.modules.pop(k, None)
        else:
            sys.modules[k] = v
