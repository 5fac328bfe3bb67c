"""Samplers: iterables of dataset keys (or of lists of keys, for a batch sampler), as in torch.

Deterministic samplers (SequentialSampler, BatchSampler, DistributedSampler without shuffle)
give exactly torch's orders. Random ones follow torch's algorithms (RandomSampler draws a fresh
permutation per pass, in chunks of 32 with replacement; WeightedRandomSampler is one
`multinomial` call) but draw from engine Generators, so the numbers differ from torch's: the
same seed gives the same order within the engine, not torch's order.
"""
import numpy as np

from ...backend.random import Generator, default_generator
from ...ops.creation import as_tensor, randint, randperm
from ...ops.random_ops import multinomial
from ...backend import dtypes

__all__ = ["Sampler", "SequentialSampler", "RandomSampler", "SubsetRandomSampler", "WeightedRandomSampler",
           "BatchSampler", "draw_seed"]


def draw_seed(generator=None):
    """A 63-bit seed from `generator` (the default engine generator when None): what torch's
    `torch.empty((), dtype=torch.int64).random_(generator=g).item()` is used for."""
    return int((generator or default_generator).rng(np).integers(0, 2**63 - 1))


def _check_generator(generator):
    if generator is not None and not isinstance(generator, Generator):
        raise TypeError(f"generator must be an engine.Generator or None, got {type(generator).__name__}")
    return generator


class Sampler:
    """Base class: `__iter__` yields keys; `__len__` (optional) says how many."""

    def __iter__(self):
        raise NotImplementedError


class SequentialSampler(Sampler):
    """0, 1, ..., len(data_source) - 1."""

    def __init__(self, data_source):
        self.data_source = data_source

    def __iter__(self):
        return iter(range(len(self.data_source)))

    def __len__(self):
        return len(self.data_source)


class RandomSampler(Sampler):
    """A random permutation per pass; with `replacement`, `num_samples` independent draws.

    Without a `generator`, each pass seeds a private generator from the default one, so passes
    differ but `engine.manual_seed` makes the whole sequence reproducible (as in torch)."""

    def __init__(self, data_source, replacement=False, num_samples=None, generator=None):
        self.data_source = data_source
        self.replacement = replacement
        self._num_samples = num_samples
        self.generator = _check_generator(generator)
        if not isinstance(self.replacement, bool):
            raise TypeError(f"replacement should be a boolean value, but got replacement={self.replacement}")
        if not isinstance(self.num_samples, int) or isinstance(self.num_samples, bool) or self.num_samples <= 0:
            raise ValueError(f"num_samples should be a positive integer value, but got num_samples={self.num_samples}")

    @property
    def num_samples(self):
        return len(self.data_source) if self._num_samples is None else self._num_samples

    def __iter__(self):
        n = len(self.data_source)
        generator = self.generator
        if generator is None:
            generator = Generator().manual_seed(draw_seed())
        if self.replacement:
            for _ in range(self.num_samples // 32):
                yield from randint(0, n, (32,), generator=generator).tolist()
            yield from randint(0, n, (self.num_samples % 32,), generator=generator).tolist()
        else:
            for _ in range(self.num_samples // n):
                yield from randperm(n, generator=generator).tolist()
            yield from randperm(n, generator=generator).tolist()[:self.num_samples % n]

    def __len__(self):
        return self.num_samples


class SubsetRandomSampler(Sampler):
    """The given indices in a random order (a new one per pass)."""

    def __init__(self, indices, generator=None):
        self.indices = indices
        self.generator = _check_generator(generator)

    def __iter__(self):
        for i in randperm(len(self.indices), generator=self.generator).tolist():
            yield self.indices[i]

    def __len__(self):
        return len(self.indices)


class WeightedRandomSampler(Sampler):
    """`num_samples` indices of `weights` drawn with probability proportional to the weight."""

    def __init__(self, weights, num_samples, replacement=True, generator=None):
        if not isinstance(num_samples, int) or isinstance(num_samples, bool) or num_samples <= 0:
            raise ValueError(f"num_samples should be a positive integer value, but got num_samples={num_samples}")
        if not isinstance(replacement, bool):
            raise ValueError(f"replacement should be a boolean value, but got replacement={replacement}")
        weights = as_tensor(weights, dtype=dtypes.float64)
        if weights.ndim != 1:
            raise ValueError(f"weights should be a 1d sequence but given weights have shape {tuple(weights.shape)}")
        self.weights = weights
        self.num_samples = num_samples
        self.replacement = replacement
        self.generator = _check_generator(generator)

    def __iter__(self):
        yield from multinomial(self.weights, self.num_samples, self.replacement, generator=self.generator).tolist()

    def __len__(self):
        return self.num_samples


class BatchSampler(Sampler):
    """Lists of `batch_size` keys from `sampler`; the last, shorter one is dropped with `drop_last`."""

    def __init__(self, sampler, batch_size, drop_last):
        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size <= 0:
            raise ValueError(f"batch_size should be a positive integer value, but got batch_size={batch_size}")
        if not isinstance(drop_last, bool):
            raise ValueError(f"drop_last should be a boolean value, but got drop_last={drop_last}")
        self.sampler = sampler
        self.batch_size = batch_size
        self.drop_last = drop_last

    def __iter__(self):
        it = iter(self.sampler)
        while True:
            batch = []
            for key in it:
                batch.append(key)
                if len(batch) == self.batch_size:
                    break
            if not batch or (self.drop_last and len(batch) < self.batch_size):
                return
            yield batch

    def __len__(self):
        if self.drop_last:
            return len(self.sampler) // self.batch_size
        return (len(self.sampler) + self.batch_size - 1) // self.batch_size
