"""Random number generators.

A `Generator` owns one numpy `Generator` (Philox, counter based) for the CPU and, lazily, one CuPy
generator per CUDA device. Its state is a JSON-friendly dict, so checkpoints can store it without
pickle.
"""
import numpy as np

from . import cupy as _import_cupy


def _capture_state():
    from . import capture_state
    return capture_state()


class Generator:
    """One seed, two kinds of streams: numpy's Philox on the CPU (its full state is saved), and on
    each CUDA device a counter-based Philox stream whose state is its offset (engine/kernels/philox.py)."""

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
        """The generator drawing numbers for array module `xp` (numpy's API subset the engine uses)."""
        if xp is np:
            return self._np
        return self.device_stream(_import_cupy().cuda.runtime.getDevice())

    def device_stream(self, dev):
        """CUDA device `dev`'s stream (made at offset 0 on first use; a new one after manual_seed)."""
        stream = self._cuda.get(dev)
        if stream is None:
            stream = self._cuda[dev] = DevicePhilox(self._seed + 7919 * dev, owner=self, device=dev)
        return stream

    def get_state(self):
        """JSON-friendly: the seed, numpy's CPU state and each used CUDA device's offset; inside a
        CUDA graph capture also the streams' places in the graph (activation checkpointing saves
        them to redraw its forward's numbers when it recomputes)."""
        state = {"seed": self._seed, "cpu": self._np.bit_generator.state}
        if self._cuda:
            state["cuda"] = {str(dev): s.offset for dev, s in self._cuda.items()}
        graph = _capture_state()
        if graph is not None:
            devices = set(self._cuda) | {_import_cupy().cuda.runtime.getDevice()}
            state["cuda_graph_places"] = {str(dev): graph.rng_place(self, dev) for dev in sorted(devices)}
        return state

    def set_state(self, state):
        self.manual_seed(state["seed"])
        self._np.bit_generator.state = state["cpu"]
        for dev, offset in state.get("cuda", {}).items():
            self._cuda[int(dev)] = DevicePhilox(self._seed + 7919 * int(dev), int(offset), owner=self, device=int(dev))
        graph = _capture_state()
        if graph is not None:
            for dev, place in state.get("cuda_graph_places", {}).items():
                graph.set_rng_place(self, int(dev), int(place))


class DevicePhilox:
    """A CUDA device's stream: Philox4x32-10 at (seed, offset), one kernel launch per draw, with
    the methods of numpy's Generator that the engine calls."""

    def __init__(self, seed, offset=0, owner=None, device=None):
        self.seed = seed & ((1 << 64) - 1)
        self.offset = offset
        self.owner, self.device = owner, device  # the Generator and device it belongs to, if any

    def reserve(self, kind, n, what="dropout or a random op"):
        """(seed, offset) of the next `n` values of `kind`, which the stream moves past: the numbers
        a kernel that draws its own (bias + dropout + add, flash attention's dropout) computes,
        equal to those of the draw they stand for. Inside a CUDA graph capture the offset is a
        philox.GraphOffset, the draw's place in the graph, and the kernels read the stream's
        position from device memory that each replay moves on (engine/cuda_graphs.py): every
        replay draws new numbers, those an eager step would draw from the same state."""
        from ..kernels import philox
        graph = _capture_state()
        if graph is not None:
            return graph.rng_position(self, philox.groups(kind, n), what)
        seed, offset = self.seed, self.offset
        self.offset += philox.groups(kind, n)
        return seed, offset

    def _draw(self, kind, n):
        from ..kernels import philox
        return philox.draw(self.xp, kind, n, *self.reserve(kind, n))

    @property
    def xp(self):
        return _import_cupy()

    @staticmethod
    def _count(size):
        shape = () if size is None else ((size,) if isinstance(size, (int, np.integer)) else tuple(size))
        return shape, int(np.prod(shape, dtype=np.int64))

    def random(self, size=None, dtype=np.float64):
        from ..kernels import philox
        shape, n = self._count(size)
        return self._draw(philox.uniform_kind(dtype), n).reshape(shape)

    def standard_normal(self, size=None, dtype=np.float64):
        shape, n = self._count(size)
        kind = "normal_double" if np.dtype(dtype) == np.float64 else "normal_float"
        return self._draw(kind, n).reshape(shape)

    def standard_exponential(self, size=None, dtype=np.float64):
        u = self.random(size, dtype)
        return self.xp.negative(self.xp.log1p(-u, out=u), out=u)

    def _bits64(self, n):
        words = self._draw("bits", 2 * n).astype(np.uint64)
        return (words[0::2] << np.uint64(32)) | words[1::2]

    def integers(self, low, high=None, size=None, dtype=np.int64):
        if high is None:
            low, high = 0, low
        shape, n = self._count(size)
        span = np.uint64(int(high) - int(low))
        values = (self._bits64(n) % span).astype(np.int64) + np.int64(low)
        return values.astype(dtype, copy=False).reshape(shape)

    def permutation(self, n):
        """A random permutation of range(n): the order of n random 64-bit keys."""
        return self.xp.argsort(self._bits64(int(n))).astype(np.int64, copy=False)


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
