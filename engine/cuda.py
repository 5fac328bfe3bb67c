"""engine.cuda: torch.cuda's functions, over CuPy (the engine's CUDA backend).

On a machine without CuPy or without a GPU it answers as torch does without CUDA:
`is_available()` is False, `device_count()` 0, the memory statistics 0 and `empty_cache()` does
nothing, while `set_device`, `current_device` and `get_device_name` raise RuntimeError saying
what is missing (torch raises there too).

* `is_bf16_supported()` is always False: CuPy has no bfloat16 dtype, so the engine cannot hold
  bfloat16 tensors on a GPU (nanoGPT then picks float16 and a GradScaler, as on older GPUs).
* Memory figures are those of CuPy's default memory pool: `memory_allocated` its used bytes,
  `memory_reserved` what it holds from the driver. CuPy keeps no peak: the first call of
  `set_device`, `max_memory_allocated` or `reset_peak_memory_stats` installs an allocator that
  records the pool's used bytes after each allocation, so the peak counts from then on.
* `CUDAGraph`, `graph`, `is_current_stream_capturing`: CUDA graph capture and replay
  (engine/cuda_graphs.py; docs/cuda.md).
* `engine.cuda.amp.autocast` / `GradScaler` are torch.cuda.amp's aliases of engine.amp's on the
  'cuda' device; like torch's they warn and disable themselves when CUDA is not available.
"""
import sys
import types
import warnings

from . import amp as _amp
from . import backend
from .backend import as_device, dtypes, is_cuda_available
from .backend.random import manual_seed as _manual_seed
from .cuda_graphs import CUDAGraph, graph, is_current_stream_capturing

__all__ = ["is_available", "device_count", "is_bf16_supported", "set_device", "current_device",
           "get_device_name", "get_device_capability", "synchronize", "empty_cache", "memory_allocated",
           "max_memory_allocated", "memory_reserved", "reset_peak_memory_stats", "manual_seed",
           "manual_seed_all", "amp", "CUDAGraph", "graph", "is_current_stream_capturing"]


def is_available():
    return is_cuda_available()


def device_count():
    return backend.cupy().cuda.runtime.getDeviceCount() if is_available() else 0


def is_bf16_supported(including_emulation=True):
    """False: CuPy has no bfloat16, so no engine tensor can be bfloat16 on CUDA."""
    return False


def _index(device, what):
    """The CUDA device index of `device` (None: the current one)."""
    if device is None:
        return backend.cupy().cuda.runtime.getDevice()
    if isinstance(device, int):
        return device
    dev = as_device(device)
    if dev.type != "cuda":
        raise ValueError(f"{what}: expected a cuda device, but got: {dev}")
    return dev.index


def set_device(device):
    """Make `device` (an index, 'cuda:N' or a device) the current CUDA device; negative: no-op."""
    if isinstance(device, int) and device < 0:
        return
    cp = backend.cupy()
    cp.cuda.Device(_index(device, "set_device")).use()
    _track_peak(cp)


def current_device():
    return backend.cupy().cuda.runtime.getDevice()


def _properties(device, what):
    cp = backend.cupy()
    return cp.cuda.runtime.getDeviceProperties(_index(device, what))


def get_device_name(device=None):
    name = _properties(device, "get_device_name")["name"]
    return name.decode() if isinstance(name, bytes) else name


def get_device_capability(device=None):
    props = _properties(device, "get_device_capability")
    return int(props["major"]), int(props["minor"])


def synchronize(device=None):
    """Wait for every kernel on `device` (the current one by default); no-op without CUDA."""
    if is_available():
        cp = backend.cupy()
        cp.cuda.Device(_index(device, "synchronize")).synchronize()


def empty_cache():
    """Give the blocks CuPy's memory pools hold but do not use back to the driver."""
    cp = backend._cupy
    if cp is not None:
        cp.get_default_memory_pool().free_all_blocks()
        cp.get_default_pinned_memory_pool().free_all_blocks()


