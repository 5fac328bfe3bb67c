"""cupy.random in the double: bit generators and a Generator with exactly real CuPy's methods
(no `permutation`, `normal` or `choice`: CuPy's Generator lacks them)."""
import numpy as np

from . import _double
from ._double import stats
from ._names import NAMES


def _refuse_in_capture():
    if stats.capturing:  # a replay would repeat the captured numbers: the double does not emulate it
        raise RuntimeError("the CuPy double does not capture cupy.random draws in a CUDA graph")


class BitGenerator:
    def __init__(self, seed=None, *, size=None):
        self._np = np.random.Philox(seed)

    def random_raw(self, size=None, output=True):
        _refuse_in_capture()
        stats.launches += 1
        return _double.wrap(self._np.random_raw(size).astype(np.uint64))


class XORWOW(BitGenerator):
    pass


class MRG32k3a(BitGenerator):
    pass


class Philox4x3210(BitGenerator):
    pass


class Generator:
    def __init__(self, bit_generator):
        self.bit_generator = bit_generator
        self._g = np.random.Generator(bit_generator._np)


def _method(name):
    def draw(self, *args, **kwargs):
        stats.names.add(f"cupy.random.Generator.{name}")
        if kwargs.get("dtype") is not None:
            _double.check_dtype(kwargs["dtype"])
        _refuse_in_capture()
        stats.launches += 1
        return _double.wrap(np.asarray(getattr(self._g, name)(*args, **kwargs)))

    draw.__name__ = name
    return draw


for _name in NAMES["cupy.random.Generator"]:
    if not _name.startswith("_") and hasattr(np.random.Generator, _name):
        setattr(Generator, _name, _method(_name))


def default_rng(seed=None):
    return Generator(XORWOW(seed))


def __getattr__(name):
    if name in NAMES["cupy.random"]:
        raise NotImplementedError(f"cupy.random.{name} exists in CuPy but the CuPy double does not emulate it")
    raise AttributeError(f"module 'cupy.random' has no attribute '{name}'")
