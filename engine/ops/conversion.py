"""Moving tensors between dtypes and devices: `to`, `float()`, `cuda()`, `type_as` ...; what a dtype
can hold (`finfo`, `iinfo`), and torch's legacy tensor types (`FloatTensor`, `LongTensor`, ...)."""
import builtins

import ml_dtypes
import numpy as np

from .op import Op
from ..backend import as_device, device_of, dtypes, to_device
from ..tensor import Tensor, tensor_method
from ._core import cast
from .formats import check_memory_format

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
    meta = None
    if t._global is not None:  # the placement's device type changes; its ranks and SBP stay
        if t._global.placement.type == dev.type:
            return t
        meta, dev = t._global.on_device_type(dev.type)
    elif t._device == dev:
        return t
    out = ToDevice.apply(t, device=dev)  # a global tensor: each rank moves its own shard
    out._device = dev  # dispatch gives outputs the input's device (and layout); this op is the exception
    if meta is not None:
        out._global = meta
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
def to(self, *args, dtype=None, device=None, non_blocking=False, copy=False, memory_format=None):
    """`to(dtype)`, `to(device)`, `to(device, dtype)`, `to(other_tensor)`."""
    check_memory_format("to", memory_format)
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
        check_memory_format("cast", memory_format)
        return cast(self, dt)

    return method


for _n, _d in (("float", dtypes.float32), ("double", dtypes.float64), ("half", dtypes.float16),
               ("bfloat16", dtypes.bfloat16), ("long", dtypes.int64), ("int", dtypes.int32),
               ("short", dtypes.int16), ("bool", dtypes.bool_), ("byte", dtypes.uint8), ("char", dtypes.int8)):
    setattr(Tensor, _n, _caster(_d))


@tensor_method()
def type(self, dtype=None):
    if dtype is None:
        return f"engine.{_LEGACY_NAMES[self.dtype.name]}"
    if isinstance(dtype, str) and dtype.split(".")[-1] in _LEGACY:
        dtype = _LEGACY[dtype.split(".")[-1]]
    return cast(self, dtype.dtype if isinstance(dtype, LegacyTensorType) else dtypes.as_dtype(dtype))


@tensor_method()
def type_as(self, other):
    return cast(self, other.dtype)


@tensor_method()
def cpu(self):
    return _to_device(self, as_device("cpu"))


@tensor_method()
def cuda(self, device=None):
    return _to_device(self, as_device("cuda" if device is None else device if not isinstance(device, int) else device))


# ------------------------------------------------------------------ finfo / iinfo
class _TypeInfo:
    """What torch.finfo/iinfo share: equal when they describe the same dtype, printed as torch's.
    (`type` in this module is Tensor.type, hence builtins.type.)"""

    _fields = ()

    def __eq__(self, other):
        return builtins.type(other) is builtins.type(self) and other.dtype == self.dtype

    def __hash__(self):
        return hash((builtins.type(self).__name__, self.dtype))

    def __repr__(self):
        fields = ", ".join(f"{f}={getattr(self, f):g}" for f in self._fields)
        return f"{builtins.type(self).__name__}({fields}, dtype={self.dtype})"


class finfo(_TypeInfo):
    """Machine limits of a floating dtype, as torch.finfo: bits, eps, max, min, tiny
    (= smallest_normal), resolution, and dtype (its name). finfo() describes the default dtype."""

    _fields = ("resolution", "min", "max", "eps", "smallest_normal", "tiny")

    def __init__(self, type=None):
        d = dtypes.get_default_dtype() if type is None else dtypes.as_dtype(type)
        if not d.is_floating_point:
            raise TypeError("torch.finfo() requires a floating point input type. Use torch.iinfo to handle "
                            "'torch.finfo'")
        info = ml_dtypes.finfo(d.np)
        self.bits = info.bits
        self.eps, self.max, self.min = float(info.eps), float(info.max), float(info.min)
        self.tiny = self.smallest_normal = float(info.smallest_normal)
        self.resolution = 10.0 ** -info.precision
        self.dtype = d.name


class iinfo(_TypeInfo):
    """Limits of an integer dtype, as torch.iinfo: bits, max, min, and dtype (its name)."""

    _fields = ("min", "max")

    def __init__(self, type):
        d = dtypes.as_dtype(type)
        if d is dtypes.bool_:
            raise TypeError("torch.bool is not supported by torch.iinfo")
        if d.is_floating_point:
            raise TypeError("torch.iinfo() requires an integer input type. Use torch.finfo to handle "
                            "'torch.iinfo'")
        info = np.iinfo(d.np)
        self.bits, self.max, self.min, self.dtype = info.bits, int(info.max), int(info.min), d.name


# ------------------------------------------------------------------ legacy tensor types
class LegacyTensorType(builtins.type):  # (`type` here is Tensor.type, defined above)
    """torch.FloatTensor & co.: calling one makes a tensor of its dtype (`FloatTensor([1, 2])`,
    or uninitialised `FloatTensor(2, 3)`), and `isinstance(t, FloatTensor)` tests the dtype."""

    def __call__(cls, *args, device=None):
        if args and isinstance(args[0], Tensor):
            if args[0].dtype is not cls.dtype:
                raise TypeError(f"expected {cls.__name__} (dtype {cls.dtype.name}), got a tensor of dtype "
                                f"{args[0].dtype.name}")
            return args[0]
        return Tensor(*args, dtype=cls.dtype, device=device)

    def __instancecheck__(cls, obj):
        return isinstance(obj, Tensor) and obj.dtype is cls.dtype

    def __repr__(cls):
        return f"<class 'engine.{cls.__name__}'>"


_LEGACY_NAMES = {"float32": "FloatTensor", "float64": "DoubleTensor", "float16": "HalfTensor",
                 "bfloat16": "BFloat16Tensor", "int64": "LongTensor", "int32": "IntTensor", "int16": "ShortTensor",
                 "int8": "CharTensor", "uint8": "ByteTensor", "bool": "BoolTensor"}
_LEGACY = {name: LegacyTensorType(name, (), {"dtype": getattr(dtypes, dt if dt != "bool" else "bool_")})
           for dt, name in _LEGACY_NAMES.items()}
FloatTensor, DoubleTensor, HalfTensor, BFloat16Tensor, LongTensor, IntTensor, ShortTensor, CharTensor, ByteTensor, \
    BoolTensor = _LEGACY.values()