def _pool_bytes(device, what, measure):
    cp = backend._cupy
    if cp is None:
        return 0
    with cp.cuda.Device(_index(device, what)):
        return int(measure(cp.get_default_memory_pool()))


def memory_allocated(device=None):
    """Bytes of CuPy's pool in use by arrays on `device` (0 before CuPy is loaded)."""
    return _pool_bytes(device, "memory_allocated", lambda pool: pool.used_bytes())


def memory_reserved(device=None):
    """Bytes CuPy's pool holds from the driver on `device` (0 before CuPy is loaded)."""
    return _pool_bytes(device, "memory_reserved", lambda pool: pool.total_bytes())


class _PeakTracker:
    """An allocator in front of CuPy's pool that records, per device, its largest used bytes."""

    def __init__(self, pool):
        self.pool = pool
        self.peak = {}

    def malloc(self, size):
        mem = self.pool.malloc(size)
        dev = mem.device_id
        used = self.pool.used_bytes()
        if used > self.peak.get(dev, 0):
            self.peak[dev] = used
        return mem


_tracker = None


def _track_peak(cp):
    global _tracker
    if _tracker is None:
        pool = cp.get_default_memory_pool()
        if cp.cuda.get_allocator() != pool.malloc:
            warnings.warn("engine.cuda: a custom CuPy allocator is installed; peak memory is not tracked",
                          stacklevel=3)
            return None
        _tracker = _PeakTracker(pool)
        cp.cuda.set_allocator(_tracker.malloc)
    return _tracker


def max_memory_allocated(device=None):
    """The largest `memory_allocated(device)` seen since tracking began or the last reset."""
    cp = backend._cupy
    if cp is None:
        return 0
    idx = _index(device, "max_memory_allocated")
    tracker = _track_peak(cp)
    now = memory_allocated(idx)
    if tracker is None:
        return now
    return max(tracker.peak.get(idx, 0), now)


def reset_peak_memory_stats(device=None):
    """Start the peak of `max_memory_allocated(device)` afresh from the current use."""
    cp = backend._cupy
    if cp is None:
        return
    idx = _index(device, "reset_peak_memory_stats")
    tracker = _track_peak(cp)
    if tracker is not None:
        tracker.peak[idx] = memory_allocated(idx)


def manual_seed(seed):
    """The engine has one generator for every device: this seeds it (as engine.manual_seed)."""
    _manual_seed(seed)


manual_seed_all = manual_seed


# ------------------------------------------------------------------ torch.cuda.amp
class _CudaAutocast(_amp.autocast):
    """torch.cuda.amp.autocast: engine.amp.autocast('cuda', ...); disabled, with a warning,
    when CUDA is not available (as torch's)."""

    def __init__(self, enabled=True, dtype=dtypes.float16, cache_enabled=True):
        if enabled and not is_available():
            warnings.warn("User provided device_type of 'cuda', but CUDA is not available. Disabling", stacklevel=2)
            enabled = False
        super().__init__("cuda", dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)


class _CudaGradScaler(_amp.GradScaler):
    """torch.cuda.amp.GradScaler: engine.amp.GradScaler on 'cuda'; disabled, with a warning,
    when CUDA is not available (as torch's)."""

    def __init__(self, init_scale=2.0 ** 16, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000,
                 enabled=True):
        if enabled and not is_available():
            warnings.warn("engine.cuda.amp.GradScaler is enabled, but CUDA is not available.  Disabling.",
                          stacklevel=2)
            enabled = False
        super().__init__("cuda", init_scale, growth_factor, backoff_factor, growth_interval, enabled)


_CudaAutocast.__name__ = _CudaAutocast.__qualname__ = "autocast"
_CudaGradScaler.__name__ = _CudaGradScaler.__qualname__ = "GradScaler"
amp = types.ModuleType(__name__ + ".amp", "torch.cuda.amp: autocast and GradScaler on the CUDA device.")
amp.autocast, amp.GradScaler = _CudaAutocast, _CudaGradScaler
amp.__all__ = ["autocast", "GradScaler"]
sys.modules[amp.__name__] = amp  # `from engine.cuda.amp import GradScaler` works too
