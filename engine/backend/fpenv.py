"""Denormals flushed to zero for a block of CPU work, on the calling thread only.

Why: a float32 below the smallest normal number (~1.2e-38) is a denormal, and x86 cores compute
with denormals through a microcode assist some 100x slower than normal arithmetic: a
[4096, 16, 16] x [4096, 16, 32] batched product reading 1e-40s took 76 ms against 0.7 ms (this
project's 2-core machine). Attention makes them: a masked score (Swin's shift mask -100, a
causal fill of -10000) gives exp(score - max) ~ 4e-44 or below. MKL's vector exp is no way out:
it takes a slow path for every input whose result underflows (3.6 ms against 0.04 ms on 196,608
of them, with or without its flush-to-zero flag).

So the attention core and the softmax kernels run inside `flush_denormals()`: the thread's
MXCSR gets FTZ (denormal results become 0) and DAZ (denormal inputs read as 0) on entry and its
previous state back on exit, as `torch.set_flush_denormal(True)` would do for a whole process.
The change is per thread and per block: work outside the block (other ops, the user's own numpy)
keeps IEEE denormals, and since every block of a kernel runs under it whichever thread picks it
up, results do not depend on the thread count. Only the tiniest values differ from IEEE
arithmetic: a probability below 1.2e-38 is 0 instead of a denormal.

x86-64 glibc (Linux) only, through ctypes (fegetenv / fesetenv with the MXCSR bits set);
elsewhere it is a no-op and the kernels are merely slower on denormals.
"""
import contextlib
import ctypes
import os
import struct
import sys

_FTZ_DAZ = 0x8040  # MXCSR bit 15 flush-to-zero, bit 6 denormals-are-zero
_MXCSR_OFFSET = 28  # glibc x86-64 fenv_t: 28 bytes of x87 environment, then the 32-bit MXCSR
_FENV_SIZE = 32


def _load_libm():
    if not sys.platform.startswith("linux") or os.uname().machine not in ("x86_64", "AMD64"):
        return None
    try:  # glibc's soname first: ctypes.util.find_library runs `ldconfig -p` in a subprocess
        libm = ctypes.CDLL("libm.so.6")
    except OSError:
        from ctypes.util import find_library

        try:
            libm = ctypes.CDLL(find_library("m") or "libm.so.6")
        except OSError:
            return None
    try:
        get, set_ = libm.fegetenv, libm.fesetenv
    except AttributeError:
        return None
    get.argtypes = set_.argtypes = [ctypes.c_char_p]
    get.restype = set_.restype = ctypes.c_int
    return libm


_libm = _load_libm()


def available():
    """Whether flush_denormals() really changes the floating-point mode here."""
    return _libm is not None


def mxcsr():
    """The calling thread's MXCSR register (None where unavailable): for tests."""
    if _libm is None:
        return None
    env = ctypes.create_string_buffer(_FENV_SIZE)
    _libm.fegetenv(env)
    return struct.unpack_from("<I", env.raw, _MXCSR_OFFSET)[0]


@contextlib.contextmanager
def flush_denormals():
    """Run the block with denormals flushed to zero on this thread (see the module docstring)."""
    if _libm is None:
        yield
        return
    saved = ctypes.create_string_buffer(_FENV_SIZE)
    _libm.fegetenv(saved)
    flushed = ctypes.create_string_buffer(saved.raw, _FENV_SIZE)
    struct.pack_into("<I", flushed, _MXCSR_OFFSET,
                     struct.unpack_from("<I", saved.raw, _MXCSR_OFFSET)[0] | _FTZ_DAZ)
    _libm.fesetenv(flushed)
    try:
        yield
    finally:
        _libm.fesetenv(saved)
