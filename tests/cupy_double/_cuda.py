"""cupy.cuda in the double: devices, the current stream, the memory pool and the runtime queries."""
import types

from . import _double, _nccl
from ._double import Device, stats

MemoryPointer = _double.MemoryPointer


class Stream:
    """A CUDA stream; the double runs everything in order, so streams only count synchronisations
    and hold the current-stream state. Capture (begin_capture / end_capture) is emulated as far
    as its rules go: the code between runs eagerly, a host synchronisation inside it is refused
    as CUDA refuses it, and the work done in between is recorded so that the graph it returns
    replays it (Graph)."""

    null = None

    def __init__(self, null=False, non_blocking=False, ptds=False, priority=None):
        self.ptr = 0 if null else id(self)
        self._capturing = False

    def synchronize(self):
        stats.sync("Stream.synchronize")

    def use(self):
        _current[0] = self
        return self

    def begin_capture(self, mode=None):
        if self.ptr == 0:
            raise RuntimeError("cannot capture on the default (legacy) stream")
        if self._capturing:
            raise CUDARuntimeError("cudaErrorIllegalState: the stream is already capturing")
        self._capturing = True
        stats.capturing = True
        stats.captured = []

    def end_capture(self):
        if not self._capturing:
            raise CUDARuntimeError("cudaErrorIllegalState: the stream is not capturing")
        self._capturing = False
        stats.capturing = False
        work, stats.captured = stats.captured, []
        if stats.capture_broken:
            stats.capture_broken = False
            raise CUDARuntimeError("cudaErrorStreamCaptureInvalidated: operation failed due to a previous error "
                                   "during capture")
        return Graph(work)

    def is_capturing(self):
        return self._capturing

    def __enter__(self):
        self._prev = _current[0]
        _current[0] = self
        return self

    def __exit__(self, *exc):
        _current[0] = self._prev
        return False


class Event:
    """cupy.cuda.Event. The double runs everything in order, so an event is done once recorded;
    `record` stamps it with the double's clock and `synchronize` notes the stamp it waited for
    (stats.event_waits), so that a test can tell a wait for work queued in an earlier step (no
    stall on a GPU ahead of it) from a wait inside the step (a host synchronisation)."""

    def __init__(self, block=False, disable_timing=False, interprocess=False):
        self.ptr = id(self)
        self._stamp = None

    def record(self, stream=None):
        if stats.capturing:
            raise NotImplementedError("the CuPy double does not emulate an event recorded inside a capture")
        self._stamp = type(stats).clock
        type(stats).clock += 1

    @property
    def done(self):
        return True

    def synchronize(self):
        if stats.capturing:
            stats.sync("Event.synchronize")  # refused, as CUDA refuses it
        if self._stamp is not None:
            stats.event_waits.append(self._stamp)


class Graph:
    """cupy.cuda.Graph as the double returns it from end_capture: `launch` re-runs the captured
    work in order (tests/cupy_double/_double.record), each piece on the memory it used during
    capture and with the parameters it had then, as a CUDA graph replays its kernels."""

    def __init__(self, work=()):
        self._work = list(work)

    def launch(self, stream=None):
        if stats.capturing:
            raise CUDARuntimeError("cudaErrorStreamCaptureUnsupported: a graph launch inside a capture")
        for piece in self._work:
            piece()
        stats.launches += len(self._work) and 1  # one graph launch
        stats.by_name["cudaGraphLaunch"] += 1


Stream.null = Stream(null=True)
_current = [Stream.null]


def get_current_stream(device_id=None):
    return _current[0]


class MemoryPool:
    """cupy.cuda.MemoryPool: the double allocates with numpy, so the pool reports what is alive."""

    def used_bytes(self):
        return 0

    def total_bytes(self):
        return 0

    def free_bytes(self):
        return 0

    def free_all_blocks(self, stream=None):
        pass

    def set_limit(self, size=None, fraction=None):
        pass

    def get_limit(self):
        return 0

    def malloc(self, size):
        raise NotImplementedError("the CuPy double allocates with numpy, not through a pool")

    def n_free_blocks(self):
        return 0


class PinnedMemoryPool(MemoryPool):
    pass


default_pool = MemoryPool()
pinned_pool = PinnedMemoryPool()
_allocator = [default_pool.malloc]


def set_allocator(allocator=None):
    _allocator[0] = allocator or default_pool.malloc


def get_allocator():
    return _allocator[0]


def is_available():
    return _double.DEVICE_COUNT > 0


def get_device_id():
    return _double.current_device()


nccl = _nccl.module()

runtime = types.ModuleType("cupy.cuda.runtime")
runtime.getDeviceCount = lambda: _double.DEVICE_COUNT
runtime.getDevice = _double.current_device
runtime.setDevice = _double.set_current_device
runtime.deviceSynchronize = lambda: stats.sync("deviceSynchronize")
runtime.getDeviceProperties = lambda i: {
    "name": b"CuPy double (numpy)", "major": 9, "minor": 0, "totalGlobalMem": 80 * 2**30,
    "multiProcessorCount": 132, "warpSize": 32, "maxThreadsPerBlock": 1024, "sharedMemPerBlock": 49152}
runtime.runtimeGetVersion = lambda: 12080
runtime.driverGetVersion = lambda: 12080


class CUDARuntimeError(RuntimeError):
    pass


runtime.CUDARuntimeError = CUDARuntimeError
__all__ = ["Device", "Stream", "Graph", "MemoryPool", "PinnedMemoryPool", "MemoryPointer", "get_current_stream",
           "set_allocator", "get_allocator", "is_available", "get_device_id", "runtime", "nccl"]
