"""GPT-2 pretraining samples over an indexed dataset (Megatron-LM's GPTDataset).

The documents of the split form a token stream: `doc_idx` lists them, shuffled, repeated for as
many epochs as `num_samples` needs (all epochs shuffled together; when the last epoch is needed
for less than 80% of its samples it is shuffled on its own, so that every document appears in
the first `num_samples` samples about equally often). Sample i is the seq_length + 1 tokens at
positions [i * seq_length, (i + 1) * seq_length] of that stream, so consecutive samples share
one token and samples cross document boundaries (documents are separated by the EOD token
appended at preprocessing). `sample_idx[i]` = (position in doc_idx, offset in that document)
of the start of sample i; `shuffle_idx` permutes the samples. The three arrays are built with
numpy, deterministic for a seed (the same numpy RandomState calls as Megatron), and cached as
.npy files beside the data (or in `cache_dir`) named by (name, num_samples, seq_length, seed).
"""
import fcntl
import hashlib
import logging
import os
import time

import numpy as np

import engine as flow

from ..indexed_dataset import open_indexed_dataset
from ..structures import DistTensorData, Instance

logger = logging.getLogger(__name__)

__all__ = ["GPT2Dataset", "build_doc_idx", "build_index_mappings", "build_sample_idx", "build_shuffle_idx",
           "check_enough_tokens", "num_epochs_for"]


