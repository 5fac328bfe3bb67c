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
IEEE meaning.

Off switch: `ENGINE_JIT=0`, or numba not installed: `kernel` returns None and the callers run
their numpy kernels, which stay the reference the compiled ones are tested against
(tests/test_jit_kernels.py).
"""
import importlib.util
import os
import threading

_FASTMATH = frozenset({"reassoc", "contract", "nsz"})  # not nnan/ninf: nan and inf propagate

if os.environ.get("ENGINE_JIT", "1").strip().lower() in ("0", "false", "no", "off"):
    _why_not = "turned off by ENGINE_JIT=0"
elif importlib.util.find_spec("numba") is None:
    _why_not = "numba is not installed"
else:
    _why_not = None


def available():
    return _why_not is None


def why_unavailable():
    return _why_not or ""


class _Kernel:
    """A Python function compiled with numba at its first call (by one thread)."""

    def __init__(self, fn, fastmath=True):
        self.fn = fn
        self.fastmath = set(_FASTMATH) if fastmath else False
        self.compiled = None
        self.lock = threading.Lock()
        self.__doc__ = fn.__doc__

    def __call__(self, *args):
        if self.compiled is None:
            with self.lock:
                if self.compiled is None:
                    import numba

                    self.compiled = numba.njit(nogil=True, cache=True, fastmath=self.fastmath)(self.fn)
        return self.compiled(*args)


def kernel(fn, fastmath=True):
    """fn, to be compiled at its first call and cached on disk; None without numba. fastmath=False
    for a kernel that must give the bits of the numpy operations it replaces (no fused
    multiply-adds, no reassociation)."""
    return _Kernel(fn, fastmath) if _why_not is None else None
