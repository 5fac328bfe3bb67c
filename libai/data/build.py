"""Data loaders: a dataset of dict samples, a batch sampler, and a collate to flow tensors."""
import logging
import numbers

import numpy as np

import engine as flow

from .samplers import CyclicSampler, SingleRoundSampler
from .structures import Instance

__all__ = ["CommonDataLoader", "default_collate", "build_train_loader", "build_test_loader",
           "trivial_batch_collator", "build_nlp_train_loader", "build_nlp_test_loader",
           "build_nlp_train_val_test_loader", "get_train_valid_test_split_", "train_val_test_num_samples",
           "build_image_train_loader", "build_image_test_loader", "MixupCollator"]


def default_collate(samples):
    """Stack a list of dict samples into a dict of flow tensors (ints -> int64, floats -> float32,
    arrays/tensors stacked along a new first axis). `Instance` samples are stacked with
    `Instance.stack` (a batched Instance of DistTensorData)."""
    if not samples:
        raise ValueError("default_collate: empty batch")
    first = samples[0]
    if isinstance(first, Instance):
        return Instance.stack(samples)
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
        set_epoch = getattr(self.dataset, "set_epoch", None)
        for batch in self.batch_sampler:
            if set_epoch is not None:  # random augmentations are seeded by (seed, epoch, index)
                set_epoch(getattr(self.batch_sampler, "epoch", 0))
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


def _one_dataset(dataset, mixer=None):
    """`dataset`, or a sequence of datasets (list, tuple or, as the trainer passes a config's list
    to a builder instantiated with `_recursive_=False`, a ListConfig) mixed into one by `mixer`
    (default ConcatDataset); LazyCalls among them are built."""
    datasets = [_maybe_instantiate(d) for d in _as_list(_maybe_instantiate(dataset))]
    return datasets[0] if len(datasets) == 1 else (mixer or ConcatDataset)(datasets)


def _note_num_workers(num_workers):
    """LiBai's `num_workers` only chooses how batches are loaded, never which: accepted, with one
    log line per process when it asks for worker processes (loading is synchronous here)."""
    global _noted_workers
    if num_workers and not _noted_workers:
        _noted_workers = True
        logging.getLogger(__name__).info(f"num_workers={num_workers}: batches are loaded synchronously in the "
                                         "training process (the same batches, in the same order)")


_noted_workers = False


def build_train_loader(dataset, train_batch_size, test_batch_size=None, sampler=None, num_workers=0,
                       consumed_samples=0, seed=0, shuffle=True, collate_fn=None):
    """A training loader over `dataset` (or a list of datasets, concatenated: a list, tuple or a
    config's ListConfig) with a `CyclicSampler` of micro-batches of `train_batch_size`.

    Returns `(train_loader, None, None)` like LiBai's builders (train, valid, test); the trainer
    accepts that or a single loader. `num_workers` is accepted for LiBai compatibility (loading
    is synchronous)."""
    _note_num_workers(num_workers)
    dataset = _one_dataset(dataset)
    if sampler is None:
        sampler = CyclicSampler(len(dataset), train_batch_size, shuffle=shuffle, seed=seed,
                                consumed_samples=consumed_samples)
    else:
        sampler = _maybe_instantiate(sampler)
    return CommonDataLoader(dataset, sampler, collate_fn), None, None


def build_test_loader(dataset, test_batch_size, sampler=None, num_workers=0, seed=0, collate_fn=None):
    """An evaluation loader: one pass with a `SingleRoundSampler` of `test_batch_size`."""
    _note_num_workers(num_workers)
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


# ---------------------------------------------------------------------- NLP loaders (LiBai)
def trivial_batch_collator(batch):
    """LiBai's collate for Instance samples: `Instance.stack`."""
    if not isinstance(batch[0], Instance):
        raise TypeError("trivial_batch_collator expects Instance samples")
    return Instance.stack(batch)


def _make_sampler(sampler, default_cls, dataset_size, batch_size, seed, **extra):
    """A sampler for `dataset_size` samples: None -> default_cls; a LazyCall gets dataset_size,
    micro_batch_size, seed (and extra) filled in; an instance is used as is."""
    from libai.config.instantiate import is_lazy_node

    if sampler is None:
        return default_cls(dataset_size, batch_size, seed=seed, **extra)
    if is_lazy_node(sampler):
        from libai.config import instantiate

        sampler.dataset_size = dataset_size
        sampler.micro_batch_size = batch_size
        sampler.seed = seed
        for k, v in extra.items():
            sampler[k] = v
        return instantiate(sampler)
    return sampler


