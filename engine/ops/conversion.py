"""Moving tensors between dtypes and devices: `to`, `float()`, `cuda()`, `type_as` ..."""
from .op import Op
from ..backend import as_device, device_of, dtypes, to_device
from ..tensor import Tensor, tensor_method
from ._core import cast

__all__ = []


class ToDevice(Op):
    name = "ToDevice"

    @staticmethod
    def forward(ctx, x, device):
        ctx.src_device = device_of(x)
        return to_device(x, device)

    @staticmethod
    def backward(ctx, g):
        return g.to(ctx.src_device)


def _to_device(t, dev):
    if t._device == dev:
        return t
    out = ToDevice.apply(t, device=dev)
    out._device = dev  # dispatch gives outputs the input's device; this op is the exception
    return out


def parse_to_args(args, device=None, dtype=None):
    """Fold the positional arguments of `to(...)` (Tensor.to and Module.to) into (device, dtype):
    a Tensor gives both, a dtype gives the dtype, anything else is a device if `as_device` takes
    it and a dtype otherwise; later arguments win over earlier ones and over the given defaults."""
    for a in args:
        if isinstance(a, Tensor):
            device, dtype = a.device, a.dtype
        elif isinstance(a, dtypes.dtype):
            dtype = a
        elif a is not None:
            try:
                device = as_device(a)
            except (ValueError, TypeError):
                dtype = dtypes.as_dtype(a)
    return device, dtype


@tensor_method()
def to(self, *args, dtype=None, device=None, non_blocking=False, copy=False):
    """`to(dtype)`, `to(device)`, `to(device, dtype)`, `to(other_tensor)`."""
    device, dtype = parse_to_args(args, device, dtype)
    out = self
    if device is not None:
        out = _to_device(out, as_device(device))
    if dtype is not None:
        out = cast(out, dtypes.as_dtype(dtype))
    if copy and out is self:
        out = self.clone()
    return out


def _caster(dt):
    def method(self, memory_format=None):
        return cast(self, dt)

    return method


for _n, _d in (("float", dtypes.float32), ("double", dtypes.float64), ("half", dtypes.float16),
               ("bfloat16", dtypes.bfloat16), ("long", dtypes.int64), ("int", dtypes.int32),
               ("short", dtypes.int16), ("bool", dtypes.bool_), ("byte", dtypes.uint8), ("char", dtypes.int8)):
    setattr(Tensor, _n, _caster(_d))


@tensor_method()
def type(self, dtype=None):
    if dtype is None:
        return f"engine.{self.dtype.name.capitalize()}Tensor"
    return cast(self, dtypes.as_dtype(dtype))


@tensor_method()
def type_as(self, other):
    return cast(self, other.dtype)


@tensor_method()
def cpu(self):
    return _to_device(self, as_device("cpu"))


@tensor_method()
def cuda(self, device=None):
    return _to_device(self, as_device("cuda" if device is None else device if not isinstance(device, int) else device))
