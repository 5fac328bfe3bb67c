"""engine.accelerator: torch.accelerator (torch 2.13) over the engine's one accelerator, CUDA.

The accelerator is CUDA when engine.cuda.is_available() (CuPy and a GPU), otherwise there is
none, as torch on a CPU-only build: `is_available()` is False, `current_accelerator()` None,
`device_count()` 0, `synchronize()` and `device_index(None)` do nothing, and the functions that
need a device raise torch's RuntimeError. So the quickstart line

    device = torch.accelerator.current_accelerator().type if torch.accelerator.is_available() else "cpu"

gives "cuda" on a GPU machine and "cpu" elsewhere.
"""
from . import cuda as _cuda
from .backend import as_device, device

__all__ = ["is_available", "current_accelerator", "device_count", "current_device_index", "current_device_idx",
           "set_device_index", "set_device_idx", "synchronize", "device_index"]

_NONE = "Cannot access accelerator device when none is available."


def is_available():
    """Whether an accelerator (a CUDA GPU usable through CuPy) is there."""
    return _cuda.is_available()


def current_accelerator(check_available=False):
    """device("cuda") when CUDA is available, else None (torch's CPU-only build has no
    accelerator whether or not `check_available` asks)."""
    return device("cuda") if is_available() else None


def device_count():
    return _cuda.device_count()


def _require():
    if not is_available():
        raise RuntimeError(_NONE)


def current_device_index():
    _require()
    return _cuda.current_device()


def _index_of(dev, what):
    """A device index from an int, 'cuda:N' / a device (of the accelerator's type) or None (the current)."""
    if dev is None:
        return current_device_index()
    if isinstance(dev, int) and not isinstance(dev, bool):
        return dev
    d = as_device(dev)
    if d.type != "cuda":
        raise ValueError(f"{what}: {dev} doesn't match the current accelerator cuda.")
    return d.index


def set_device_index(device, /):
    """Make `device` (an index, 'cuda:N', a device) the current accelerator device."""
    if device is None:
        raise ValueError(f"Expected a torch.device with a specified index or an integer, but got:{device}")
    _require()
    _cuda.set_device(_index_of(device, "set_device_index"))


def synchronize(device=None, /):
    """Wait for every kernel on `device` (the current one by default)."""
    _require()
    _cuda.synchronize(_index_of(device, "synchronize"))


class device_index:
    """Context manager making device index `device` current inside, restoring the previous one
    after; `device_index(None)` does nothing (also without an accelerator), as torch's."""

    def __init__(self, device, /):
        self.idx = device
        self.prev = None

    def __enter__(self):
        if self.idx is not None:
            self.prev = current_device_index()
            if self.prev != self.idx:
                _cuda.set_device(self.idx)
        return None

    def __exit__(self, *exc):
        if self.idx is not None and self.prev != self.idx:
            _cuda.set_device(self.prev)
        return False


current_device_idx = current_device_index  # torch's deprecated aliases
set_device_idx = set_device_index
