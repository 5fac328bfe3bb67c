"""Emulators of engine/kernels/philox.py: the numpy reference at the launch's (seed, offset)."""

from engine.kernels import philox

from . import emulates
from .norm_act import stream_position


def _emulate(kind):
    def run(name, grid, block, args, shared_mem):
        out, n, seed, offset, state = args
        n = int(n)
        seed, offset = stream_position(name, seed, offset, state)
        threads = grid[0] * block[0]
        if threads * 1 < 1 or out.size < n:
            raise ValueError(f"{name}: output of {out.size} values for n={n}")
        # a grid-stride loop covers any n with any positive geometry
        out[:n] = philox.reference(kind, n, seed, offset).astype(out.dtype, copy=False)

    return run


for _kind in philox.PER_GROUP:
    emulates(f"engine_philox_{_kind}")(_emulate(_kind))
