"""Array backends: numpy for the CPU, CuPy for CUDA devices.

Every kernel is written once against `xp`, the array module of the device it runs on. CuPy is
imported only when a CUDA tensor is first made, so CPU users never need it.
"""
import os

import numpy as np

from . import dtypes
from .dtypes import dtype

_cupy = None


class device:
    """A device such as `cpu` or `cuda:0`. Equal devices compare and hash equal."""

    __slots__ = ("type", "index")

    def __init__(self, type, index=None):
        if isinstance(type, device):
            type, index = type.type, type.index
        elif isinstance(type, str) and ":" in type:
            type, idx = type.split(":", 1)
            index = int(idx)
        if type not in ("cpu", "cuda"):
            raise ValueError(f"unknown device type {type!r}; expected 'cpu' or 'cuda[:N]'")
        if type == "cuda" and index is None:
            index = cupy().cuda.runtime.getDevice() if is_cuda_available() else 0  # the rank's GPU
        self.type = type
        self.index = index if type == "cuda" else None

    def __eq__(self, other):
        if isinstance(other, str):
            other = device(other)
        return isinstance(other, device) and self.type == other.type and self.index == other.index

    def __hash__(self):
        return hash((self.type, self.index))

    def __repr__(self):
        return f"device(type='{self.type}')" if self.index is None else f"device(type='{self.type}', index={self.index})"

    def __str__(self):
        return self.type if self.index is None else f"{self.type}:{self.index}"


CPU = device("cpu")


def as_device(d):
    if d is None:
        return None
    if isinstance(d, device):
        return d
    if isinstance(d, int):
        return device("cuda", d)
    return device(d)


def cupy():
    """Import CuPy on first use, with an error that says what is missing."""
    global _cupy
    if _cupy is None:
        try:
            import cupy as cp
        except ImportError as e:
            raise RuntimeError(
                "device 'cuda' needs CuPy: install the project with the `cuda` extra "
                "(pip install -e '.[cuda]') on a machine with an NVIDIA GPU"
            ) from e
        try:
            n = cp.cuda.runtime.getDeviceCount()
        except Exception as e:  # CUDA driver missing
            raise RuntimeError(f"CuPy is installed but no CUDA GPU is usable: {e}") from e
        if n == 0:
            raise RuntimeError("CuPy is installed but no CUDA GPU is visible")
        cp.cuda.Device(local_cuda_index(n)).use()
        _cupy = cp
    return _cupy


def local_cuda_index(count=None):
    """The GPU this process computes on: ENGINE_CUDA_DEVICE if set, else the node-local rank
    (LOCAL_RANK, as the launcher exports it; MPICH's MPI_LOCALRANKID under plain mpiexec) modulo
    the GPUs visible, so the ranks of a node spread over its GPUs, one each."""
    if "ENGINE_CUDA_DEVICE" in os.environ:
        return int(os.environ["ENGINE_CUDA_DEVICE"])
    local = int(os.environ.get("LOCAL_RANK", os.environ.get("MPI_LOCALRANKID", "0")))
    if count is None:
        count = cupy().cuda.runtime.getDeviceCount()
    return local % count


def is_cuda_available():
    try:
        cupy()
        return True
    except RuntimeError:
        return False


def xp_for(dev):
    """The array module (numpy or cupy) that computes on `dev`."""
    return np if dev.type == "cpu" else cupy()


def xp_of(array):
    """The array module owning `array`; numpy arrays and scalars never touch CuPy."""
    if isinstance(array, np.ndarray) or _cupy is None:
        return np
    return _cupy.get_array_module(array)


def check_dtype_on(np_dtype, dev):
    """CuPy has no bfloat16: refuse it on CUDA with a message saying what to use instead (the
    engine stores bfloat16 only on the CPU; on a GPU, float16 with loss scaling is the half type)."""
    if dev.type == "cuda" and np_dtype == dtypes.bfloat16.np:
        raise TypeError(f"bfloat16 is not supported on {dev}: CuPy has no bfloat16 dtype; use float16 "
                        "(with engine.amp.GradScaler for training) or float32 on CUDA")