def _as_list(x):
    try:
        from omegaconf import ListConfig

        if isinstance(x, ListConfig):
            return list(x)
    except ImportError:  # pragma: no cover
        pass
    return list(x) if isinstance(x, (list, tuple)) else [x]


def build_nlp_train_loader(dataset, train_batch_size, test_batch_size=None, sampler=None, num_workers=0,
                           consumed_samples=0, seed=0, collate_fn=None, dataset_mixer=None, shuffle=True):
    """A training loader of Instance samples (LiBai): `dataset` (or a list, mixed with
    `dataset_mixer`, default ConcatDataset), a data-parallel aware, resumable CyclicSampler of
    micro-batches of `train_batch_size` and `trivial_batch_collator`. Returns (loader, None, None)."""
    _note_num_workers(num_workers)
    dataset = _one_dataset(dataset, dataset_mixer)
    sampler = _make_sampler(sampler, CyclicSampler, len(dataset), train_batch_size, seed,
                            consumed_samples=consumed_samples, **({} if sampler is not None else {"shuffle": shuffle}))
    return CommonDataLoader(dataset, sampler, collate_fn or trivial_batch_collator), None, None


def build_nlp_test_loader(dataset, test_batch_size, sampler=None, num_workers=0, seed=0, collate_fn=None):
    """An evaluation loader of Instance samples: one pass (SingleRoundSampler, no shuffle)."""
    _note_num_workers(num_workers)
    dataset = _maybe_instantiate(dataset)
    sampler = _make_sampler(sampler, SingleRoundSampler, len(dataset), test_batch_size, seed)
    return CommonDataLoader(dataset, sampler, collate_fn or trivial_batch_collator)


def get_train_valid_test_split_(size, splits):
    """Megatron's document split: `splits` (e.g. [949, 50, 1] or "949,50,1") normalized to
    ratios; returns the 4 boundaries [0, a, b, size] (rounded; the rounding error is taken
    from the first split)."""
    if isinstance(splits, str):
        splits = [float(s) for s in splits.replace("/", ",").split(",") if s.strip()]
    splits = [float(s) for s in splits]
    while len(splits) < 3:
        splits.append(0.0)
    splits = splits[:3]
    total = sum(splits)
    if total <= 0 or any(s < 0 for s in splits):
        raise ValueError(f"splits must be non-negative with a positive sum, got {splits}")
    splits = [s / total for s in splits]
    index = [0]
    for s in splits:
        index.append(index[-1] + int(round(s * float(size))))
    diff = index[-1] - size
    for k in range(1, len(index)):
        index[k] -= diff
    assert index[-1] == size
    return index


def _split_bounds(n_docs, split, source):
    """get_train_valid_test_split_, and a ValueError naming dataloader.train.splits when the train
    split gets no documents (`source` names the data)."""
    bounds = get_train_valid_test_split_(n_docs, split)
    if bounds[1] <= bounds[0]:
        ratios = split if isinstance(split, str) else [float(x) for x in split]
        counts = [max(0, bounds[k + 1] - max(bounds[k], 0)) for k in range(3)]
        raise ValueError(f"the train split is empty: dataloader.train.splits {ratios} splits the {n_docs} documents "
                         f"of {source} into {counts[0]} train / {counts[1]} valid / {counts[2]} test documents; give "
                         f"train a larger share (e.g. [[949.0, 50.0, 1.0]]) or use more documents")
    return bounds


# above this many repetitions of a valid/test split in the samples asked of it, a warning
EVAL_REPEAT_LIMIT = 100


