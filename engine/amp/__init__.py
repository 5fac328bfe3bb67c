"""Automatic mixed precision: `autocast` and `GradScaler`, as torch.amp.

    with engine.autocast("cpu", dtype=engine.bfloat16):     # or engine.amp.autocast
        loss = model(x)                                      # matmuls in bfloat16, losses in float32
    scaler.scale(loss).backward()                            # float16: scale the loss
    scaler.step(optimizer); scaler.update()                  # skipped on inf/nan, scale adjusted

Autocast casts the floating inputs of each op by the op's policy (`Op.autocast`, PyTorch's
lists): matmul, linear, einsum, conv2d and fused attention run in the low dtype; the losses
(cross-entropy, nll, mse/l1/smooth-l1/bce) in float32; under a CUDA autocast also softmax,
log-softmax, layer_norm, normalize and cosine similarity (on the CPU they follow their inputs,
as PyTorch's CPU autocast does); every other op runs in its inputs' dtypes (float32 + float16
promotes to float32). float64 inputs are never cast. Casts are recorded, so gradients come
back in each input's own dtype: parameters stay float32 (the master weights) and receive
float32 gradients. Backward runs without autocast, in the dtypes its forward saw.

On the CPU this is for correctness and memory: numpy computes float16 and bfloat16 (ml_dtypes)
far slower than float32, so a step under autocast is slower, not faster (docs/benchmarks.md).
"""
import functools

import numpy as np

from ..autograd.grad_mode import _state
from ..backend import capture_state, dtypes, refuse_in_capture, xp_of
from ..kernels import loss_scale
from ..ops import _core, cast_cache
from ..tensor import Tensor

__all__ = ["autocast", "GradScaler", "StaticGradScaler", "is_autocast_enabled", "get_autocast_dtype",
           "is_autocast_cache_enabled", "clear_autocast_cache"]

_DEFAULT_DTYPES = {"cpu": dtypes.bfloat16, "cuda": dtypes.float16}


