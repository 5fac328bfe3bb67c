"""Emulator of engine/kernels/scatter_add.py: the sorted segment sums of a deterministic
scatter-add. It checks what the kernel assumes (sorted targets, a permutation as the order,
buffer sizes, any grid: the kernel loops grid-stride) and adds with numpy's add.at, whose
sequential order within each target is the kernel's."""
import numpy as np

from . import emulates
from .norm_act import _buf, _elem, _scalars, _warps


@emulates("engine_segment_add")
def _segment_add(name, grid, block, args, shared_mem):
    target, order, vals, out, *scalars = args
    n, cols, rows = _scalars(name, scalars, (np.int64, np.int64, np.int64))
    _warps(name, block)
    t = _elem(name)
    target = _buf(name, "target", target, n, np.int64)
    order = _buf(name, "order", order, n, np.int64)
    if n > 1 and (np.diff(target) < 0).any():
        raise ValueError(f"{name}: the targets are not sorted (the kernel adds runs of equal targets)")
    if not np.array_equal(np.sort(order), np.arange(n)):
        raise ValueError(f"{name}: order is not a permutation of the {n} values")
    vals2 = _buf(name, "vals", vals, n * cols, t).reshape(n, cols)
    out2 = _buf(name, "out", out, rows * cols, t).reshape(rows, cols)
    inside = (target >= 0) & (target < rows)
    np.add.at(out2, target[inside], vals2[order[inside]])


_WORDS = {"u8": np.uint8, "u16": np.uint16, "u32": np.uint32, "u64": np.uint64}


@emulates("engine_segment_store")
def _segment_store(name, grid, block, args, shared_mem):
    """The last value of each run of equal sorted targets written (words of the element's size)."""
    target, order, vals, out, *scalars = args
    n, cols, rows = _scalars(name, scalars, (np.int64, np.int64, np.int64))
    _warps(name, block)
    word = _WORDS[name.split("__", 1)[1]]
    target = _buf(name, "target", target, n, np.int64)
    order = _buf(name, "order", order, n, np.int64)
    if n > 1 and (np.diff(target) < 0).any():
        raise ValueError(f"{name}: the targets are not sorted (the kernel writes the last of each run)")
    vals2 = _buf(name, "vals", vals, n * cols, word).reshape(n, cols)
    out2 = _buf(name, "out", out, rows * cols, word).reshape(rows, cols)
    last = np.append(target[1:] != target[:-1], True) & (target >= 0) & (target < rows)
    out2[target[last]] = vals2[order[last]]