def _check_repeated_eval_split(dataset, split, index, requested, test_batch_size):
    """A ValueError naming the keys when `requested` samples repeat a valid/test GPT2Dataset
    split more than EVAL_REPEAT_LIMIT times (e.g. LiBai's default eval_iter, 1e5 batches, on a
    small corpus: every evaluation would run that many batches over the same few samples, for
    hours, and measure nothing more than one pass does)."""
    seq_length, documents = getattr(dataset, "seq_length", None), getattr(dataset, "documents", None)
    if not requested or seq_length is None or documents is None:
        return
    tokens = int(np.sum(np.asarray(dataset.indexed_dataset.sizes)[documents], dtype=np.int64))
    per_epoch = max(1, (tokens - 1) // seq_length)
    if requested <= EVAL_REPEAT_LIMIT * per_epoch:
        return
    batches = -(-per_epoch // int(test_batch_size or 1))
    raise ValueError(
        f"the {split} split {dataset.name!r} holds {per_epoch} samples of seq_length + 1 = {seq_length + 1} tokens "
        f"({tokens} tokens in {len(documents)} documents), but {requested} samples were asked of it "
        f"(dataloader.train.train_val_test_num_samples[{index}]): each is repeated about {requested // per_epoch} "
        f"times. The trainer asks train.evaluation.eval_iter x train.test_micro_batch_size x data-parallel size x "
        f"(train.train_iter // train.evaluation.eval_period + 1) samples, and each evaluation runs up to "
        f"train.evaluation.eval_iter batches: lower train.evaluation.eval_iter ({batches} batches of "
        f"{test_batch_size} cover the split once) or give the split more documents (dataloader.train.splits).")


def train_val_test_num_samples(train_iter, global_batch_size, eval_iter=0, test_global_batch_size=None,
                               eval_period=None):
    """Samples each split must provide (Megatron): train_iter * global_batch_size for training;
    eval_iter * test_global_batch_size per evaluation (times the number of evaluations when
    `eval_period` is given) for validation and test."""
    test_global_batch_size = test_global_batch_size or global_batch_size
    evals = (int(train_iter) // int(eval_period) + 1) if eval_period else 1
    n_eval = int(eval_iter or 0) * int(test_global_batch_size) * evals
    return [int(train_iter) * int(global_batch_size), n_eval, n_eval]


def _num_documents(indexed):
    """Documents of an indexed dataset: its document index's entries (a sentence-level dataset
    holds several sequences per document; a document-level one, one)."""
    doc_idx = getattr(indexed, "doc_idx", None)
    return len(doc_idx) - 1 if doc_idx is not None and len(doc_idx) > 0 else len(indexed.sizes)


def build_nlp_train_val_test_loader(dataset, splits, weights, train_batch_size, test_batch_size,
                                    train_val_test_num_samples=None, train_sampler=None, test_sampler=None,
                                    num_workers=0, consumed_samples=0, seed=0, collate_fn=None,
                                    dataset_mixer=None, shuffle=True):
    """Train/valid/test loaders from datasets that lack valid/test splits (LiBai's builder).

    dataset: a LazyCall of a dataset taking `documents`, `num_samples` and `name` (GPT2Dataset),
        or a list of them; each needs `data_prefix` or `indexed_dataset` to count its documents.
    splits: one ratio per dataset, e.g. [[949., 50., 1.]]: the documents are split in order
        into train/valid/test ranges (get_train_valid_test_split_).
    weights: one per dataset; the splits of several datasets are concatenated (`dataset_mixer`,
        default ConcatDataset), so the weights must be equal (blending by weight is not
        implemented: unequal weights are refused).
    train_val_test_num_samples: samples for each split (see `train_val_test_num_samples()`);
        None or a 0 entry: one epoch of that split.
    train_sampler / test_sampler: LazyCalls (or None: CyclicSampler(shuffle) / SingleRoundSampler).
    Returns (train_loader, valid_loader, test_loader); a split without documents gives None.

    In a config, give the LazyCall `_recursive_=False` (as LiBai instantiates this builder) so the
    datasets reach it unbuilt; recursively built GPT2Datasets also work (re-split with `subset`,
    after building one epoch of the whole data).
    """
    from libai.config import instantiate
    from libai.config.instantiate import is_lazy_node

    _note_num_workers(num_workers)
    datasets = _as_list(dataset)
    splits = _as_list(splits)
    if splits and not isinstance(splits[0], (list, tuple, str)) and not hasattr(splits[0], "__len__"):
        splits = [splits]  # a single ratio list
    weights = _as_list(weights) if weights is not None else [1.0] * len(datasets)
    if len(splits) != len(datasets) or len(weights) != len(datasets):
        raise ValueError(f"{len(datasets)} datasets need as many splits ({len(splits)}) and weights ({len(weights)})")
    if len({float(w) for w in weights}) > 1:
        raise NotImplementedError(f"build_nlp_train_val_test_loader: weights {weights}: blending datasets by weight is "
                                  "not implemented (the datasets are concatenated); give equal weights")
    nums = list(train_val_test_num_samples) if train_val_test_num_samples is not None else [None, None, None]
    names = ("train", "valid", "test")
    per_split = [[], [], []]
    for k, (dst, split) in enumerate(zip(datasets, splits)):
        if not is_lazy_node(dst):
            # already built (the config was instantiated recursively): re-split its documents
            if not hasattr(dst, "subset"):
                raise TypeError(f"build_nlp_train_val_test_loader: dataset {type(dst).__name__} is neither a "
                                f"LazyCall nor has subset(documents, num_samples, name)")
            bounds = _split_bounds(_num_documents(dst.indexed_dataset), split, getattr(dst, "data_prefix", None))
            base = getattr(dst, "name", "gpt-2") + (str(k) if len(datasets) > 1 else "")
            for s in range(3):
                if bounds[s + 1] > bounds[s]:
                    per_split[s].append(dst.subset(np.arange(bounds[s], bounds[s + 1], dtype=np.int64),
                                                   nums[s] or None, f"{base}_{names[s]}"))
            continue
        indexed = dst.get("indexed_dataset", None) if hasattr(dst, "get") else None
        indexed = _maybe_instantiate(indexed) if indexed is not None else None
        if indexed is None:
            from .indexed_dataset import MMapIndexedDataset

            prefix = dst.get("data_prefix", None) if hasattr(dst, "get") else None
            if prefix is None:
                raise ValueError("each dataset of build_nlp_train_val_test_loader needs data_prefix or indexed_dataset")
            indexed = MMapIndexedDataset(prefix)
        n_docs = _num_documents(indexed)
        bounds = _split_bounds(n_docs, split, getattr(indexed, "path_prefix", None))
        base = dst.get("name", None) or "gpt-2"
        if len(datasets) > 1:
            base = f"{base}{k}"
        for s in range(3):
            if bounds[s + 1] <= bounds[s]:
                continue
            ns = nums[s] if nums[s] else None
            per_split[s].append(instantiate(dst, indexed_dataset=indexed,
                                            documents=np.arange(bounds[s], bounds[s + 1], dtype=np.int64),
                                            num_samples=ns, name=f"{base}_{names[s]}"))
    for s in (1, 2):
        for d in per_split[s]:
            _check_repeated_eval_split(d, names[s], s, nums[s], test_batch_size or train_batch_size)
    mixer = dataset_mixer or ConcatDataset
    merged = [None if not d else (d[0] if len(d) == 1 else mixer(d)) for d in per_split]
    if merged[0] is None:
        raise ValueError("the train split has no documents")
    train_loader, _, _ = build_nlp_train_loader(merged[0], train_batch_size, sampler=train_sampler,
                                                consumed_samples=consumed_samples, seed=seed,
                                                collate_fn=collate_fn, shuffle=shuffle)
    test_batch_size = test_batch_size or train_batch_size
    valid_loader = (build_nlp_test_loader(merged[1], test_batch_size, sampler=test_sampler, seed=seed,
                                          collate_fn=collate_fn) if merged[1] is not None else None)
    test_loader = (build_nlp_test_loader(merged[2], test_batch_size, sampler=test_sampler, seed=seed,
                                         collate_fn=collate_fn) if merged[2] is not None else None)
    return train_loader, valid_loader, test_loader


# ---------------------------------------------------------------------- image loaders (LiBai)
class MixupCollator:
    """`Instance.stack`, then `mixup_func(images, labels)` on the stacked batch (soft labels)."""

    def __init__(self, mixup_func):
        self.mixup_func = mixup_func

    def __call__(self, batch):
        out = trivial_batch_collator(batch)
        images, labels = self.mixup_func(out.images.tensor, out.labels.tensor)
        out.images.tensor, out.labels.tensor = images, labels
        return out


def build_image_train_loader(dataset, train_batch_size, test_batch_size=None, sampler=None, num_workers=0,
                             consumed_samples=0, seed=0, collate_fn=None, dataset_mixer=None, mixup_func=None,
                             shuffle=True):
    """LiBai's image training loader: Instance samples of `dataset` (or a list, concatenated),
    a resumable CyclicSampler of micro-batches, `Instance.stack` and, with `mixup_func` (e.g.
    `Mixup(...)`), mixup/CutMix with soft labels. The batch becomes [S(0), B] global tensors in
    the trainer. Returns (loader, None, None)."""
    mixup_func = _maybe_instantiate(mixup_func)
    if collate_fn is None and mixup_func is not None:
        collate_fn = MixupCollator(mixup_func)
    return build_nlp_train_loader(dataset, train_batch_size, test_batch_size, sampler, num_workers,
                                  consumed_samples, seed, collate_fn, dataset_mixer, shuffle)


def build_image_test_loader(dataset, test_batch_size, sampler=None, num_workers=0, seed=0, collate_fn=None):
    """LiBai's image evaluation loader: one pass over `dataset` in order."""
    return build_nlp_test_loader(dataset, test_batch_size, sampler, num_workers, seed, collate_fn)
