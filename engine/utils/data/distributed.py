"""DistributedSampler: each data-parallel replica reads its own share of a dataset, as in torch.

The index arithmetic is torch's, so the partition (padding included) is the same for the same
(len, num_replicas, rank, drop_last) without shuffling; with shuffling the permutation comes
from an engine Generator seeded with `seed + epoch`, identical on every replica but not equal to
torch's.

Default `num_replicas` / `rank`: engine.distributed registers, when it loads, a function giving
(world size, rank) once its process layer (MPI) is initialised; this layer never imports it. When
MPI is not started yet, the RANK / WORLD_SIZE variables exported by
`python -m engine.distributed.launch` are used (they are what MPI will report), else 1 / 0. The
sampler never starts MPI itself.
"""
import math
import os

from ...backend.random import Generator
from ...ops.creation import randperm
from .sampler import Sampler

__all__ = ["DistributedSampler", "set_world_info_source"]

_world_info_source = None


def set_world_info_source(fn):
    """engine.distributed registers `fn() -> (world_size, rank)` here, or None while its process
    layer is not initialised."""
    global _world_info_source
    _world_info_source = fn


def world_info():
    """(world size, rank) of this process for data-parallel defaults."""
    info = _world_info_source() if _world_info_source is not None else None
    if info is not None:
        return info
    if "WORLD_SIZE" in os.environ and "RANK" in os.environ:
        return int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
    return 1, 0


class DistributedSampler(Sampler):
    """Indices `rank, rank + num_replicas, ...` of the (shuffled, padded or truncated) index list.

    Without `drop_last` the list is padded with its own first indices to a multiple of
    `num_replicas` (every replica gets `ceil(n / num_replicas)`); with it the tail is dropped.
    Call `set_epoch(e)` before each epoch to get a new shuffle."""

    def __init__(self, dataset, num_replicas=None, rank=None, shuffle=True, seed=0, drop_last=False):
        if num_replicas is None or rank is None:
            world, me = world_info()
            num_replicas = world if num_replicas is None else num_replicas
            rank = me if rank is None else rank
        if rank >= num_replicas or rank < 0:
            raise ValueError(f"Invalid rank {rank}, rank should be in the interval [0, {num_replicas - 1}]")
        self.dataset = dataset
        self.num_replicas = num_replicas
        self.rank = rank
        self.epoch = 0
        self.drop_last = drop_last
        n = len(dataset)
        if drop_last and n % num_replicas != 0:
            self.num_samples = math.ceil((n - num_replicas) / num_replicas)
        else:
            self.num_samples = math.ceil(n / num_replicas)
        self.total_size = self.num_samples * num_replicas
        self.shuffle = shuffle
        self.seed = seed

    def __iter__(self):
        n = len(self.dataset)
        if self.shuffle:
            indices = randperm(n, generator=Generator().manual_seed(self.seed + self.epoch)).tolist()
        else:
            indices = list(range(n))
        if not self.drop_last:
            pad = self.total_size - len(indices)
            if pad <= len(indices):
                indices += indices[:pad]
            else:
                indices += (indices * math.ceil(pad / len(indices)))[:pad]
        else:
            indices = indices[:self.total_size]
        return iter(indices[self.rank:self.total_size:self.num_replicas])

    def __len__(self):
        return self.num_samples

    def set_epoch(self, epoch):
        """Make the next pass use the permutation of `seed + epoch` (the same on every replica)."""
        self.epoch = epoch
