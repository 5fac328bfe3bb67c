"""Tensor creation: from data, constant fills, ranges and random draws.

Every function takes `dtype=`, `device=` and `requires_grad=` as in PyTorch. Random draws come
from `engine.Generator`s (the default one unless `generator=` is given), so `manual_seed` makes
them reproducible.
"""
import functools
import numbers

import numpy as np

from ..backend import array_from_data, as_device, check_dtype_on, default_device, deterministic, dtypes, to_device, xp_for
from ..backend.random import default_generator
from ..autograd.grad_mode import _state as _grad_state
from ..tensor import Tensor, Size
from .formats import *  # noqa: F401,F403 (engine.strided, engine.channels_last, ...)
from .formats import __all__ as _formats, factory_options

__all__ = ["tensor", "as_tensor", "from_numpy", "zeros", "ones", "full", "empty", "arange",
           "linspace", "eye", "rand", "randn", "randint", "normal", "zeros_like", "ones_like",
           "full_like", "empty_like", "rand_like", "randn_like", "randint_like", "randperm",
           "scalar_tensor", *_formats]


def _finish(array, dev, requires_grad):
    if _grad_state.tracer is not None:  # created inside a captured step: a fresh array per replay
        _grad_state.tracer.constant(array)
    t = Tensor._make(array, dev)
    if requires_grad:
        t.requires_grad_(True)
    return t


def _dev(device):
    return as_device(device) if device is not None else default_device()


def _size(size):
    if len(size) == 1 and isinstance(size[0], (tuple, list, Size)):
        size = tuple(size[0])
    size = tuple(int(s) for s in size)
    for s in size:
        if s < 0:
            raise RuntimeError(f"Trying to create tensor with negative dimension {s}: {list(size)}")
    return size


def tensor(data, dtype=None, device=None, requires_grad=False, pin_memory=False):
    """Copy `data` (nested lists, scalars, numpy arrays or tensors) into a new tensor."""
    if isinstance(data, Tensor):
        array, dev = array_from_data(data._data, dtype, _dev(device) if device is not None else data._device)
    else:
        array, dev = array_from_data(data, dtype, device)
    return _finish(array, dev, requires_grad)


def as_tensor(data, dtype=None, device=None):
    """Like `tensor`, but shares memory with a numpy array or tensor when dtype and device allow."""
    dtype = dtypes.as_dtype(dtype)
    if isinstance(data, Tensor):
        t = data
        if dtype is not None and t.dtype is not dtype:
            t = t.to(dtype)
        if device is not None and t.device != _dev(device):
            t = t.to(_dev(device))
        return t
    if isinstance(data, np.ndarray) and (device is None or _dev(device).type == "cpu"):
        if dtype is None or data.dtype == dtype.np:
            return from_numpy(data)
    return tensor(data, dtype=dtype, device=device)


def from_numpy(ndarray):
    """A CPU tensor sharing memory with `ndarray`."""
    if not isinstance(ndarray, np.ndarray):
        raise TypeError(f"from_numpy expects a numpy.ndarray, got {type(ndarray).__name__}")
    dtypes.from_numpy_dtype(ndarray.dtype)  # clear error for unsupported dtypes
    return Tensor._make(ndarray, as_device("cpu"))


def _xp(dev, dtype):
    """The array module of `dev`, refusing a dtype it cannot hold (bfloat16 on CUDA)."""
    check_dtype_on(dtype.np, dev)
    return xp_for(dev)


def _filled(size, value, dtype, device, requires_grad):
    dev = _dev(device)
    dtype = dtypes.as_dtype(dtype) or dtypes.get_default_dtype()
    xp = _xp(dev, dtype)
    return _finish(xp.full(_size(size), value, dtype=dtype.np), dev, requires_grad)


def zeros(*size, dtype=None, device=None, requires_grad=False):
    return _filled(size, 0, dtype, device, requires_grad)