class autocast:
    """Context manager (and decorator): ops run with PyTorch's autocast policy for `device_type`
    ("cpu" or "cuda") in `dtype` (default: bfloat16 on the CPU, float16 on CUDA).
    `enabled=False` turns an enclosing autocast off. `cache_enabled` (default True) reuses each
    parameter's low-precision copy while the parameter is unchanged, across steps
    (engine/ops/cast_cache.py); False casts a parameter at every use."""

    def __init__(self, device_type, dtype=None, enabled=True, cache_enabled=None):
        if device_type not in _DEFAULT_DTYPES:
            raise ValueError(f"autocast: device_type must be 'cpu' or 'cuda', got {device_type!r}")
        dtype = _DEFAULT_DTYPES[device_type] if dtype is None else dtypes.as_dtype(dtype)
        if dtype not in (dtypes.float16, dtypes.bfloat16):
            raise ValueError(f"autocast: dtype must be float16 or bfloat16, got {dtype}")
        if enabled and device_type == "cuda" and dtype == dtypes.bfloat16:
            raise TypeError("autocast('cuda', dtype=bfloat16): CuPy has no bfloat16, so the engine computes "
                            "half precision on CUDA in float16; use dtype=float16 with engine.amp.GradScaler")
        self.device_type, self.fast_dtype, self.enabled = device_type, dtype, bool(enabled)
        self.cache_enabled = cache_enabled

    def __enter__(self):
        self._prev = _state.autocast, _state.autocast_cache
        _state.autocast = (self.device_type, self.fast_dtype) if self.enabled else None
        if self.cache_enabled is not None:
            _state.autocast_cache = bool(self.cache_enabled)
        return self

    def __exit__(self, *exc):
        _state.autocast, _state.autocast_cache = self._prev
        return False

    def __call__(self, fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with autocast(self.device_type, self.fast_dtype, self.enabled, self.cache_enabled):
                return fn(*args, **kwargs)

        return wrapper


def is_autocast_cache_enabled():
    """Whether autocast reuses parameters' low-precision copies (torch.is_autocast_cache_enabled)."""
    return _state.autocast_cache


def clear_autocast_cache():
    """Free every parameter's low-precision copy kept by autocast (torch.clear_autocast_cache);
    the next use under autocast casts again."""
    cast_cache.clear()


def is_autocast_enabled(device_type=None):
    mode = _state.autocast
    return mode is not None and (device_type is None or mode[0] == device_type)


def get_autocast_dtype(device_type):
    mode = _state.autocast
    return mode[1] if mode is not None and mode[0] == device_type else _DEFAULT_DTYPES[device_type]


# ------------------------------------------------------------------ loss scaling
_found_inf_reducer = None  # engine.distributed registers a max over every rank here


def set_found_inf_reducer(fn):
    """`fn(flag) -> flag`, the largest flag of all ranks (registered by engine.distributed, so
    that every rank skips the same steps). In one process it must give the flag back as it came
    (a 0-d device array stays on the device: nothing is read back)."""
    global _found_inf_reducer
    _found_inf_reducer = fn


class DeviceFlag:
    """A step's inf/nan flag computed on the GPU (a 0-d float32 array, 1.0 when an unscaled
    gradient was not finite). Its host copy is queued at once into page-locked memory behind an
    event, so `value()` waits for that event only: asked a step later, the GPU is long past it,
    and the host never waits for the work queued after it. GradScaler and the optimizers that
    skip on it (Adam, AdamW: `_step_supports_amp_scaling`) read it that way."""

    __slots__ = ("found", "_host", "_event", "_value")

    def __init__(self, found):
        import cupyx

        self.found = found
        self._host = cupyx.empty_pinned((), dtype=np.float32)
        with xp_of(found).cuda.Device(found.device.id):  # the copy and its event on the flag's GPU and stream
            found.get(out=self._host, blocking=False)  # queued after the kernels that set it
            self._event = xp_of(found).cuda.Event(disable_timing=True)
            self._event.record()
        self._value = None

    def value(self):
        """The flag as a Python float (0.0 or 1.0), read once."""
        if self._value is None:
            self._event.synchronize()
            self._value = float(self._host)
            self._host = self._event = None
        return self._value


def flag_value(flag):
    """A found-inf flag as a float, whether a host float or a DeviceFlag."""
    return flag.value() if isinstance(flag, DeviceFlag) else float(flag)


class _DeviceScale:
    """The scale (0-d float32) and the run of clean steps (0-d int32) on one GPU: what the
    unscale kernel reads and the update kernel advances, so that no step waits for its flag."""

    __slots__ = ("scale", "tracker")

    def __init__(self, xp, scale, tracker):
        self.scale = xp.full((), scale, dtype=np.float32)
        self.tracker = xp.full((), tracker, dtype=np.int32)


class GradScaler:
    """Dynamic loss scaling for float16 training (torch.amp.GradScaler's algorithm).

    `scale(loss)` multiplies by the scale; `unscale_(optimizer)` divides the gradients by it
    (once per step) and notes whether any is inf/nan; `step(optimizer)` skips the step when one
    was, else steps; `update()` halves the scale (backoff_factor) after a skipped step and
    multiplies it by growth_factor after growth_interval clean steps in a row. With several
    ranks (sharded gradients: tensor, pipeline parallelism, ZeRO) the inf/nan check is agreed
    over every rank. `enabled=False` makes every method a pass-through.

    On one GPU nothing in a step waits for the device (docs/cuda.md, "Loss scaling without a
    host read"): the scale and its run of clean steps live on the device, unscale_ raises a
    device flag, Adam/AdamW skip on that flag inside their kernel, update() advances the scale
    on the device. The host learns each flag a step later (DeviceFlag), to keep `get_scale()`,
    `state_dict()` and the optimizer's step counts exact; `found_inf()` waits for it."""

    def __init__(self, device="cpu", init_scale=2.0 ** 16, growth_factor=2.0, backoff_factor=0.5,
                 growth_interval=2000, enabled=True):
        if growth_factor <= 1.0:
            raise ValueError(f"GradScaler: growth_factor must be > 1, got {growth_factor}")
        if not 0.0 < backoff_factor < 1.0:
            raise ValueError(f"GradScaler: backoff_factor must be in (0, 1), got {backoff_factor}")
        self.device = device
        self._enabled = bool(enabled)
        self._scale = float(np.float32(init_scale))  # a float32 value, as torch's scale tensor
        self._growth_factor, self._backoff_factor = float(growth_factor), float(backoff_factor)
        self._growth_interval = int(growth_interval)
        self._growth_tracker = 0
        self._unscaled = {}  # id(optimizer) -> found_inf for this step (a float, or a DeviceFlag)
        self._device_scales = {}  # (device, global meta or None) -> 0-d float32 tensor holding the scale
        self._on_gpu = {}  # CUDA device id -> _DeviceScale (the scale tensors there share its array)
        self._unsettled = []  # the device flags of past updates, oldest first, not yet in _scale

    def is_enabled(self):
        return self._enabled

    def get_scale(self):
        if not self._enabled:
            return 1.0
        self._settle()
        return self._scale

    def get_growth_factor(self):
        return self._growth_factor

    def get_backoff_factor(self):
        return self._backoff_factor

    def get_growth_interval(self):
        return self._growth_interval

    def scale(self, outputs):
        """`outputs` (a tensor or nested lists/tuples of tensors) times the scale."""
        if not self._enabled:
            return outputs
        if isinstance(outputs, Tensor):
            if outputs._device.type == "cpu" and _state.tracer is None:
                self._settle()
                return outputs * self._scale
            # on a GPU, and inside an nn.Graph trace: a tensor that update() refreshes in place,
            # so a replay multiplies by the current scale, not the traced one
            return outputs * self._scale_on(outputs)
        if isinstance(outputs, (list, tuple)):
            return type(outputs)(self.scale(o) for o in outputs)
        raise TypeError(f"GradScaler.scale: expected a tensor or a list/tuple of tensors, got {type(outputs).__name__}")

    def _scale_on(self, like):
        """The scale as a 0-d float32 tensor on `like`'s device (a constant on its placement when
        global), kept and refreshed in place by update(): a CUDA graph that captured
        `scale(loss)`, or an nn.Graph that traced it, then multiplies by the current scale at
        every replay, and an eager GPU step copies nothing from the host. On a GPU it holds the
        device's _DeviceScale array itself, which update() advances there."""
        key = (like._device, like._global.placement if like._global is not None else None)
        t = self._device_scales.get(key)
        if t is None:
            if capture_state() is not None:  # its fill would be a node of the graph, redone at each replay
                raise RuntimeError("GradScaler.scale: first used inside a CUDA graph capture; call it once eagerly "
                                   "before capturing (warm-up steps do), so that its scale lives outside the graph")
            tracer, _state.tracer = _state.tracer, None  # made outside the step: a trace reads it, never remakes it
            try:
                if xp_of(like._data) is np:
                    self._settle()
                    t = _core.scalar_tensor(self._scale, dtypes.float32, like)
                else:
                    t = _core.constant_like(self._gpu_state(like._data).scale, like)
                self._device_scales[key] = t
            finally:
                _state.tracer = tracer
        return t

    def _gpu_state(self, array):
        """The _DeviceScale of the GPU holding `array`, made from the host's values on first use."""
        dev = array.device.id
        state = self._on_gpu.get(dev)
        if state is None:
            self._settle()
            with xp_of(array).cuda.Device(dev):
                state = self._on_gpu[dev] = _DeviceScale(xp_of(array), self._scale, self._growth_tracker)
        return state

    def _set_scale(self, value, tracker=None):
        """Set the scale (and the run of clean steps) from the host, everywhere it is kept."""
        self._scale = float(np.float32(value))
        if tracker is not None:
            self._growth_tracker = int(tracker)
        for t in self._device_scales.values():
            if xp_of(t._data) is np:
                t._data.fill(self._scale)
        for dev, state in self._on_gpu.items():  # the GPU scale tensors share these arrays
            with xp_of(state.scale).cuda.Device(dev):
                state.scale.fill(self._scale)
                state.tracker.fill(self._growth_tracker)

    def _settle(self):
        """Bring the host's scale up to date with the updates the device made (each flag read
        once it is known; see DeviceFlag)."""
        pending, self._unsettled = self._unsettled, []
        for flags in pending:
            found = any(flag_value(f) for f in flags)
            self._scale, self._growth_tracker = loss_scale.next_scale(
                self._scale, self._growth_tracker, found, self._growth_factor, self._backoff_factor,
                self._growth_interval)

    def unscale_(self, optimizer):
        """Divide `optimizer`'s gradients by the scale, in place, and record inf/nan."""
        if not self._enabled:
            return
        if id(optimizer) in self._unscaled:
            raise RuntimeError("unscale_() has already been called on this optimizer since the last update()")
        host, on_device = [], []  # GPU gradients: unscaled and checked by one launch per dtype
        for group in optimizer.param_groups:
            for p in group["params"]:
                g = p.grad
                if g is None:
                    continue
                g._bump_version()
                a = g._data
                (host if isinstance(a, np.ndarray) or a.dtype.kind != "f" else on_device).append(a)
        if on_device and not host and len({a.device.id for a in on_device}) == 1:
            # its flag's host copy and event would be replayed into memory the host has let go
            refuse_in_capture("GradScaler.unscale_ (and step, update)")
            found = self._unscale_on_device(on_device)
        else:
            found = self._unscale_on_host(host, on_device)
        if _found_inf_reducer is not None:
            found = _found_inf_reducer(found)
        if not isinstance(found, float):  # one process: the device flag, its host copy queued
            found = DeviceFlag(found)
        self._unscaled[id(optimizer)] = found

    def _unscale_on_device(self, arrays):
        """One launch per dtype: each gradient times 1 / the device's scale, a fresh device flag
        raised on inf/nan (returned, not read)."""
        from ..kernels import grad_norm as kgn

        state = self._gpu_state(arrays[0])
        with xp_of(arrays[0]).cuda.Device(arrays[0].device.id):
            found = xp_of(arrays[0]).zeros((), dtype=np.float32)
            kgn.unscale_grads(arrays, state.scale, found)
        return found

    def _unscale_on_host(self, host, on_device):
        """The gradients divided by the scale, the inf/nan check read back (a host float): host
        gradients by the device kernel's numpy reference, GPU ones by that kernel on each GPU
        (gradients on host and GPU at once, or on several GPUs)."""
        from ..kernels import grad_norm as kgn

        self._settle()
        flag = np.zeros((), np.float32)
        floats = [a for a in host if isinstance(a, np.ndarray) and a.dtype.kind == "f"]
        kgn.unscale_grads_numpy(floats, np.float32(self._scale), flag)
        found = float(flag)
        inv = float(kgn.unscale_factor(self._scale, np.float64))
        with np.errstate(all="ignore"):  # an inf inverse scale (a scale that underflowed): found below
            for a in host:
                if isinstance(a, np.ndarray) and a.dtype.kind == "f":
                    continue
                a *= inv  # bfloat16 (ml_dtypes, kind "V")
                if isinstance(a, np.ndarray) and not found and not bool(np.isfinite(_host_sum(a))):
                    found = 1.0
        by_device = {}
        for a in on_device:
            by_device.setdefault(a.device.id, []).append(a)
        for arrays in by_device.values():
            if float(self._unscale_on_device(arrays)):  # one host read per GPU
                found = 1.0
        return found

    def step(self, optimizer, *args, **kwargs):
        """Unscale (when not done yet) and step, unless a gradient was inf/nan: then skip.
        Returns the optimizer's return value, or None when skipped. With a device flag and an
        optimizer that takes one (`_step_supports_amp_scaling`), the step is queued and its
        kernel skips on the flag: the return value is then the optimizer's either way."""
        if not self._enabled:
            return optimizer.step(*args, **kwargs)
        if id(optimizer) not in self._unscaled:
            self.unscale_(optimizer)
        found = self._unscaled[id(optimizer)]
        if isinstance(found, DeviceFlag) and getattr(optimizer, "_step_supports_amp_scaling", False):
            optimizer.found_inf = found
            try:
                return optimizer.step(*args, **kwargs)
            finally:
                del optimizer.found_inf
        if flag_value(found):
            return None
        return optimizer.step(*args, **kwargs)

    def update(self, new_scale=None):
        """Adjust the scale for the next step (or set it to `new_scale`)."""
        if not self._enabled:
            return
        flags, self._unscaled = list(self._unscaled.values()), {}
        if new_scale is not None:
            self._settle()
            self._set_scale(new_scale.item() if isinstance(new_scale, Tensor) else new_scale)
        elif flags and all(isinstance(f, DeviceFlag) for f in flags) and self._update_on_device(flags):
            self._settle()  # the earlier steps' flags (long done): at most this step's stays unread
            self._unsettled.append(flags)
        elif flags:
            self._settle()
            found = any(flag_value(f) for f in flags)
            self._set_scale(*loss_scale.next_scale(self._scale, self._growth_tracker, found, self._growth_factor,
                                                   self._backoff_factor, self._growth_interval))

    def _update_on_device(self, flags):
        """The update kernel on the flags' GPU, when every scale this scaler keeps lives there;
        False (nothing done) otherwise."""
        dev = flags[0].found.device.id
        state = self._on_gpu.get(dev)
        if state is None or any(f.found.device.id != dev for f in flags) or set(self._on_gpu) != {dev} or any(
                t._data is not state.scale for t in self._device_scales.values()) \
                or self._growth_interval > np.iinfo(np.int32).max:  # the kernel's int
            return False
        xp = xp_of(state.scale)
        with xp.cuda.Device(dev):
            found = flags[0].found
            for f in flags[1:]:  # several optimizers: skipped together when any found one
                found = xp.maximum(found, f.found)
            loss_scale.update_scale(state.scale, state.tracker, found, self._growth_factor, self._backoff_factor,
                                    self._growth_interval)
        return True

    def found_inf(self, optimizer):
        """Whether the last unscale_ of `optimizer` found an inf/nan (the step is skipped); on a
        GPU this waits for the flag."""
        return bool(flag_value(self._unscaled.get(id(optimizer), 0.0)))

    def state_dict(self):
        if not self._enabled:
            return {}
        self._settle()
        return {"scale": self._scale, "growth_factor": self._growth_factor, "backoff_factor": self._backoff_factor,
                "growth_interval": self._growth_interval, "_growth_tracker": self._growth_tracker}

    def load_state_dict(self, state):
        if not self._enabled:
            return
        if not state:
            raise RuntimeError("GradScaler.load_state_dict: the state is empty (saved from a disabled scaler?)")
        self._settle()
        self._growth_factor = float(state["growth_factor"])
        self._backoff_factor = float(state["backoff_factor"])
        self._growth_interval = int(state["growth_interval"])
        self._set_scale(state["scale"], state["_growth_tracker"])


class StaticGradScaler(GradScaler):
    """OneFlow's `flow.amp.StaticGradScaler(scale_factor)`: loss scaling by a constant. The
    gradients are unscaled before clipping and a step whose gradients hold inf/nan is skipped,
    as with GradScaler, but the scale never changes."""

    def __init__(self, scale_factor, device="cpu"):
        scale_factor = float(scale_factor)
        if not scale_factor > 0.0 or not np.isfinite(scale_factor):
            raise ValueError(f"StaticGradScaler: scale_factor must be a positive finite number, got {scale_factor}")
        super().__init__(device, init_scale=scale_factor)

    def update(self, new_scale=None):
        """Ends the step (the next unscale_ is allowed); the scale stays, unless `new_scale` sets it."""
        if new_scale is not None:
            self._set_scale(new_scale.item() if isinstance(new_scale, Tensor) else new_scale)
        self._unscaled = {}


def _host_sum(a):
    """The sum of numpy array `a` as a Python float (inf/nan when any element is)."""
    with np.errstate(invalid="ignore", over="ignore"):  # inf - inf is the nan we are looking for
        s = a.sum(dtype=np.float64) if a.dtype.kind == "f" else np.asarray(a, dtype=np.float64).sum()
    return float(s)