class GPT2Dataset:
    """Samples of seq_length + 1 tokens from the documents `documents` of an mmap dataset.

    Args:
        name: a name for the split ("train", "valid", ...), part of the cache file names.
        data_prefix: PREFIX_text_document (its .bin/.idx), or give `indexed_dataset`.
        indexed_dataset: an MMapIndexedDataset (or a LazyCall of one).
        documents: indices of the documents (sequences) of this split; default all.
        num_samples: samples wanted (the dataset holds at least that many: whole epochs are
            built); None = one epoch.
        seq_length: tokens per model input (the sample has seq_length + 1: inputs and shifted labels).
        seed: shuffling seed.
        cache_dir: where the index .npy files go (default beside the data).
        max_num_samples, max_seq_length: LiBai's names for num_samples and seq_length.
        tokenizer: accepted for LiBai compatibility (unused).

    `ds[i]` is Instance(input_ids=DistTensorData(int64[seq_length]),
    labels=DistTensorData(int64[seq_length], placement_idx=-1)).
    """

    def __init__(self, name="gpt-2", data_prefix=None, indexed_dataset=None, documents=None, num_samples=None,
                 seq_length=None, seed=1234, cache_dir=None, max_num_samples=None, max_seq_length=None,
                 tokenizer=None, skip_warmup=True):
        if seq_length is None:
            seq_length = max_seq_length if max_seq_length is not None else 1024
        if num_samples is None:
            num_samples = max_num_samples
        indexed_dataset, data_prefix = open_indexed_dataset(indexed_dataset, data_prefix, "GPT2Dataset", skip_warmup)
        self.name = str(name)
        self.indexed_dataset = indexed_dataset
        self.data_prefix = data_prefix
        self.seq_length = int(seq_length)
        self.seed = int(seed)
        self.cache_dir = cache_dir
        sizes = np.asarray(indexed_dataset.sizes)
        if documents is None:
            documents = np.arange(len(sizes), dtype=np.int64)
        documents = np.asarray(documents, dtype=np.int64)
        if documents.size == 0:
            raise ValueError(f"GPT2Dataset {name!r}: no documents")
        if documents.min() < 0 or documents.max() >= len(sizes):
            raise ValueError(f"GPT2Dataset {name!r}: document indices must be in [0, {len(sizes)})")
        self.documents = documents
        tokens = int(np.sum(sizes[documents], dtype=np.int64))
        if num_samples is None or int(num_samples) <= 0:
            num_samples = max(1, (tokens - 1) // self.seq_length)  # one epoch
        self.num_samples = int(num_samples)
        self.doc_idx, self.sample_idx, self.shuffle_idx, self.cache_files = build_index_mappings(
            self.name, data_prefix, documents, sizes, self.num_samples, self.seq_length, self.seed,
            cache_dir=cache_dir)

    def subset(self, documents, num_samples=None, name=None):
        """A GPT2Dataset over `documents` of the same indexed dataset, seq_length and seed."""
        return type(self)(name=name or self.name, data_prefix=self.data_prefix, indexed_dataset=self.indexed_dataset,
                          documents=documents, num_samples=num_samples, seq_length=self.seq_length, seed=self.seed,
                          cache_dir=self.cache_dir)

    def __len__(self):
        # sample i spans [sample_idx[i], sample_idx[i + 1]]
        return self.shuffle_idx.shape[0]

    def get_tokens(self, idx):
        """The seq_length + 1 tokens (int64) of sample `idx` (after shuffling)."""
        if idx < 0:
            idx += len(self)
        if not 0 <= idx < len(self):
            raise IndexError(f"sample {idx} out of range for {len(self)} samples")
        i = int(self.shuffle_idx[idx])
        doc_f, off_f = (int(v) for v in self.sample_idx[i])
        doc_l, off_l = (int(v) for v in self.sample_idx[i + 1])
        get = self.indexed_dataset.get
        if doc_f == doc_l:
            sample = get(int(self.doc_idx[doc_f]), offset=off_f, length=off_l - off_f + 1)
        else:
            parts = [get(int(self.doc_idx[doc_f]), offset=off_f)]
            parts.extend(get(int(self.doc_idx[d])) for d in range(doc_f + 1, doc_l))
            parts.append(get(int(self.doc_idx[doc_l]), length=off_l + 1))
            sample = np.concatenate(parts)
        return np.asarray(sample, dtype=np.int64)

    def __getitem__(self, idx):
        tokens = self.get_tokens(int(idx))
        return Instance(
            input_ids=DistTensorData(flow.tensor(tokens[:-1].copy())),
            labels=DistTensorData(flow.tensor(tokens[1:].copy()), placement_idx=-1),
        )


# ---------------------------------------------------------------------- index mappings
def check_enough_tokens(name, data_prefix, n_documents, tokens, seq_length):
    """ValueError naming the split unless its `tokens` make one sample (seq_length + 1 tokens).

    (Megatron would build such a split by repeating it within a sample.)"""
    if tokens >= seq_length + 1:
        return
    of = f" of {os.path.abspath(str(data_prefix))}" if data_prefix is not None else ""
    raise ValueError(
        f"GPT2Dataset {name!r}: the split has {tokens} tokens in {n_documents} documents{of}, but one sample "
        f"needs seq_length + 1 = {seq_length + 1} tokens. Give the split more text (more or longer documents, or "
        f"a larger share of them in dataloader.train.splits) or use a shorter seq_length "
        f"(dataloader.train.dataset[0].seq_length; configs/gpt2_pretrain.py sets it from "
        f"model.cfg.max_seq_length).")


def num_epochs_for(tokens_per_epoch, seq_length, num_samples):
    """Epochs needed for num_samples samples (each uses seq_length new tokens, + 1 overall)."""
    tokens_per_epoch = int(tokens_per_epoch)
    # smallest e with (e * tokens - 1) // seq_length >= num_samples
    e = max(1, -(-(int(num_samples) * seq_length + 1) // tokens_per_epoch))
    while e > 1 and ((e - 1) * tokens_per_epoch - 1) // seq_length >= num_samples:
        e -= 1
    while (e * tokens_per_epoch - 1) // seq_length < num_samples:
        e += 1
    return e


def build_doc_idx(documents, num_epochs, np_rng, separate_last_epoch):
    """documents repeated num_epochs times and shuffled (the last epoch separately if asked)."""
    if not separate_last_epoch or num_epochs == 1:
        doc_idx = np.tile(np.asarray(documents, dtype=np.int32), num_epochs)
        np_rng.shuffle(doc_idx)
        return doc_idx
    first = build_doc_idx(documents, num_epochs - 1, np_rng, False)
    last = build_doc_idx(documents, 1, np_rng, False)
    return np.concatenate((first, last))


def build_sample_idx(sizes, doc_idx, seq_length, num_epochs, tokens_per_epoch):
    """[num_samples + 1, 2] int64: (position in doc_idx, token offset) where each sample starts;
    sample i ends (inclusively) where sample i + 1 starts. Same result as Megatron's C++ helper."""
    num_samples = (int(num_epochs) * int(tokens_per_epoch) - 1) // seq_length
    lengths = np.asarray(sizes, dtype=np.int64)[doc_idx]
    starts = np.zeros(len(lengths), dtype=np.int64)
    np.cumsum(lengths[:-1], out=starts[1:])
    positions = np.arange(num_samples + 1, dtype=np.int64) * seq_length
    # the document holding each position (empty documents are skipped over)
    doc = np.searchsorted(starts, positions, side="right") - 1
    sample_idx = np.empty((num_samples + 1, 2), dtype=np.int64)
    sample_idx[:, 0] = doc
    sample_idx[:, 1] = positions - starts[doc]
    sample_idx[0] = (0, 0)  # Megatron starts at (0, 0) even before empty leading documents
    return sample_idx


def build_shuffle_idx(num_samples, total_size, np_rng):
    """A permutation of [0, total_size): [0, num_samples) shuffled, then the rest shuffled."""
    dtype = np.uint32 if total_size < np.iinfo(np.uint32).max - 1 else np.int64
    first = np.arange(num_samples, dtype=dtype)
    np_rng.shuffle(first)
    if num_samples == total_size:
        return first
    last = np.arange(num_samples, total_size, dtype=dtype)
    np_rng.shuffle(last)
    return np.concatenate((first, last))


def _compute(documents, sizes, num_samples, seq_length, seed):
    tokens_per_epoch = int(np.sum(sizes[documents], dtype=np.int64))
    num_epochs = num_epochs_for(tokens_per_epoch, seq_length, num_samples)
    np_rng = np.random.RandomState(seed=seed)
    separate_last_epoch = False
    if num_epochs > 1:
        from_epochs_minus_one = ((num_epochs - 1) * tokens_per_epoch - 1) // seq_length
        last_epoch_num_samples = num_samples - from_epochs_minus_one
        per_epoch = (tokens_per_epoch - 1) // seq_length
        # 1 <= last_epoch_num_samples <= per_epoch + 1 always holds (num_epochs is the smallest that
        # suffices, and an epoch adds at most ceil(tokens / seq_length) = per_epoch + 1 samples):
        # Megatron asserts that bound; an assert of < per_epoch + 1 failed on valid sizes
        separate_last_epoch = last_epoch_num_samples < int(0.80 * per_epoch)
    doc_idx = build_doc_idx(documents, num_epochs, np_rng, separate_last_epoch)
    sample_idx = build_sample_idx(sizes, doc_idx, seq_length, num_epochs, tokens_per_epoch)
    total = sample_idx.shape[0] - 1
    first = ((num_epochs - 1) * tokens_per_epoch - 1) // seq_length if separate_last_epoch else total
    shuffle_idx = build_shuffle_idx(first, total, np_rng)
    return doc_idx, sample_idx, shuffle_idx, num_epochs


def _cache_base(name, data_prefix, documents, sizes, num_samples, seq_length, seed, cache_dir):
    # the documents and their lengths are hashed too, so a regenerated dataset or another split
    # of the same name never reuses stale indices
    h = hashlib.sha1()
    h.update(np.ascontiguousarray(documents, dtype=np.int64).tobytes())
    h.update(np.ascontiguousarray(np.asarray(sizes)[documents], dtype=np.int64).tobytes())
    key = f"_{name}_indexmap_{num_samples}ns_{seq_length}sl_{seed}s_{h.hexdigest()[:10]}"
    if data_prefix is None:
        if cache_dir is None:
            return None
        return os.path.join(cache_dir, "gpt2" + key)
    if cache_dir is not None:
        return os.path.join(cache_dir, os.path.basename(str(data_prefix)) + key)
    return str(data_prefix) + key


def build_index_mappings(name, data_prefix, documents, sizes, num_samples, seq_length, seed, cache_dir=None):
    """(doc_idx, sample_idx, shuffle_idx, cache_files): loaded from the .npy cache when present,
    else built (under a file lock, written atomically, so concurrent ranks/processes build once)."""
    sizes = np.asarray(sizes)
    check_enough_tokens(name, data_prefix, len(documents), int(np.sum(sizes[documents], dtype=np.int64)), seq_length)
    base = _cache_base(name, data_prefix, documents, sizes, num_samples, seq_length, seed, cache_dir)
    if base is None:
        doc_idx, sample_idx, shuffle_idx, _ = _compute(documents, sizes, num_samples, seq_length, seed)
        return doc_idx, sample_idx, shuffle_idx, None
    files = {k: f"{base}_{k}.npy" for k in ("doc_idx", "sample_idx", "shuffle_idx")}
    if not all(os.path.isfile(f) for f in files.values()):
        directory = os.path.dirname(os.path.abspath(base))
        os.makedirs(directory, exist_ok=True)
        with open(base + ".lock", "a+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                if not all(os.path.isfile(f) for f in files.values()):
                    start = time.time()
                    doc_idx, sample_idx, shuffle_idx, epochs = _compute(documents, sizes, num_samples,
                                                                        seq_length, seed)
                    for key, arr in (("doc_idx", doc_idx), ("sample_idx", sample_idx),
                                     ("shuffle_idx", shuffle_idx)):
                        tmp = f"{base}_{key}.tmp{os.getpid()}.npy"
                        np.save(tmp, arr, allow_pickle=False)
                        os.replace(tmp, files[key])
                    logger.info(f"GPT2Dataset {name}: built index mappings ({epochs} epochs, "
                                f"{len(shuffle_idx)} samples) in {time.time() - start:.3f}s -> {base}_*.npy")
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)
    doc_idx = np.load(files["doc_idx"], mmap_mode="r", allow_pickle=False)
    sample_idx = np.load(files["sample_idx"], mmap_mode="r", allow_pickle=False)
    shuffle_idx = np.load(files["shuffle_idx"], mmap_mode="r", allow_pickle=False)
    return doc_idx, sample_idx, shuffle_idx, files