def ones(*size, dtype=None, device=None, requires_grad=False):
    return _filled(size, 1, dtype, device, requires_grad)


def empty(*size, dtype=None, device=None, requires_grad=False):
    dev = _dev(device)
    dtype = dtypes.as_dtype(dtype) or dtypes.get_default_dtype()
    a = deterministic.fill_uninitialized(_xp(dev, dtype).empty(_size(size), dtype=dtype.np))
    return _finish(a, dev, requires_grad)


def full(size, fill_value, dtype=None, device=None, requires_grad=False):
    if dtype is None:
        dtype = dtypes.scalar_dtype(fill_value.item() if isinstance(fill_value, Tensor) else fill_value)
    if isinstance(fill_value, Tensor):
        fill_value = fill_value.item()
    return _filled((size,) if isinstance(size, int) else tuple(size), fill_value, dtype, device, requires_grad)


def scalar_tensor(value, dtype=None, device=None, requires_grad=False):
    return full((), value, dtype=dtype or dtypes.get_default_dtype(), device=device, requires_grad=requires_grad)


def _like(t, dtype, device):
    return (dtypes.as_dtype(dtype) or t.dtype), (device if device is not None else t.device)


def full_like(input, fill_value, dtype=None, device=None, requires_grad=False):
    dtype, device = _like(input, dtype, device)
    return full(input.shape, fill_value, dtype=dtype, device=device, requires_grad=requires_grad)


def arange(start, end=None, step=1, dtype=None, device=None, requires_grad=False):
    if end is None:
        start, end = 0, start
    vals = [v.item() if isinstance(v, Tensor) else v for v in (start, end, step)]
    # torch's integer ranges (CPU): int64 truncates start, end and step to integers first; the
    # narrower types count the elements from the values as given and step from int(start) by int(step)
    integer = dtype is not None and not dtypes.as_dtype(dtype).is_floating_point and all(np.isfinite(v) for v in vals)
    if integer and dtypes.as_dtype(dtype) is dtypes.int64 and vals[2] != 0 and (vals[1] - vals[0]) * vals[2] >= 0:
        vals = [int(v) for v in vals]
        if vals[2] == 0:
            raise ValueError(f"arange: step must be nonzero (step {step} truncated to an integer for int64)")
    if vals[2] == 0:
        raise RuntimeError("arange: step must be nonzero")
    if not all(np.isfinite(v) for v in vals):
        raise RuntimeError(f"arange: unsupported range: {vals[0]} -> {vals[1]} (step {vals[2]})")
    if (vals[1] - vals[0]) * vals[2] < 0:
        raise RuntimeError(f"arange: upper bound and lower bound inconsistent with step sign "
                           f"(start {vals[0]}, end {vals[1]}, step {vals[2]})")
    if dtype is None:
        dtype = dtypes.get_default_dtype() if any(isinstance(v, float) for v in vals) else dtypes.int64
    dtype = dtypes.as_dtype(dtype)
    dev = _dev(device)
    n = max(int(np.ceil((vals[1] - vals[0]) / vals[2])), 0)
    if integer:
        vals = [int(vals[0]), vals[1], int(vals[2])]
    # compute in float64/int64 then cast, as PyTorch does, so float32 ranges don't drift; on a GPU
    # on the device itself (the same IEEE products and sums), so no host copy is queued: a forward
    # that builds positions or a causal mask can be captured in a CUDA graph
    xp = _xp(dev, dtype)
    array = xp.arange(n, dtype=np.float64 if dtype.is_floating_point else np.int64)
    if vals[2] != 1:  # x * 1 is x, and so is x + 0 for integers: no launches for them on a GPU
        array = array * vals[2]
    if vals[0] != 0 or dtype.is_floating_point:  # (0 * step < 0 is -0.0; + 0 makes it +0.0, as torch)
        array = array + vals[0]
    return _finish(array.astype(dtype.np, copy=False), dev, requires_grad)


