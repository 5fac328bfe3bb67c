"""Random number generators.

A `Generator` owns one numpy `Generator` (Philox, counter based) for the CPU and, lazily, one CuPy
generator per CUDA device. Its state is a JSON-friendly dict, so checkpoints can store it without
pickle.
"""
import numpy as np

from . import cupy as _import_cupy


class Generator:
    def __init__(self, device="cpu"):
        self.device = device
        self._seed = 0
        self.manual_seed(np.random.SeedSequence().entropy % (2**63))

    def manual_seed(self, seed):
        seed = int(seed)
        self._seed = seed
        self._np = np.random.Generator(np.random.Philox(seed))
        self._cuda = {}
        return self

    def initial_seed(self):
        return self._seed

    def seed(self):
        s = int(np.random.SeedSequence().entropy % (2**63))
        self.manual_seed(s)
        return s

    def rng(self, xp):
        """The generator drawing numbers for array module `xp`."""
        if xp is np:
            return self._np
        cp = _import_cupy()
        dev = cp.cuda.runtime.getDevice()
        if dev not in self._cuda:
            self._cuda[dev] = cp.random.Generator(cp.random.XORWOW(self._seed + 7919 * dev))
        return self._cuda[dev]

    def get_state(self):
        return {"seed": self._seed, "cpu": self._np.bit_generator.state}

    def set_state(self, state):
        self.manual_seed(state["seed"])
        self._np.bit_generator.state = state["cpu"]


default_generator = Generator()


def manual_seed(seed):
    """Seed the default generator (CPU and every CUDA device), like torch.manual_seed."""
    return default_generator.manual_seed(seed)


def seed():
    return default_generator.seed()


def initial_seed():
    return default_generator.initial_seed()


def get_rng_state():
    return default_generator.get_state()


def set_rng_state(state):
    default_generator.set_state(state)
