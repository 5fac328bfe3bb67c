"""GPT2Dataset: Megatron's doc_idx / sample_idx / shuffle_idx, sample contents, determinism,
the .npy cache."""
import os

import numpy as np
import pytest

from libai.data import GPT2Dataset, Instance, MMapIndexedDataset, MMapIndexedDatasetBuilder
from libai.data.datasets import gpt_dataset as gd
from libai.data.indexed_dataset import data_file_path, index_file_path


def make_data(tmp_path, n_docs=40, seed=0, with_empty=True, name="d"):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 120, size=n_docs)
    if with_empty:
        lengths[[3, 4, 17]] = 0
    prefix = str(tmp_path / name)
    b = MMapIndexedDatasetBuilder(data_file_path(prefix), dtype=np.uint16)
    docs = []
    for i, n in enumerate(lengths):
        d = rng.integers(1, 5000, size=n)
        d[-1:] = 0  # an EOD-like end marker
        docs.append(d)
        b.add_item(d)
        b.end_document()
    b.finalize(index_file_path(prefix))
    return prefix, docs


def megatron_sample_idx(sizes, doc_idx, seq_length, num_epochs, tokens_per_epoch):
    """A line-by-line port of Megatron's helpers.cpp build_sample_idx (the reference)."""
    num_samples = (num_epochs * tokens_per_epoch - 1) // seq_length
    out = np.zeros((num_samples + 1, 2), dtype=np.int64)
    sample_index, doc_idx_index, doc_offset = 1, 0, 0
    while sample_index <= num_samples:
        remaining = seq_length + 1
        while remaining != 0:
            doc_length = int(sizes[doc_idx[doc_idx_index]]) - doc_offset
            remaining -= doc_length
            if remaining <= 0:
                doc_offset += remaining + doc_length - 1
                remaining = 0
            else:
                doc_idx_index += 1
                doc_offset = 0
        out[sample_index] = (doc_idx_index, doc_offset)
        sample_index += 1
    return out


@pytest.mark.parametrize("seq_length,num_samples", [(16, 50), (64, 300), (7, 1000), (200, 10), (1, 40)])
def test_samples_reproduce_the_document_stream(tmp_path, seq_length, num_samples):
    prefix, docs = make_data(tmp_path)
    documents = np.arange(5, 35)
    ds = GPT2Dataset("train", prefix, documents=documents, num_samples=num_samples, seq_length=seq_length, seed=7)
    assert len(ds) >= num_samples
    tokens_per_epoch = sum(len(docs[d]) for d in documents)
    epochs = len(ds.doc_idx) // len(documents)
    assert len(ds.doc_idx) == epochs * len(documents)
    assert (epochs * tokens_per_epoch - 1) // seq_length >= num_samples
    assert epochs == 1 or ((epochs - 1) * tokens_per_epoch - 1) // seq_length < num_samples
    # every epoch holds each document of the split exactly once per epoch overall
    values, counts = np.unique(np.asarray(ds.doc_idx), return_counts=True)
    assert values.tolist() == documents.tolist() and (counts == epochs).all()
    # the stream of the shuffled documents; raw sample i is its tokens [i*sl, i*sl + sl]
    stream = np.concatenate([docs[d] for d in ds.doc_idx]).astype(np.int64)
    assert sorted(np.asarray(ds.shuffle_idx).tolist()) == list(range(len(ds)))
    inverse = np.argsort(np.asarray(ds.shuffle_idx))
    pieces = []
    for i in range(len(ds)):
        tokens = ds.get_tokens(int(inverse[i]))
        assert tokens.shape == (seq_length + 1,)
        assert np.array_equal(tokens, stream[i * seq_length: i * seq_length + seq_length + 1]), i
        pieces.append(tokens[:-1])
    pieces.append(tokens[-1:])
    joined = np.concatenate(pieces)
    assert np.array_equal(joined, stream[:len(joined)])
    # same as Megatron's C++ loop
    ref = megatron_sample_idx(MMapIndexedDataset(prefix).sizes, np.asarray(ds.doc_idx), seq_length, epochs,
                              tokens_per_epoch)
    assert np.array_equal(np.asarray(ds.sample_idx), ref)