def linspace(start, end, steps, dtype=None, device=None, requires_grad=False):
    for name, v in (("start", start), ("end", end)):
        if isinstance(v, Tensor) and v.dim() != 0:
            raise RuntimeError(f"linspace only supports 0-dimensional start and end tensors, but got {name} "
                               f"with {v.dim()} dimension(s)")
    if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)):
        raise TypeError(f"linspace(): argument 'steps' must be int, not {type(steps).__name__}")
    if steps < 0:
        raise RuntimeError(f"linspace: number of steps must be non-negative, got {steps}")
    start, end = (v.item() if isinstance(v, Tensor) else v for v in (start, end))
    dtype = dtypes.as_dtype(dtype) or dtypes.get_default_dtype()
    if not dtype.is_floating_point:  # integer points between the bounds truncated to integers, as torch's
        start, end = int(start), int(end)
    dev = _dev(device)
    array = np.linspace(float(start), float(end), int(steps), dtype=np.float64).astype(dtype.np)
    return _finish(to_device(array, dev), dev, requires_grad)


def eye(n, m=None, dtype=None, device=None, requires_grad=False):
    for name, v in (("n", n), ("m", m)):
        if v is not None and v < 0:
            raise RuntimeError(f"eye: {name} must be greater or equal to 0, got {v}")
    dtype = dtypes.as_dtype(dtype) or dtypes.get_default_dtype()
    dev = _dev(device)
    return _finish(_xp(dev, dtype).eye(n, m if m is not None else n, dtype=dtype.np), dev, requires_grad)


# ------------------------------------------------------------------ random
def _rng(generator, dev):
    return (generator or default_generator).rng(xp_for(dev))


def _float_random(draw, size, generator, dtype, device, requires_grad):
    dtype = dtypes.as_dtype(dtype) or dtypes.get_default_dtype()
    if not dtype.is_floating_point:
        raise TypeError(f"random floats need a floating dtype, got {dtype}")
    dev = _dev(device)
    work = np.float64 if dtype is dtypes.float64 else np.float32

    def make():
        array = draw(_rng(generator, dev), _size(size), work)
        return array.astype(dtype.np) if array.dtype != dtype.np else array

    return _finish(_drawn(make), dev, requires_grad)


def _drawn(make):
    """`make()`, a random draw; while nn.Graph captures a step the draw is recorded, so that each
    replay draws anew."""
    array = make()
    if _grad_state.tracer is not None:
        _grad_state.tracer.call(make, (), array, "RandomDraw")
    return array


def rand(*size, generator=None, dtype=None, device=None, requires_grad=False):
    return _float_random(lambda r, s, w: r.random(s, dtype=w), size, generator, dtype, device, requires_grad)


def randn(*size, generator=None, dtype=None, device=None, requires_grad=False):
    return _float_random(lambda r, s, w: r.standard_normal(s, dtype=w), size, generator, dtype, device,
                         requires_grad)


def normal(mean=0.0, std=1.0, size=None, *, generator=None, dtype=None, device=None, requires_grad=False):
    if isinstance(mean, Tensor) or isinstance(std, Tensor):
        shape = (mean if isinstance(mean, Tensor) else std).shape
        return randn(shape, generator=generator, dtype=dtype, device=device) * std + mean
    if size is None:
        raise TypeError("normal() with scalar mean and std needs size=")
    return _float_random(lambda r, s, w: (r.standard_normal(s, dtype=w) * std + mean).astype(w, copy=False),
                         (size,) if isinstance(size, int) else tuple(size), generator, dtype, device,
                         requires_grad)


