"""default_collate / default_convert: samples -> batches, with torch's rules.

default_collate stacks tensors and numpy arrays along a new first axis, turns Python floats into
a float64 tensor and ints (bools) into an int64 (bool) tensor, numpy scalars into a tensor of
their dtype, keeps strings and bytes as lists, and recurses into mappings (keeping their type),
namedtuples (keeping their type), tuples (giving lists, as torch does) and other sequences.
default_convert (for `batch_size=None`) converts numpy arrays and scalars to tensors the same way
without batching. Batches are always built on the CPU, as torch's are: moving them to a device is
the training loop's job, and a DataLoader worker process must never touch a GPU.
"""
import collections.abc
import copy

import numpy as np

from ...backend import dtypes
from ...ops.creation import as_tensor, from_numpy, tensor
from ...ops.shape import stack
from ...tensor import Tensor

__all__ = ["default_collate", "default_convert"]

_ERR = "default_collate: batch must contain tensors, numpy arrays, numbers, dicts or lists; found {}"


def _is_str_obj_array(a):
    """numpy arrays of strings, bytes or objects are left alone (torch's `[SaUO]` dtype test)."""
    return a.dtype.kind in "SaUO"


def _map_like(elem, items):
    """A mapping of `elem`'s type holding `items` (a plain dict when that type can't be rebuilt)."""
    try:
        if isinstance(elem, collections.abc.MutableMapping):
            clone = copy.copy(elem)
            clone.update(items)
            return clone
        return type(elem)(items)
    except TypeError:
        return dict(items)


def _seq_like(elem, items):
    """A sequence of `elem`'s type holding `items` (a list when that type can't be rebuilt)."""
    try:
        if isinstance(elem, collections.abc.MutableSequence):
            clone = copy.copy(elem)
            for i, x in enumerate(items):
                clone[i] = x
            return clone
        return type(elem)(items)
    except TypeError:
        return list(items)


def default_collate(batch):
    """Merge a list of samples into a batch (see the module docstring for the rules)."""
    elem = batch[0]
    if isinstance(elem, Tensor):
        return stack(batch, 0)
    if isinstance(elem, np.ndarray):
        if _is_str_obj_array(elem):
            raise TypeError(_ERR.format(elem.dtype))
        return stack([from_numpy(b) for b in batch], 0)
    if isinstance(elem, (np.bool_, np.number, np.object_)):
        return as_tensor(np.array(batch))
    if isinstance(elem, float):
        return tensor(batch, dtype=dtypes.float64, device="cpu")
    if isinstance(elem, int):
        return tensor(batch, device="cpu")
    if isinstance(elem, (str, bytes)):
        return batch
    if isinstance(elem, collections.abc.Mapping):
        return _map_like(elem, {key: default_collate([d[key] for d in batch]) for key in elem})
    if isinstance(elem, tuple) and hasattr(elem, "_fields"):  # namedtuple
        return type(elem)(*(default_collate(s) for s in zip(*batch)))
    if isinstance(elem, collections.abc.Sequence):
        size = len(elem)
        if not all(len(e) == size for e in batch):
            raise RuntimeError("each element in list of batch should be of equal size")
        columns = [default_collate(s) for s in zip(*batch)]
        return columns if isinstance(elem, tuple) else _seq_like(elem, columns)
    raise TypeError(_ERR.format(type(elem)))


def default_convert(data):
    """numpy arrays and scalars inside `data` become tensors; everything else is kept."""
    if isinstance(data, Tensor):
        return data
    if isinstance(data, np.ndarray):
        return data if _is_str_obj_array(data) else as_tensor(data)
    if isinstance(data, np.generic) and not isinstance(data, (np.str_, np.bytes_)):
        return as_tensor(np.asarray(data))
    if isinstance(data, collections.abc.Mapping):
        return _map_like(data, {key: default_convert(data[key]) for key in data})
    if isinstance(data, tuple) and hasattr(data, "_fields"):
        return type(data)(*(default_convert(d) for d in data))
    if isinstance(data, tuple):
        return [default_convert(d) for d in data]
    if isinstance(data, collections.abc.Sequence) and not isinstance(data, (str, bytes)):
        return _seq_like(data, [default_convert(d) for d in data])
    return data
