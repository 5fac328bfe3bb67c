"""Datasets, as torch.utils.data defines them.

A map-style `Dataset` answers `dataset[i]` (and usually `len(dataset)`); an `IterableDataset` is
a stream (`iter(dataset)`), which a multi-process DataLoader runs once per worker, so it must
shard itself with `get_worker_info()`. The containers here (TensorDataset, ConcatDataset,
ChainDataset, Subset, random_split) hold no data of their own and behave as their torch namesakes,
including the exception types torch raises for bad arguments.
"""
import bisect
import itertools
import math
import warnings

from ...ops.creation import randperm
from ...tensor import Tensor

__all__ = ["Dataset", "IterableDataset", "TensorDataset", "ConcatDataset", "ChainDataset", "Subset",
           "random_split"]


class Dataset:
    """A map from keys (usually 0..len-1) to samples. Subclasses implement `__getitem__` and, for
    the default samplers, `__len__`; `__getitems__(indices)` may fetch a whole batch at once."""

    def __getitem__(self, index):
        raise NotImplementedError("Subclasses of Dataset should implement __getitem__.")

    def __add__(self, other):
        return ConcatDataset([self, other])


class IterableDataset(Dataset):
    """A stream of samples. With `num_workers > 0` every worker iterates its own copy: split the
    work in `__iter__` with `get_worker_info()` or every sample comes `num_workers` times."""

    def __iter__(self):
        raise NotImplementedError("Subclasses of IterableDataset should implement __iter__.")

    def __add__(self, other):
        return ChainDataset([self, other])


class TensorDataset(Dataset):
    """Sample i is `tuple(t[i] for t in tensors)`; all tensors share their first dimension."""

    def __init__(self, *tensors):
        for t in tensors:
            if not isinstance(t, Tensor):
                raise TypeError(f"TensorDataset expects engine tensors, got {type(t).__name__}")
        assert all(tensors[0].shape[0] == t.shape[0] for t in tensors), "Size mismatch between tensors"
        self.tensors = tensors

    def __getitem__(self, index):
        return tuple(t[index] for t in self.tensors)

    def __len__(self):
        return self.tensors[0].shape[0]


class ConcatDataset(Dataset):
    """The datasets one after the other; index i finds its dataset by bisection."""

    @staticmethod
    def cumsum(sequence):
        out, total = [], 0
        for d in sequence:
            total += len(d)
            out.append(total)
        return out

    def __init__(self, datasets):
        self.datasets = list(datasets)
        if len(self.datasets) == 0:
            raise AssertionError("datasets should not be an empty iterable")
        for d in self.datasets:
            if isinstance(d, IterableDataset):
                raise AssertionError("ConcatDataset does not support IterableDataset")
        self.cumulative_sizes = self.cumsum(self.datasets)

    def __len__(self):
        return self.cumulative_sizes[-1]

    def __getitem__(self, idx):
        if idx < 0:
            if -idx > len(self):
                raise ValueError("absolute value of index should not exceed dataset length")
            idx = len(self) + idx
        which = bisect.bisect_right(self.cumulative_sizes, idx)
        sample = idx if which == 0 else idx - self.cumulative_sizes[which - 1]
        return self.datasets[which][sample]


class ChainDataset(IterableDataset):
    """Iterable datasets one after the other (what `IterableDataset + IterableDataset` makes)."""

    def __init__(self, datasets):
        self.datasets = datasets

    def __iter__(self):
        for d in self.datasets:
            if not isinstance(d, IterableDataset):
                raise AssertionError("ChainDataset only supports IterableDataset")
            yield from d

    def __len__(self):
        total = 0
        for d in self.datasets:
            if not isinstance(d, IterableDataset):
                raise AssertionError("ChainDataset only supports IterableDataset")
            total += len(d)
        return total


class Subset(Dataset):
    """`dataset` seen through `indices`: sample i is `dataset[indices[i]]`."""

    def __init__(self, dataset, indices):
        self.dataset = dataset
        self.indices = indices

    def __getitem__(self, idx):
        if isinstance(idx, list):
            return self.dataset[[self.indices[i] for i in idx]]
        return self.dataset[self.indices[idx]]

    def __getitems__(self, indices):
        # pass a whole batch on when the wrapped dataset can take one
        if callable(getattr(self.dataset, "__getitems__", None)):
            return self.dataset.__getitems__([self.indices[i] for i in indices])
        return [self.dataset[self.indices[i]] for i in indices]

    def __len__(self):
        return len(self.indices)


def random_split(dataset, lengths, generator=None):
    """Split `dataset` into non-overlapping Subsets of the given lengths (or fractions summing to
    1: floor(frac * n) each, the remainder handed out one by one from the first split on), over
    one random permutation drawn from `generator` (the default engine generator when None)."""
    if math.isclose(sum(lengths), 1) and sum(lengths) <= 1:
        sizes = []
        for i, frac in enumerate(lengths):
            if frac < 0 or frac > 1:
                raise ValueError(f"Fraction at index {i} is not between 0 and 1")
            sizes.append(math.floor(len(dataset) * frac))
        for i in range(len(dataset) - sum(sizes)):
            sizes[i % len(sizes)] += 1
        lengths = sizes
        for i, n in enumerate(lengths):
            if n == 0:
                warnings.warn(f"Length of split at index {i} is 0. This might result in an empty dataset.",
                              stacklevel=2)
    if sum(lengths) != len(dataset):
        raise ValueError("Sum of input lengths does not equal the length of the input dataset!")
    indices = randperm(sum(lengths), generator=generator).tolist()
    return [Subset(dataset, indices[end - n:end]) for end, n in zip(itertools.accumulate(lengths), lengths)]