def randint(low, high=None, size=None, *, generator=None, dtype=None, device=None, requires_grad=False):
    if size is None and isinstance(high, (tuple, list, Size)):  # randint(high, size)
        low, high, size = 0, low, high
    elif high is None:
        raise TypeError("randint() needs (high, size) or (low, high, size)")
    if size is None:
        raise TypeError("randint() missing required argument 'size'")
    dtype = dtypes.as_dtype(dtype) or dtypes.int64
    dev = _dev(device)
    if int(high) <= int(low):
        raise RuntimeError(f"randint: expected low < high, got low={low}, high={high}")
    shape = _size((size,) if isinstance(size, int) else size)

    def make():
        return _rng(generator, dev).integers(int(low), int(high), shape).astype(dtype.np)

    return _finish(_drawn(make), dev, requires_grad)


def randperm(n, *, generator=None, dtype=None, device=None, requires_grad=False):
    dtype = dtypes.as_dtype(dtype) or dtypes.int64
    dev = _dev(device)

    def make():
        return _rng(generator, dev).permutation(int(n)).astype(dtype.np)

    return _finish(_drawn(make), dev, requires_grad)


def randint_like(input, low, high=None, dtype=None, device=None, requires_grad=False):
    if high is None:
        low, high = 0, low
    dtype, device = _like(input, dtype, device)
    return randint(low, high, input.shape, dtype=dtype, device=device, requires_grad=requires_grad)


def is_number(x):
    return isinstance(x, numbers.Number)


# ------------------------------------------------------------------ global creation
_global_factory = None


def set_global_factory(fn):
    """engine.distributed registers `fn(factory, fill_args, args, kwargs, placement, sbp)` here when
    it loads: it builds the global tensor that a factory call with `placement=` and `sbp=` asks
    for (the logical value is what `factory(*args, **kwargs)` makes; `fill_args`, for constant
    fills, parses the call into (shape, value, dtype) so that each rank allocates only its shard)."""
    global _global_factory
    _global_factory = fn


def _placeable(fn, filled=None):
    """Add `placement=` and `sbp=` to a factory: the result is a global tensor whose logical
    value is what the local factory makes."""

    @functools.wraps(fn)
    def wrapper(*args, placement=None, sbp=None, **kwargs):
        if placement is None:
            if sbp is not None:
                raise ValueError(f"{fn.__name__}: sbp= needs placement= as well")
            return fn(*args, **kwargs)
        if sbp is None:
            raise ValueError(f"{fn.__name__}: placement= needs sbp= as well (e.g. flow.sbp.broadcast)")
        if _global_factory is None:
            raise RuntimeError(f"{fn.__name__}: placement= needs engine.distributed (import engine)")
        return _global_factory(fn, filled, args, kwargs, placement, sbp)

    return wrapper


def _fill_args(value):
    def parse(*size, dtype=None, device=None, requires_grad=False):
        return _size(size), value, dtypes.as_dtype(dtype) or dtypes.get_default_dtype()

    return parse


def _full_args(size, fill_value, dtype=None, device=None, requires_grad=False):
    if dtype is None:
        dtype = dtypes.scalar_dtype(fill_value)
    return (_size((size,) if isinstance(size, int) else tuple(size)), fill_value, dtypes.as_dtype(dtype))


# torch's factories take out=, layout= and pin_memory= (empty and the *_like also memory_format=)
_OPTIONS = ("out", "layout", "pin_memory")
zeros = factory_options(*_OPTIONS)(_placeable(zeros, _fill_args(0)))
ones = factory_options(*_OPTIONS)(_placeable(ones, _fill_args(1)))
empty = factory_options(*_OPTIONS, "memory_format")(_placeable(empty, _fill_args(0)))
full = factory_options(*_OPTIONS)(_placeable(full, _full_args))
tensor = _placeable(tensor)
arange = factory_options(*_OPTIONS)(_placeable(arange))
rand = factory_options(*_OPTIONS)(_placeable(rand))
randn = factory_options(*_OPTIONS)(_placeable(randn))
randint = factory_options(*_OPTIONS)(_placeable(randint))
normal = factory_options(*_OPTIONS)(_placeable(normal))
linspace = factory_options(*_OPTIONS)(linspace)
eye = factory_options(*_OPTIONS)(eye)
randperm = factory_options(*_OPTIONS)(randperm)


