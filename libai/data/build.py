"""Data loaders: a dataset of dict samples, a batch sampler, and a collate to flow tensors."""
import logging
import numbers

import numpy as np

import engine as flow

from .samplers import CyclicSampler, SingleRoundSampler

__all__ = ["CommonDataLoader", "default_collate", "build_train_loader", "build_test_loader"]


def default_collate(samples):
    """Stack a list of dict samples into a dict of flow tensors (ints -> int64, floats -> float32,
    arrays/tensors stacked along a new first axis)."""
    if not samples:
        raise ValueError("default_collate: empty batch")
    first = samples[0]
    if not isinstance(first, dict):
        raise TypeError(f"default_collate expects dict samples, got {type(first).__name__}")
    out = {}
    for key in first:
        values = [s[key] for s in samples]
        v0 = values[0]
        if isinstance(v0, flow.Tensor):
            out[key] = flow.stack(values, dim=0)
        elif isinstance(v0, (bool, np.bool_)):
            out[key] = flow.tensor(np.asarray(values, dtype=np.bool_))
        elif isinstance(v0, numbers.Integral):
            out[key] = flow.tensor(np.asarray(values, dtype=np.int64))
        elif isinstance(v0, numbers.Real):
            out[key] = flow.tensor(np.asarray(values, dtype=np.float32))
        elif isinstance(v0, np.ndarray):
            a = np.stack(values, axis=0)
            if a.dtype == np.float64:
                a = a.astype(np.float32)
            out[key] = flow.tensor(a)
        else:
            out[key] = values  # strings, metadata: left as a list
    return out


class CommonDataLoader:
    """Iterates `collate_fn([dataset[i] for i in batch])` for each batch of `batch_sampler`.

    Loading happens in the calling thread, so the sampler's position is exact at every step;
    `state_dict()` / `load_state_dict()` save and restore it (for resuming training)."""

    def __init__(self, dataset, batch_sampler, collate_fn=None):
        self.dataset = dataset
        self.batch_sampler = batch_sampler
        self.collate_fn = collate_fn or default_collate

    def __iter__(self):
        for batch in self.batch_sampler:
            yield self.collate_fn([self.dataset[i] for i in batch])

    def __len__(self):
        return len(self.batch_sampler)

    def state_dict(self):
        sd = getattr(self.batch_sampler, "state_dict", None)
        return {"sampler": sd() if sd else {}}

    def load_state_dict(self, state):
        ld = getattr(self.batch_sampler, "load_state_dict", None)
        if ld is not None and state.get("sampler"):
            ld(state["sampler"])


def _maybe_instantiate(obj):
    from libai.config import instantiate
    from libai.config.instantiate import is_lazy_node

    return instantiate(obj) if is_lazy_node(obj) else obj


def build_train_loader(dataset, train_batch_size, test_batch_size=None, sampler=None, num_workers=0,
                       consumed_samples=0, seed=0, shuffle=True, collate_fn=None, **kwargs):
    """A training loader over `dataset` (or a list of datasets, concatenated) with a
    `CyclicSampler` of micro-batches of `train_batch_size`.

    Returns `(train_loader, None, None)` like LiBai's builders (train, valid, test); the trainer
    accepts that or a single loader. `num_workers` is accepted for LiBai compatibility (loading
    is synchronous)."""
    if kwargs:
        logging.getLogger(__name__).warning(f"build_train_loader: ignoring arguments {sorted(kwargs)}")
    dataset = _maybe_instantiate(dataset)
    if isinstance(dataset, (list, tuple)):
        dataset = ConcatDataset([_maybe_instantiate(d) for d in dataset])
    if sampler is None:
        sampler = CyclicSampler(len(dataset), train_batch_size, shuffle=shuffle, seed=seed,
                                consumed_samples=consumed_samples)
    else:
        sampler = _maybe_instantiate(sampler)
    return CommonDataLoader(dataset, sampler, collate_fn), None, None


def build_test_loader(dataset, test_batch_size, sampler=None, num_workers=0, seed=0, collate_fn=None, **kwargs):
    """An evaluation loader: one pass with a `SingleRoundSampler` of `test_batch_size`."""
    if kwargs:
        logging.getLogger(__name__).warning(f"build_test_loader: ignoring arguments {sorted(kwargs)}")
    dataset = _maybe_instantiate(dataset)
    if sampler is None:
        sampler = SingleRoundSampler(len(dataset), test_batch_size, shuffle=False, seed=seed)
    else:
        sampler = _maybe_instantiate(sampler)
    return CommonDataLoader(dataset, sampler, collate_fn)


class ConcatDataset:
    def __init__(self, datasets):
        self.datasets = list(datasets)
        self.offsets = np.cumsum([0] + [len(d) for d in self.datasets])

    def __len__(self):
        return int(self.offsets[-1])

    def __getitem__(self, i):
        if i < 0:
            i += len(self)
        d = int(np.searchsorted(self.offsets, i, side="right")) - 1
        return self.datasets[d][i - int(self.offsets[d])]
