"""Deterministic, data-parallel aware samplers that yield micro-batches of indices.

`CyclicSampler` (training): an endless stream. Epoch e is the permutation of range(N) drawn from
`numpy.random.RandomState(seed + e)` (or range(N) without shuffle), cut into global batches of
`micro_batch_size * data_parallel_size` samples (a last incomplete global batch is dropped);
data-parallel rank r takes the r-th micro-batch of each global batch. The position is the
global `consumed_samples` count, so `state_dict()` / `load_state_dict()` (or the
`consumed_samples` argument) continue the stream exactly where it stopped, on any rank.

`SingleRoundSampler` (evaluation): one pass over the data in order (or shuffled), each
data-parallel rank taking a contiguous share, in micro-batches; the last one may be smaller.
"""
import numpy as np

__all__ = ["CyclicSampler", "SingleRoundSampler"]


def _dp_rank_size(rank, size):
    if rank is None or size is None:
        from libai.utils import distributed as dist

        topo = dist.get_dist_util()
        rank = topo.data_parallel_rank if rank is None else rank
        size = topo.data_parallel_size if size is None else size
    if not 0 <= rank < size:
        raise ValueError(f"data_parallel_rank {rank} must be in [0, {size})")
    return int(rank), int(size)


class CyclicSampler:
    def __init__(self, dataset_size, micro_batch_size, shuffle=True, seed=0, consumed_samples=0,
                 data_parallel_rank=None, data_parallel_size=None):
        self.dataset_size = int(dataset_size)
        self.micro_batch_size = int(micro_batch_size)
        if self.micro_batch_size <= 0:
            raise ValueError(f"micro_batch_size must be positive, got {micro_batch_size}")
        self.shuffle = bool(shuffle)
        self.seed = int(seed)
        self.data_parallel_rank, self.data_parallel_size = _dp_rank_size(data_parallel_rank, data_parallel_size)
        self.global_batch_size = self.micro_batch_size * self.data_parallel_size
        self.batches_per_epoch = self.dataset_size // self.global_batch_size
        if self.batches_per_epoch == 0:
            raise ValueError(
                f"dataset of {self.dataset_size} samples is smaller than one global batch of "
                f"{self.global_batch_size} (micro_batch_size {self.micro_batch_size} x "
                f"data_parallel_size {self.data_parallel_size})")
        self.consumed_samples = int(consumed_samples)
        if self.consumed_samples % self.global_batch_size:
            raise ValueError(f"consumed_samples {consumed_samples} is not a multiple of the global batch "
                             f"size {self.global_batch_size}")

    @property
    def samples_per_epoch(self):
        return self.batches_per_epoch * self.global_batch_size

    @property
    def epoch(self):
        return self.consumed_samples // self.samples_per_epoch

    def _permutation(self, epoch):
        if self.shuffle:
            return np.random.RandomState(self.seed + epoch).permutation(self.dataset_size)
        return np.arange(self.dataset_size)

    def __iter__(self):
        while True:
            epoch, offset = divmod(self.consumed_samples, self.samples_per_epoch)
            perm = self._permutation(epoch)
            for start in range(offset, self.samples_per_epoch, self.global_batch_size):
                lo = start + self.data_parallel_rank * self.micro_batch_size
                batch = perm[lo:lo + self.micro_batch_size].tolist()
                # advance before yielding: once a batch is handed out it counts as consumed
                self.consumed_samples += self.global_batch_size
                yield batch

    def __len__(self):
        return self.batches_per_epoch

    def state_dict(self):
        return {"consumed_samples": self.consumed_samples, "seed": self.seed, "shuffle": self.shuffle,
                "dataset_size": self.dataset_size, "global_batch_size": self.global_batch_size}

    def load_state_dict(self, state):
        if int(state["consumed_samples"]) % self.global_batch_size:
            raise ValueError(f"consumed_samples {state['consumed_samples']} is not a multiple of the global "
                             f"batch size {self.global_batch_size}")
        for key in ("seed", "dataset_size", "shuffle"):
            if key in state and state[key] != getattr(self, key):
                raise ValueError(f"CyclicSampler.load_state_dict: saved {key}={state[key]!r} differs from "
                                 f"this sampler's {getattr(self, key)!r}")
        self.consumed_samples = int(state["consumed_samples"])


class SingleRoundSampler:
    def __init__(self, dataset_size, micro_batch_size, shuffle=False, seed=0,
                 data_parallel_rank=None, data_parallel_size=None, drop_last=False):
        self.dataset_size = int(dataset_size)
        self.micro_batch_size = int(micro_batch_size)
        if self.micro_batch_size <= 0:
            raise ValueError(f"micro_batch_size must be positive, got {micro_batch_size}")
        self.shuffle = bool(shuffle)
        self.seed = int(seed)
        self.drop_last = bool(drop_last)
        self.data_parallel_rank, self.data_parallel_size = _dp_rank_size(data_parallel_rank, data_parallel_size)

    def _indices(self):
        idx = (np.random.RandomState(self.seed).permutation(self.dataset_size) if self.shuffle
               else np.arange(self.dataset_size))
        q, r = divmod(self.dataset_size, self.data_parallel_size)
        start = self.data_parallel_rank * q + min(self.data_parallel_rank, r)
        return idx[start:start + q + (1 if self.data_parallel_rank < r else 0)]

    def __iter__(self):
        idx = self._indices()
        for start in range(0, len(idx), self.micro_batch_size):
            batch = idx[start:start + self.micro_batch_size].tolist()
            if self.drop_last and len(batch) < self.micro_batch_size:
                return
            yield batch

    def __len__(self):
        n = len(self._indices())
        return n // self.micro_batch_size if self.drop_last else -(-n // self.micro_batch_size)