def test_getitem_instance(tmp_path):
    prefix, _ = make_data(tmp_path)
    ds = GPT2Dataset("train", prefix, num_samples=20, seq_length=32, seed=1)
    s = ds[3]
    assert isinstance(s, Instance) and set(s.get_fields()) == {"input_ids", "labels"}
    x, y = s.input_ids.tensor.numpy(), s.labels.tensor.numpy()
    t = ds.get_tokens(3)
    assert x.dtype == np.int64 and x.shape == (32,) and y.shape == (32,)
    assert np.array_equal(x, t[:-1]) and np.array_equal(y, t[1:])
    assert s.input_ids.sbp_list == ["split_0", "broadcast"] and s.input_ids.placement_idx == 0
    assert s.labels.placement_idx == -1


def test_determinism_and_seed(tmp_path):
    prefix, _ = make_data(tmp_path)
    a = GPT2Dataset("train", prefix, num_samples=200, seq_length=16, seed=3, cache_dir=str(tmp_path / "c1"))
    b = GPT2Dataset("train", prefix, num_samples=200, seq_length=16, seed=3, cache_dir=str(tmp_path / "c2"))
    c = GPT2Dataset("train", prefix, num_samples=200, seq_length=16, seed=4, cache_dir=str(tmp_path / "c1"))
    for k in ("doc_idx", "sample_idx", "shuffle_idx"):
        assert np.array_equal(getattr(a, k), getattr(b, k))
    assert not np.array_equal(a.doc_idx, c.doc_idx)
    assert not np.array_equal(a.shuffle_idx, c.shuffle_idx[:len(a.shuffle_idx)])
    assert [a.get_tokens(i).tolist() for i in range(10)] == [b.get_tokens(i).tolist() for i in range(10)]
    assert [a.get_tokens(i).tolist() for i in range(10)] != [c.get_tokens(i).tolist() for i in range(10)]


def test_cache_files_reused(tmp_path, monkeypatch):
    prefix, _ = make_data(tmp_path)
    a = GPT2Dataset("train", prefix, num_samples=100, seq_length=16, seed=5)
    files = a.cache_files
    assert all(os.path.isfile(f) and os.path.dirname(f) == str(tmp_path) for f in files.values())
    names = [os.path.basename(f) for f in files.values()]
    assert all(n.startswith("d_train_indexmap_100ns_16sl_5s_") for n in names)
    mtimes = {k: os.stat(f).st_mtime_ns for k, f in files.items()}

    def boom(*args, **kwargs):
        raise AssertionError("index mappings rebuilt instead of loaded from the cache")

    monkeypatch.setattr(gd, "_compute", boom)
    b = GPT2Dataset("train", prefix, num_samples=100, seq_length=16, seed=5)
    assert b.cache_files == files and {k: os.stat(f).st_mtime_ns for k, f in files.items()} == mtimes
    assert np.array_equal(a.shuffle_idx, b.shuffle_idx)
    # another key (seed, split documents, num_samples) is a separate cache entry
    with pytest.raises(AssertionError, match="rebuilt"):
        GPT2Dataset("train", prefix, num_samples=100, seq_length=16, seed=6)
    with pytest.raises(AssertionError, match="rebuilt"):
        GPT2Dataset("train", prefix, documents=np.arange(10), num_samples=100, seq_length=16, seed=5)


def test_separate_last_epoch(tmp_path):
    prefix, docs = make_data(tmp_path, with_empty=False)
    tokens = sum(len(d) for d in docs)
    sl = 10
    per_epoch = (tokens - 1) // sl
    n = per_epoch + 5  # the second epoch is needed for only 5 samples (< 80%)
    ds = GPT2Dataset("train", prefix, num_samples=n, seq_length=sl, seed=0)
    assert len(ds.doc_idx) == 2 * len(docs)
    # each half of doc_idx is a whole epoch (shuffled separately)
    assert sorted(np.asarray(ds.doc_idx[:len(docs)]).tolist()) == list(range(len(docs)))
    first = ((2 - 1) * tokens - 1) // sl
    assert sorted(np.asarray(ds.shuffle_idx[:first]).tolist()) == list(range(first))


def test_lazy_indexed_dataset_and_errors(tmp_path):
    from libai.config import LazyCall
    from libai.data import get_indexed_dataset

    prefix, _ = make_data(tmp_path)
    ds = GPT2Dataset("x", indexed_dataset=LazyCall(get_indexed_dataset)(data_prefix=prefix), max_seq_length=8,
                     max_num_samples=5)
    assert ds.seq_length == 8 and len(ds) >= 5 and ds.data_prefix == prefix
    with pytest.raises(ValueError):
        GPT2Dataset("x")
    with pytest.raises(ValueError):
        GPT2Dataset("x", prefix, documents=np.array([3, 4]), seq_length=4)  # only empty documents