def _global_like(factory, input, kwargs):
    """A *_like factory on a global input: same placement, SBP with partial read as broadcast
    (the result is a fresh value, not a sum of shards)."""
    meta = input._global.without_partial()
    return factory(input.shape, placement=meta.placement, sbp=meta.sbp, **kwargs)


def _like_factory(factory):
    """`<factory>_like(input, ...)`: `factory(input.shape)` with input's dtype and device (or
    placement and SBP, for a global input) unless given."""

    def like(input, dtype=None, device=None, requires_grad=False):
        if input._global is not None:
            return _global_like(factory, input, dict(dtype=dtype or input.dtype, requires_grad=requires_grad))
        dtype, device = _like(input, dtype, device)
        return factory(input.shape, dtype=dtype, device=device, requires_grad=requires_grad)

    like.__name__ = like.__qualname__ = factory.__name__ + "_like"
    return factory_options("layout", "pin_memory", "memory_format")(like)


zeros_like = _like_factory(zeros)
ones_like = _like_factory(ones)
empty_like = _like_factory(empty)
rand_like = _like_factory(rand)
randn_like = _like_factory(randn)
_full_like_local = full_like


def full_like(input, fill_value, dtype=None, device=None, requires_grad=False):
    if input._global is not None:
        return _global_like(lambda shape, **kw: full(shape, fill_value, **kw), input,
                            dict(dtype=dtype or input.dtype, requires_grad=requires_grad))
    return _full_like_local(input, fill_value, dtype=dtype, device=device, requires_grad=requires_grad)


full_like = factory_options("layout", "pin_memory", "memory_format")(full_like)
randint_like = factory_options("layout", "pin_memory", "memory_format")(randint_like)


# ------------------------------------------------------------------ Tensor.new_*
def _new_kwargs(self, dtype, device):
    """Where a `Tensor.new_*` result lives: `self`'s dtype and device unless given; for a global
    `self` (and no device), its placement, replicated (the new value is not a shard of anything)."""
    kw = dict(dtype=dtypes.as_dtype(dtype) or self.dtype)
    if self._global is not None and device is None:
        meta = self._global.replicated()
        kw.update(placement=meta.placement, sbp=meta.sbp)
    else:
        kw["device"] = device if device is not None else self.device
    return kw


def _new_filled(factory):
    def new(self, *size, dtype=None, device=None, requires_grad=False):
        return factory(*size, requires_grad=requires_grad, **_new_kwargs(self, dtype, device))

    new.__name__ = new.__qualname__ = "new_" + factory.__name__
    new.__doc__ = f"`{factory.__name__}(*size)` with this tensor's dtype and device unless given (PyTorch's)."
    return factory_options("layout", "pin_memory")(new)


Tensor.new_zeros = _new_filled(zeros)
Tensor.new_ones = _new_filled(ones)
Tensor.new_empty = _new_filled(empty)


def new_full(self, size, fill_value, dtype=None, device=None, requires_grad=False):
    """`full(size, fill_value)` with this tensor's dtype and device unless given (PyTorch's)."""
    return full(size, fill_value, requires_grad=requires_grad, **_new_kwargs(self, dtype, device))


def new_tensor(self, data, dtype=None, device=None, requires_grad=False):
    """A copy of `data` with this tensor's dtype and device unless given (PyTorch's)."""
    kw = _new_kwargs(self, dtype, device)
    if "placement" in kw:
        return tensor(data, dtype=kw["dtype"]).to_global(placement=kw["placement"], sbp=kw["sbp"]).requires_grad_(
            requires_grad)
    return tensor(data, requires_grad=requires_grad, **kw)


Tensor.new_full = factory_options("layout", "pin_memory")(new_full)
Tensor.new_tensor = factory_options("layout", "pin_memory")(new_tensor)
