"""Switches for gradient recording, usable as context managers and decorators."""
import functools
import threading


class _State(threading.local):
    enabled = True
    # engine.amp.autocast: (device type, low-precision engine dtype) while active, else None.
    # Kept here, with the grad mode, because Op.apply reads it on every call and backward
    # turns it off (as PyTorch, autocast shapes the forward; backward follows its dtypes).
    autocast = None
    # autocast(cache_enabled=...): whether autocast reuses parameters' low-precision copies
    # (engine/ops/cast_cache.py) instead of casting them at every use
    autocast_cache = True
    # engine.autograd.trace.Tracer while nn.Graph captures a step (every kernel door reports to it)
    tracer = None
    # engine.cuda.CUDAGraph while it captures (the gradients its backward creates are recorded)
    cuda_graph = None
    # the implicit gradient of a scalar loss (1, or 1/n in an nn.Graph accumulating n micro-batches)
    grad_root_scale = 1.0
    # nn.Graph.set_grad_scaler: fn(loss) -> the 0-d scale tensor that multiplies the implicit
    # gradient of a scalar loss (OneFlow's graph scales `loss.backward()` itself), else None
    loss_scale = None


_state = _State()


def is_grad_enabled():
    return _state.enabled


class _GradMode:
    mode = None

    def __enter__(self):
        self._prev = _state.enabled
        _state.enabled = self.mode

    def __exit__(self, *exc):
        _state.enabled = self._prev
        return False

    def __call__(self, fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with self.__class__():
                return fn(*args, **kwargs)

        return wrapper


class no_grad(_GradMode):
    mode = False


class enable_grad(_GradMode):
    mode = True


class set_grad_enabled(_GradMode):
    def __init__(self, mode):
        self.mode = bool(mode)
        self._prev = _state.enabled
        _state.enabled = self.mode  # like torch: takes effect as a plain call too

    def __enter__(self):
        pass

    def __call__(self, fn):
        _state.enabled = self._prev
        mode = self.mode

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with set_grad_enabled(mode):
                return fn(*args, **kwargs)

        return wrapper


class inference_mode(no_grad):
    def __init__(self, mode=True):
        self.mode = not mode
