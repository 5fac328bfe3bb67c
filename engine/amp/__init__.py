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
from ..backend import capture_state, dtypes, xp_of
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
    """`fn(flag: float) -> float`, the largest flag of all ranks (registered by
    engine.distributed, so that every rank skips the same steps)."""
    global _found_inf_reducer
    _found_inf_reducer = fn


def _all_finite_on_device(arrays):
    """Whether every element of the CUDA `arrays` is finite: their largest magnitude (a NaN kept),
    by the multi-tensor norm kernels in two launches per dtype, read back once."""
    from ..kernels import grad_norm as kgn

    floats = [a for a in arrays if a.dtype.kind == "f" and a.size]
    if not floats:
        return True
    acc = np.float64 if any(a.dtype == np.float64 for a in floats) else np.float32
    return bool(xp_of(floats[0]).isfinite(kgn.grad_norm(floats, float("inf"), acc)))


class GradScaler:
    """Dynamic loss scaling for float16 training (torch.amp.GradScaler's algorithm).

    `scale(loss)` multiplies by the scale; `unscale_(optimizer)` divides the gradients by it
    (once per step) and notes whether any is inf/nan; `step(optimizer)` skips the step when one
    was, else steps; `update()` halves the scale (backoff_factor) after a skipped step and
    multiplies it by growth_factor after growth_interval clean steps in a row. With several
    ranks (sharded gradients: tensor, pipeline parallelism, ZeRO) the inf/nan check is agreed
    over every rank. `enabled=False` makes every method a pass-through."""

    def __init__(self, device="cpu", init_scale=2.0 ** 16, growth_factor=2.0, backoff_factor=0.5,
                 growth_interval=2000, enabled=True):
        if growth_factor <= 1.0:
            raise ValueError(f"GradScaler: growth_factor must be > 1, got {growth_factor}")
        if not 0.0 < backoff_factor < 1.0:
            raise ValueError(f"GradScaler: backoff_factor must be in (0, 1), got {backoff_factor}")
        self.device = device
        self._enabled = bool(enabled)
        self._scale = float(init_scale)
        self._growth_factor, self._backoff_factor = float(growth_factor), float(backoff_factor)
        self._growth_interval = int(growth_interval)
        self._growth_tracker = 0
        self._unscaled = {}  # id(optimizer) -> found_inf for this step
        self._device_scales = {}  # (device, global meta or None) -> 0-d float32 tensor holding the scale

    def is_enabled(self):
        return self._enabled

    def get_scale(self):
        return self._scale if self._enabled else 1.0

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
        every replay, and an eager GPU step copies nothing from the host."""
        key = (like._device, like._global.placement if like._global is not None else None)
        t = self._device_scales.get(key)
        if t is None:
            if capture_state() is not None:  # its fill would be a node of the graph, redone at each replay
                raise RuntimeError("GradScaler.scale: first used inside a CUDA graph capture; call it once eagerly "
                                   "before capturing (warm-up steps do), so that its scale lives outside the graph")
            tracer, _state.tracer = _state.tracer, None  # made outside the step: a trace reads it, never remakes it
            try:
                t = self._device_scales[key] = _core.scalar_tensor(self._scale, dtypes.float32, like)
            finally:
                _state.tracer = tracer
        return t

    def _set_scale(self, value):
        self._scale = float(value)
        for t in self._device_scales.values():
            t._data.fill(self._scale)

    def unscale_(self, optimizer):
        """Divide `optimizer`'s gradients by the scale, in place, and record inf/nan."""
        if not self._enabled:
            return
        if id(optimizer) in self._unscaled:
            raise RuntimeError("unscale_() has already been called on this optimizer since the last update()")
        inv = 1.0 / self._scale
        found = 0.0
        on_device = []  # GPU gradients: unscaled by one multi-tensor launch, checked by one max, read once
        for group in optimizer.param_groups:
            for p in group["params"]:
                g = p.grad
                if g is None:
                    continue
                a = g._data
                g._bump_version()
                if not isinstance(a, np.ndarray) and a.dtype.kind == "f":
                    on_device.append(a)
                    continue
                a *= a.dtype.type(inv) if a.dtype.kind == "f" else inv
                if isinstance(a, np.ndarray) and not found and not bool(np.isfinite(_host_sum(a))):
                    found = 1.0
        if on_device:
            from ..kernels import grad_norm as kgn

            kgn.multiply_grads(on_device, inv)
            if not found:
                found = 0.0 if _all_finite_on_device(on_device) else 1.0  # one host read
        if _found_inf_reducer is not None:
            found = _found_inf_reducer(found)
        self._unscaled[id(optimizer)] = found

    def step(self, optimizer, *args, **kwargs):
        """Unscale (when not done yet) and step, unless a gradient was inf/nan: then skip.
        Returns the optimizer's return value, or None when skipped."""
        if not self._enabled:
            return optimizer.step(*args, **kwargs)
        if id(optimizer) not in self._unscaled:
            self.unscale_(optimizer)
        if self._unscaled[id(optimizer)]:
            return None
        return optimizer.step(*args, **kwargs)

    def update(self, new_scale=None):
        """Adjust the scale for the next step (or set it to `new_scale`)."""
        if not self._enabled:
            return
        if new_scale is not None:
            self._set_scale(new_scale.item() if isinstance(new_scale, Tensor) else new_scale)
        elif self._unscaled:
            if any(self._unscaled.values()):
                self._set_scale(self._scale * self._backoff_factor)
                self._growth_tracker = 0
            else:
                self._growth_tracker += 1
                if self._growth_tracker == self._growth_interval:
                    self._set_scale(self._scale * self._growth_factor)
                    self._growth_tracker = 0
        self._unscaled = {}

    def found_inf(self, optimizer):
        """Whether the last unscale_ of `optimizer` found an inf/nan (the step is skipped)."""
        return bool(self._unscaled.get(id(optimizer), 0.0))

    def state_dict(self):
        if not self._enabled:
            return {}
        return {"scale": self._scale, "growth_factor": self._growth_factor, "backoff_factor": self._backoff_factor,
                "growth_interval": self._growth_interval, "_growth_tracker": self._growth_tracker}

    def load_state_dict(self, state):
        if not self._enabled:
            return
        if not state:
            raise RuntimeError("GradScaler.load_state_dict: the state is empty (saved from a disabled scaler?)")
        self._set_scale(state["scale"])
        self._growth_factor = float(state["growth_factor"])
        self._backoff_factor = float(state["backoff_factor"])
        self._growth_interval = int(state["growth_interval"])
        self._growth_tracker = int(state["_growth_tracker"])


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

