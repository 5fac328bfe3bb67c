"""Padding layers over `F.pad`, as torch's: `ReflectionPad1d/2d/3d`, `ReplicationPad1d/2d/3d`,
`ZeroPad1d/2d/3d`, `ConstantPad1d/2d/3d`, `CircularPad1d/2d/3d`.

An int padding is repeated to 2, 4 or 6 widths (left, right, top, bottom, front, back); a tuple is
kept as given (torch's `_ntuple` checks no length), so F.pad reports any mismatch. Only the
circular layers check the input rank themselves (torch's ValueError); the others leave it to
F.pad, as torch does. Each family is one base class; its 1d/2d/3d classes differ only in `dims`
and are made by `_by_rank`.
"""
from .. import functional as F
from ..module import Module
from .conv import _ntuple

__all__ = ["CircularPad1d", "CircularPad2d", "CircularPad3d", "ConstantPad1d", "ConstantPad2d", "ConstantPad3d",
           "ReflectionPad1d", "ReflectionPad2d", "ReflectionPad3d", "ReplicationPad1d", "ReplicationPad2d",
           "ReplicationPad3d", "ZeroPad1d", "ZeroPad2d", "ZeroPad3d"]


class _PadNd(Module):
    """F.pad(input, self.padding, mode) for a padding over `dims` trailing dims."""

    mode = "constant"
    dims = 1

    def __init__(self, padding):
        super().__init__()
        self.padding = _ntuple(padding, 2 * self.dims)

    def forward(self, input):
        return F.pad(input, self.padding, self.mode)

    def extra_repr(self):
        return f"{self.padding}"


class _CircularPadNd(_PadNd):
    mode = "circular"

    def forward(self, input):
        if input.dim() not in (self.dims + 1, self.dims + 2):
            raise ValueError(f"expected {self.dims + 1}D or {self.dims + 2}D input (got {input.dim()}D input)")
        return super().forward(input)


class _ReflectionPadNd(_PadNd):
    mode = "reflect"


class _ReplicationPadNd(_PadNd):
    mode = "replicate"


class _ConstantPadNd(_PadNd):
    def __init__(self, padding, value):
        super().__init__(padding)
        self.value = value

    def forward(self, input):
        return F.pad(input, self.padding, "constant", self.value)

    def extra_repr(self):
        return f"padding={self.padding}, value={self.value}"


class _ZeroPadNd(_ConstantPadNd):
    def __init__(self, padding):
        super().__init__(padding, 0.0)

    def extra_repr(self):
        return f"{self.padding}"


def _by_rank(family, base, *extra_bases):
    """The 1d, 2d and 3d classes of a padding family: `base` padding 1, 2 or 3 trailing dims (an
    extra base per rank: ZeroPadNd derives from ConstantPadNd, as torch's)."""
    return tuple(type(f"{family}{d}d", (base,) + tuple(b[d - 1] for b in extra_bases),
                      {"dims": d, "__module__": __name__}) for d in (1, 2, 3))


CircularPad1d, CircularPad2d, CircularPad3d = _by_rank("CircularPad", _CircularPadNd)
ReflectionPad1d, ReflectionPad2d, ReflectionPad3d = _by_rank("ReflectionPad", _ReflectionPadNd)
ReplicationPad1d, ReplicationPad2d, ReplicationPad3d = _by_rank("ReplicationPad", _ReplicationPadNd)
ConstantPad1d, ConstantPad2d, ConstantPad3d = _by_rank("ConstantPad", _ConstantPadNd)
ZeroPad1d, ZeroPad2d, ZeroPad3d = _by_rank("ZeroPad", _ZeroPadNd, (ConstantPad1d, ConstantPad2d, ConstantPad3d))