def host_checks(array):
    """Whether to validate `array`'s values on the host (index bounds, target ranges): always for
    numpy arrays (free); for device arrays only with ENGINE_CUDA_SYNC_CHECKS=1, since reading a
    value back stalls the GPU pipeline (a debug mode, as CUDA_LAUNCH_BLOCKING is for torch)."""
    return isinstance(array, np.ndarray) or os.environ.get("ENGINE_CUDA_SYNC_CHECKS") == "1"


def device_of(array):
    if isinstance(array, np.ndarray) or _cupy is None or not isinstance(array, _cupy.ndarray):
        return CPU
    return device("cuda", array.device.id)


_capture = None  # the engine.cuda.CUDAGraph capturing now, if any (engine/cuda_graphs.py)


def capture_state():
    return _capture


def set_capture_state(graph):
    global _capture
    _capture = graph


def refuse_in_capture(what):
    """A clear error for `what` (a copy between host and device, a GradScaler step) inside a CUDA
    graph capture, where a replay would repeat it wrongly."""
    if _capture is not None:
        raise RuntimeError(f"{what} inside a CUDA graph capture (engine.cuda.graph): a replay would not redo it "
                           "with new values; do it before the capture, or outside the graph")


def to_device(array, dev):
    """Move an array to `dev` (copying only when the device changes)."""
    src = device_of(array)
    if src == dev:
        return array
    refuse_in_capture(f"a copy from {src} to {dev}")
    if dev.type == "cpu":
        return array.get()
    check_dtype_on(array.dtype, dev)
    cp = cupy()
    with cp.cuda.Device(dev.index):
        return cp.asarray(array)


def default_device():
    """`ENGINE_DEVICE=cuda` makes new tensors default to the GPU (used to run the test suite on CuPy)."""
    return as_device(os.environ.get("ENGINE_DEVICE", "cpu"))


# ------------------------------------------------------------------ arrays from Python data
def infer_dtype(data):
    """PyTorch's dtype for Python data: bool, int64, or the default float dtype."""
    a = np.asarray(data)
    if a.dtype == np.bool_:
        return dtypes.bool_
    if a.dtype.kind in "iu":
        return dtypes.int64
    if a.dtype == object or a.dtype.kind not in "biuf":
        raise TypeError(f"can't build a tensor from data of type {a.dtype}")
    return dtypes.get_default_dtype()


def _is_array(data):
    return isinstance(data, np.ndarray) or hasattr(data, "__cuda_array_interface__")


def _host_data(data):
    """Nested lists/tuples with array-likes inside (e.g. 0-d tensors) as one numpy array."""
    if isinstance(data, (list, tuple)) and any(hasattr(x, "__array__") and not _is_array(x) for x in _flat(data)):
        return np.array([_host_data(x) for x in data])
    if hasattr(data, "__array__") and not _is_array(data):
        return np.asarray(data)
    return data


def _flat(data):
    for x in data:
        if isinstance(x, (list, tuple)):
            yield from _flat(x)
        else:
            yield x


def array_from_data(data, dtype=None, device=None):
    """A new array holding a copy of `data` (nested lists, scalars, numpy/CuPy arrays, anything
    with `__array__`), and its device. An array keeps its dtype and device unless `dtype` /
    `device` are given; Python data and numpy arrays go to the default device (ENGINE_DEVICE),
    as torch.tensor puts them on torch's default device, with PyTorch's dtype for Python data."""
    dtype = dtypes.as_dtype(dtype)
    data = _host_data(data)
    if _is_array(data):
        dtype = dtype or dtypes.from_numpy_dtype(data.dtype)  # a clear error for unsupported dtypes
        dev = as_device(device) or (default_device() if isinstance(data, np.ndarray) else device_of(data))
        return xp_for(dev).array(to_device(data, dev), dtype=dtype.np, copy=True), dev
    dev = as_device(device) or default_device()
    dtype = dtype or infer_dtype(data)
    try:
        array = np.array(data, dtype=dtype.np)
    except OverflowError:  # torch's rule: only uint8 takes negative ints (down to -255, wrapped)
        try:
            wide = np.array(data, dtype=np.int64) if dtype.np.kind in "iu" else None
        except OverflowError:
            wide = None
        if wide is None or dtype.np != np.uint8 or wide.size and (wide.min() < -255 or wide.max() > 255):
            raise RuntimeError(f"value cannot be converted to type {dtype.name} without overflow") from None
        array = wide.astype(np.uint8)
    return to_device(array, dev), dev
