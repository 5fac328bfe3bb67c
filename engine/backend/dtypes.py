"""Engine dtypes and PyTorch's type-promotion rules.

A `dtype` wraps a numpy dtype (bfloat16 comes from ml_dtypes, since numpy has none). Promotion
follows PyTorch, not numpy: categories bool < integer < floating, and a higher category carried by
a 0-dim tensor or a Python scalar wins, but never widens within a category (float32 tensor * 2.0
stays float32; int64 tensor * 2.5 becomes the default float dtype).
"""
import numpy as np
import ml_dtypes


class dtype:
    __slots__ = ("name", "np", "is_floating_point", "is_signed", "itemsize", "_rank", "_category")

    def __init__(self, name, np_dtype, category, rank):
        self.name = name
        self.np = np.dtype(np_dtype)
        self._category = category  # 0 bool, 1 integer, 2 floating
        self._rank = rank
        self.is_floating_point = category == 2
        self.is_signed = name not in ("bool", "uint8")
        self.itemsize = self.np.itemsize

    def __repr__(self):
        return f"engine.{self.name}"

    def __reduce__(self):
        return (_by_name, (self.name,))


bool_ = dtype("bool", np.bool_, 0, 0)
uint8 = dtype("uint8", np.uint8, 1, 1)
int8 = dtype("int8", np.int8, 1, 1)
int16 = dtype("int16", np.int16, 1, 2)
int32 = dtype("int32", np.int32, 1, 3)
int64 = dtype("int64", np.int64, 1, 4)
float16 = dtype("float16", np.float16, 2, 1)
bfloat16 = dtype("bfloat16", ml_dtypes.bfloat16, 2, 1)
float32 = dtype("float32", np.float32, 2, 2)
float64 = dtype("float64", np.float64, 2, 3)

half, float, double = float16, float32, float64
short, int, long = int16, int32, int64

ALL_DTYPES = (bool_, uint8, int8, int16, int32, int64, float16, bfloat16, float32, float64)
_BY_NAME = {d.name: d for d in ALL_DTYPES}
_BY_NP = {d.np: d for d in ALL_DTYPES}

_default_float = float32


def _by_name(name):
    return _BY_NAME[name]


def set_default_dtype(d):
    global _default_float
    if not d.is_floating_point:
        raise TypeError(f"set_default_dtype only supports floating point dtypes, got {d}")
    _default_float = d


def get_default_dtype():
    return _default_float


def from_numpy_dtype(np_dtype):
    """Map a numpy (or cupy) dtype to an engine dtype; unsupported ones raise a clear TypeError."""
    try:
        return _BY_NP[np_dtype]
    except KeyError:
        pass
    d = np.dtype(np_dtype)
    if d in _BY_NP:
        return _BY_NP[d]
    if d.kind == "u":
        return int64
    raise TypeError(f"unsupported array dtype {d}; supported: {', '.join(_BY_NAME)}")


def as_dtype(d):
    """Accept an engine dtype, a numpy dtype, a string name, or a Python type."""
    if isinstance(d, dtype):
        return d
    if d is None:
        return None
    if d is builtins_float:
        return _default_float
    if d is builtins_int:
        return int64
    if d is builtins_bool:
        return bool_
    if isinstance(d, str) and d in _BY_NAME:
        return _BY_NAME[d]
    name = getattr(d, "name", None)  # e.g. a torch.dtype-like object is not accepted: no torch here
    if name in _BY_NAME and not hasattr(d, "kind"):
        return _BY_NAME[name]
    return from_numpy_dtype(np.dtype(d))


import builtins as _builtins  # noqa: E402

builtins_float, builtins_int, builtins_bool = _builtins.float, _builtins.int, _builtins.bool


def _promote_pair(a, b):
    if a is b:
        return a
    if a._category != b._category:
        return a if a._category > b._category else b
    if a._rank != b._rank:
        return a if a._rank > b._rank else b
    # same category and rank, different types: float16 vs bfloat16 -> float32; uint8 vs int8 -> int16
    return float32 if a._category == 2 else int16


def promote_types(a, b):
    return _promote_pair(as_dtype(a), as_dtype(b))


def scalar_dtype(value):
    """The dtype PyTorch gives a Python scalar when it is the only participant."""
    if isinstance(value, _builtins.bool):
        return bool_
    if isinstance(value, _builtins.int):
        return int64
    return _default_float


def result_type(tensor_dtypes, zero_dim_dtypes=(), scalars=()):
    """PyTorch's result_type: dimensioned tensors first, then 0-dim tensors, then Python scalars;
    a later group only matters when its category is higher than what the earlier groups give."""
    result = None
    for group in (tensor_dtypes, zero_dim_dtypes):
        if not group:
            continue
        g = group[0]
        for d in group[1:]:
            g = _promote_pair(g, d)
        if result is None or g._category > result._category:
            result = g
    if scalars:
        cat = max(scalar_dtype(s)._category for s in scalars)
        if result is None or cat > result._category:
            result = (bool_, int64, _default_float)[cat]
    return result
