"""Compiled CPU kernels through numba, for the few hot loops numpy cannot fuse.

Why: a kernel written in numpy makes one pass over memory per operation. layer_norm over rows of
96 is seven passes (mean, subtract, square-sum, scale, weight, bias, ...) and cost 2.2 ms forward
on a [16384, 96] array where PyTorch's fused kernel takes 0.4 ms; the same math compiled as one
loop over each row (two reads of the row while it is in cache, one write) takes 1.0 ms.

How: `kernel(fn)` compiles `fn` with numba at its first call (`nogil`, so the engine's own thread
pool runs blocks of rows side by side exactly as for numpy kernels; no second thread pool) and
caches the machine code on disk (next to the source, or numba's user cache folder where that is
read-only), so only the first run on a machine pays the compile (~1 s per kernel and dtype).
numba itself is imported then too, not with the engine (it takes ~0.4 s). Floating-point
contraction and reassociation are allowed (vectorised sums); infinities and nan keep their
IEEE meaning. Division follows numpy's error model (x / 0 is inf, as in the numpy kernels):
numba's default raises ZeroDivisionError, and that check keeps LLVM from vectorising any loop
that divides.

Kernels that call compiled helpers (a vectorisable exp, a bit cast) live in modules that import
numba at their top; `kernel("package.module:function")` names such a function, and the module
is imported at the first call like numba itself.

Vector width: on CPUs with AVX-512, LLVM's tuning for most Intel server parts prefers 256-bit
vectors; the exp-heavy kernels run ~1.4x faster with 512-bit ones (exact GELU on 64K floats,
one thread: 0.84 -> 0.56 ns/element), so the engine asks for them unless NUMBA_CPU_FEATURES is
already set by the user.

Off switch: `ENGINE_JIT=0`, or numba not installed: `kernel` returns None and the callers run
their numpy kernels, which stay the reference the compiled ones are tested against
(tests/test_jit_kernels.py).
"""
import importlib
import importlib.util
import os
import threading

from ._native import switched_off

_FASTMATH = frozenset({"reassoc", "contract", "nsz"})  # not nnan/ninf: nan and inf propagate

if switched_off("ENGINE_JIT"):
    _why_not = "turned off by ENGINE_JIT=0"
elif importlib.util.find_spec("numba") is None:
    _why_not = "numba is not installed"
else:
    _why_not = None


def available():
    return _why_not is None


def why_unavailable():
    return _why_not or ""


def _prefer_512_bit_vectors():
    """Ask LLVM for 512-bit vectors where the CPU has AVX-512 (before numba is imported: numba
    reads its CPU features once). Left alone when the user set NUMBA_CPU_FEATURES or
    NUMBA_CPU_NAME (a portable cache, for example)."""
    if "NUMBA_CPU_FEATURES" in os.environ or "NUMBA_CPU_NAME" in os.environ:
        return
    import llvmlite.binding as llvm

    features = llvm.get_host_cpu_features().flatten()
    if "+avx512f" in features.split(","):
        os.environ["NUMBA_CPU_NAME"] = llvm.get_host_cpu_name()
        os.environ["NUMBA_CPU_FEATURES"] = features + ",-prefer-256-bit"


def import_numba():
    """numba, imported with the engine's CPU settings (modules of compiled helpers call this
    instead of `import numba`)."""
    import sys

    if "numba" not in sys.modules:
        _prefer_512_bit_vectors()
    import numba

    return numba


def _resolve(fn):
    """fn itself, or the function a "package.module:name" string names (module imported now)."""
    if not isinstance(fn, str):
        return fn
    module, _, name = fn.partition(":")
    return getattr(importlib.import_module(module), name)


class _Kernel:
    """A Python function compiled with numba at its first call (by one thread)."""

    def __init__(self, fn, fastmath=True):
        self.fn = fn
        self.fastmath = set(_FASTMATH) if fastmath is True else (set(fastmath) if fastmath else False)
        self.compiled = None
        self.lock = threading.Lock()
        self.__doc__ = fn.__doc__ if not isinstance(fn, str) else f"compiled {fn}"

    def __call__(self, *args):
        if self.compiled is None:
            with self.lock:
                if self.compiled is None:
                    numba = import_numba()
                    self.compiled = numba.njit(nogil=True, cache=True, error_model="numpy",
                                               fastmath=self.fastmath)(_resolve(self.fn))
        return self.compiled(*args)


def kernel(fn, fastmath=True):
    """fn (a function, or "package.module:name" for one in a module that needs numba to import),
    to be compiled at its first call and cached on disk; None without numba. fastmath=False for
    a kernel that must give the bits of the numpy operations it replaces (no fused
    multiply-adds, no reassociation); a set of LLVM flags (e.g. {"contract"}) for a kernel whose
    arithmetic must not be reordered but may fuse."""
    return _Kernel(fn, fastmath) if _why_not is None else None
