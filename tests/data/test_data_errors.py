"""Errors that name the culprit (issue 10): a broken indexed dataset (.bin / .idx), broken or
missing GPT-2 tokenizer files, and GPT-2 splits too small for one sample. Each error must name
the file (full path) or the config key and what was expected, as early as it can be known."""
import json
import os
import struct
import subprocess
import sys

import numpy as np
import pytest
from data_helpers import ROOT, write_indexed

from libai.config import LazyCall
from libai.data import (
    GPT2Dataset,
    MMapIndexedDataset,
    MMapIndexedDatasetBuilder,
    build_nlp_train_val_test_loader,
)
from libai.tokenizer import GPT2Tokenizer

DOCS = [list(range(1, 11)), list(range(20, 40)), list(range(100, 130))]  # 60 uint16 tokens, 120 bytes


@pytest.fixture
def prefix(tmp_path):
    return write_indexed(tmp_path / "corpus_text_document", DOCS)


# ---------------------------------------------------------------------- 1. .bin against the index
def test_bin_shorter_than_index_is_refused_at_open(prefix):
    bin_path = prefix + ".bin"
    with open(bin_path, "r+b") as f:
        f.truncate(50)
    with pytest.raises(ValueError) as e:
        MMapIndexedDataset(prefix)
    msg = str(e.value)
    assert bin_path in msg and prefix + ".idx" in msg
    assert "50 bytes" in msg and "120 bytes" in msg
    # the same through LiBai's helper and GPT2Dataset (before any index mapping is built)
    from libai.data import get_indexed_dataset

    with pytest.raises(ValueError, match="120 bytes"):
        get_indexed_dataset(prefix)
    with pytest.raises(ValueError, match="120 bytes"):
        GPT2Dataset("train", prefix, seq_length=4)


def test_empty_bin_with_tokens_in_index_is_refused(prefix):
    open(prefix + ".bin", "wb").close()
    with pytest.raises(ValueError) as e:
        MMapIndexedDataset(prefix)
    assert prefix + ".bin" in str(e.value) and "0 bytes" in str(e.value) and "120 bytes" in str(e.value)


def test_bin_longer_than_index_is_accepted(prefix):
    with open(prefix + ".bin", "ab") as f:
        f.write(b"\x00" * 7)  # trailing bytes: Megatron ignores them, and so do we
    ds = MMapIndexedDataset(prefix)
    assert [ds[i].tolist() for i in range(3)] == DOCS


def test_empty_sequences_need_no_bin_bytes(tmp_path):
    p = write_indexed(tmp_path / "e", [[], []])
    assert os.path.getsize(p + ".bin") == 0 and len(MMapIndexedDataset(p)) == 2


def test_missing_file_is_named(prefix):
    os.remove(prefix + ".bin")
    with pytest.raises(FileNotFoundError) as e:
        MMapIndexedDataset(prefix)
    assert prefix + ".bin" in str(e.value) and prefix + ".idx" not in str(e.value)


def test_relative_prefix_is_reported_as_a_full_path(prefix, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with open(prefix + ".bin", "r+b") as f:
        f.truncate(10)
    with pytest.raises(ValueError) as e:
        MMapIndexedDataset("corpus_text_document")
    assert prefix + ".bin" in str(e.value)


# ---------------------------------------------------------------------- 2. the .idx
HEADER = 9 + 8 + 1 + 8 + 8  # magic, version, dtype code, sequences, document boundaries


def _idx_bytes(prefix):
    with open(prefix + ".idx", "rb") as f:
        return f.read()


@pytest.mark.parametrize("cut,expected", [
    (0, "0 bytes"), (5, "5 bytes"), (12, "12 bytes"), (20, "20 bytes"), (30, "30 bytes"),
])
def test_idx_shorter_than_its_header(prefix, cut, expected):
    raw = _idx_bytes(prefix)
    with open(prefix + ".idx", "wb") as f:
        f.write(raw[:cut])
    with pytest.raises(ValueError) as e:
        MMapIndexedDataset(prefix)
    msg = str(e.value)
    assert prefix + ".idx" in msg and "truncated" in msg and expected in msg and f"{HEADER}-byte header" in msg


@pytest.mark.parametrize("cut", [1, 3, 8, 30])
def test_idx_shorter_than_its_counts(prefix, cut):
    raw = _idx_bytes(prefix)
    with open(prefix + ".idx", "wb") as f:
        f.write(raw[:-cut])
    with pytest.raises(ValueError) as e:
        MMapIndexedDataset(prefix)
    msg = str(e.value)
    need = HEADER + 3 * 4 + 3 * 8 + 4 * 8
    assert len(raw) == need
    assert prefix + ".idx" in msg and "3 sequences" in msg and "4 document boundaries" in msg
    assert f"{need} bytes" in msg and f"{need - cut} bytes" in msg and "truncated" in msg


def test_idx_garbage(prefix):
    with open(prefix + ".idx", "wb") as f:
        f.write(b"this is not an index at all, just some text\n" * 3)
    with pytest.raises(ValueError) as e:
        MMapIndexedDataset(prefix)
    assert prefix + ".idx" in str(e.value) and "magic" in str(e.value)


def test_idx_wrong_version(prefix):
    raw = _idx_bytes(prefix)
    with open(prefix + ".idx", "wb") as f:
        f.write(raw[:9] + struct.pack("<Q", 2) + raw[17:])
    with pytest.raises(ValueError) as e:
        MMapIndexedDataset(prefix)
    assert prefix + ".idx" in str(e.value) and "version 2" in str(e.value) and "expected 1" in str(e.value)


def test_idx_unknown_dtype_code(prefix):
    raw = _idx_bytes(prefix)
    with open(prefix + ".idx", "wb") as f:
        f.write(raw[:17] + bytes([99]) + raw[18:])
    with pytest.raises(ValueError) as e:
        MMapIndexedDataset(prefix)
    msg = str(e.value)
    assert prefix + ".idx" in msg and "dtype code 99" in msg and "8 uint16" in msg


def _poke(prefix, offset, fmt, value):
    """Overwrite one little-endian value of the .idx body (header 34 bytes, sizes int32[3],
    pointers int64[3], doc_idx int64[4] for DOCS)."""
    raw = bytearray(_idx_bytes(prefix))
    struct.pack_into(fmt, raw, offset, value)
    with open(prefix + ".idx", "wb") as f:
        f.write(bytes(raw))


@pytest.mark.parametrize("where, fmt, value, expected", [
    (34 + 4 * 1, "<i", -5, "sizes[1] = -5 is negative"),
    (34 + 12 + 8 * 2, "<q", -1, "pointers[2] = -1 is negative"),
    (34 + 12 + 8 * 1, "<q", 10 ** 12, "describes 1000000000040 bytes"),  # sequence 1 runs past the .bin
    (34 + 4 * 0, "<i", 2 ** 30, "describes 2147483648 bytes"),
    (34 + 36 + 8 * 3, "<q", 7, "doc_idx must rise from 0 to the 3 sequences, got [0, 1, 2, 7]"),
])
def test_a_damaged_idx_body_is_refused_at_open(prefix, where, fmt, value, expected):
    """Sizes and pointers are checked against each other and the .bin when the dataset opens, not
    when a sample first reads them (a bare numpy error then, or a silently wrong sample)."""
    _poke(prefix, where, fmt, value)
    with pytest.raises(ValueError) as e:
        MMapIndexedDataset(prefix)
    assert prefix + ".idx" in str(e.value) and expected in str(e.value)


def test_merge_file_names_a_broken_index(prefix, tmp_path):
    raw = _idx_bytes(prefix)
    with open(prefix + ".idx", "wb") as f:
        f.write(raw[:40])
    b = MMapIndexedDatasetBuilder(str(tmp_path / "merged.bin"), dtype=np.uint16)
    with pytest.raises(ValueError, match=prefix + ".idx"):
        b.merge_file_(prefix)


# ---------------------------------------------------------------------- 3. tokenizer files
VOCAB = {"<|endoftext|>": 0, "a": 1, "b": 2, "ab": 3, "c": 4, "abc": 5}
MERGES = "#version: 0.2\na b\nab c\n"


@pytest.fixture
def tok_files(tmp_path):
    vocab, merges = tmp_path / "vocab.json", tmp_path / "merges.txt"
    vocab.write_text(json.dumps(VOCAB), encoding="utf-8")
    merges.write_text(MERGES, encoding="utf-8")
    return str(vocab), str(merges)


def test_good_files_load(tok_files):
    tok = GPT2Tokenizer(*tok_files)
    assert tok.encode("abc") == [5] and tok.encode("ab") == [3] and len(tok) == 6


@pytest.mark.parametrize("which,content,expected", [
    ("vocab", "{not json", "not valid JSON"),
    ("vocab", "", "not valid JSON"),
    ("vocab", '{"a": 1,}', "line 1 column 9"),
    ("vocab", "[1, 2]", "got a list"),
    ("vocab", '{"a": "x", "b": 2}', "token 'a' has the id 'x'"),
    ("vocab", '{"a": -1}', "token 'a' has the id -1"),
    ("vocab", '{"a": 1.5}', "token 'a' has the id 1.5"),
    ("vocab", b'{"\xff\xfe": 1}', "is not UTF-8 text"),
    ("merges", "#version: 0.2\na b c\n", "line 2: expected two tokens separated by a space, got 'a b c'"),
    ("merges", "a b\nab\n", "line 2: expected two tokens separated by a space, got 'ab'"),
    ("merges", "#version: 0.2\na b\nab z\n", "line 3: 'z' is not in the vocabulary"),
    ("merges", "#version: 0.2\nb c\n", "line 2: the merged token 'bc' is not in the vocabulary"),
])
def test_broken_tokenizer_file(tok_files, which, content, expected):
    vocab, merges = tok_files
    path = vocab if which == "vocab" else merges
    with open(path, "wb") as f:
        f.write(content if isinstance(content, bytes) else content.encode("utf-8"))
    with pytest.raises(ValueError) as e:
        GPT2Tokenizer(vocab, merges)
    msg = str(e.value)
    assert f"{which}_file {path}" in msg and expected in msg


def test_merges_blank_lines_and_crlf_are_accepted(tok_files):
    vocab, merges = tok_files
    with open(merges, "w", encoding="utf-8", newline="") as f:
        f.write("#version: 0.2\r\na b\r\n\r\nab c\r\n\r\n")
    assert GPT2Tokenizer(vocab, merges).encode("abc") == [5]


@pytest.mark.parametrize("which", ["vocab", "merges"])
def test_missing_tokenizer_file(tok_files, which):
    vocab, merges = tok_files
    missing = os.path.join(os.path.dirname(vocab), "nope", "file")
    args = (missing, merges) if which == "vocab" else (vocab, missing)
    with pytest.raises(FileNotFoundError) as e:
        GPT2Tokenizer(*args)
    assert missing in str(e.value) and f"{which}_file" in str(e.value)


def test_tokenizer_json_broken_or_missing(tmp_path):
    path = tmp_path / "tokenizer.json"
    with pytest.raises(FileNotFoundError, match=str(path)):
        GPT2Tokenizer(tokenizer_file=str(path))
    path.write_text('{"version": "1.0", "model": 3}', encoding="utf-8")
    with pytest.raises(ValueError) as e:
        GPT2Tokenizer(tokenizer_file=str(path))
    assert str(path) in str(e.value) and "tokenizer_file" in str(e.value)


def test_relative_tokenizer_paths_are_reported_in_full(tok_files, tmp_path, monkeypatch):
    vocab, _ = tok_files
    monkeypatch.chdir(tmp_path)
    with open(vocab, "w", encoding="utf-8") as f:
        f.write("[]")
    with pytest.raises(ValueError, match=vocab):
        GPT2Tokenizer("vocab.json", "merges.txt")


# ---------------------------------------------------------------------- 4. GPT-2 splits
def test_split_shorter_than_one_sample(prefix):
    with pytest.raises(ValueError) as e:
        GPT2Dataset("gpt-2_valid", prefix, documents=np.array([0, 1]), num_samples=5, seq_length=32)
    msg = str(e.value)
    assert "'gpt-2_valid'" in msg and "30 tokens in 2 documents" in msg and prefix in msg
    assert "seq_length + 1 = 33 tokens" in msg
    assert "dataloader.train.splits" in msg and "dataloader.train.dataset[0].seq_length" in msg
    # one epoch requested (num_samples None) and empty documents: the same error
    with pytest.raises(ValueError, match="30 tokens in 2 documents"):
        GPT2Dataset("gpt-2_valid", prefix, documents=np.array([0, 1]), seq_length=32)
    empty = write_indexed(os.path.dirname(prefix) + "/empty", [[], [1]])
    with pytest.raises(ValueError, match=r"'x': the split has 0 tokens in 1 documents"):
        GPT2Dataset("x", empty, documents=np.array([0]), seq_length=4)


def test_split_of_exactly_one_sample_is_enough(prefix):
    ds = GPT2Dataset("train", prefix, documents=np.array([0, 1]), num_samples=50, seq_length=29)
    assert len(ds) >= 50 and ds.get_tokens(0).shape == (30,)


def test_the_last_epoch_bound_matches_megatron(tmp_path):
    """Sizes that hit the off-by-one of the old `last_epoch_num_samples < per_epoch + 1` assert
    (Megatron's bound is <=): the mapping is built, and equals Megatron's."""
    from test_gpt2_dataset import megatron_sample_idx

    p = write_indexed(tmp_path / "d", [list(range(1, 11)), list(range(11, 26))])  # 25 tokens
    # 3 samples need 2 epochs of 1 sample each ((25 - 1) // 16), the last one for 2 = per_epoch + 1
    ds = GPT2Dataset("gpt-2_valid", p, num_samples=3, seq_length=16, seed=0)
    assert len(ds) == 3
    ref = megatron_sample_idx(ds.indexed_dataset.sizes, np.asarray(ds.doc_idx), 16, 2, 25)
    assert np.array_equal(np.asarray(ds.sample_idx), ref)
    # the reported case: a small valid split and LiBai's default eval_iter (1e5 batches of 8)
    p = write_indexed(tmp_path / "v", [list(range(1, 139))])  # 138 tokens
    ds = GPT2Dataset("gpt-2_valid", p, num_samples=800000, seq_length=128, seed=1234)
    assert len(ds) >= 800000


def _loader(prefix, splits, nums, seq_length=8):
    return build_nlp_train_val_test_loader(
        dataset=[LazyCall(GPT2Dataset)(name="gpt-2", data_prefix=prefix, seq_length=seq_length, seed=1)],
        splits=[splits], weights=[1.0], train_val_test_num_samples=nums, train_batch_size=2, test_batch_size=2)


def test_loader_names_the_small_split(tmp_path):
    p = write_indexed(tmp_path / "d", [list(range(1, 31)), list(range(1, 6))])  # train 30 tokens, valid 5
    with pytest.raises(Exception) as e:  # the ValueError, wrapped by instantiate (InstantiationError)
        _loader(p, [1.0, 1.0, 0.0], [10, 10, 0], seq_length=8)
    msg = str(e.value)
    assert "'gpt-2_valid'" in msg and "5 tokens in 1 documents" in msg and "seq_length + 1 = 9 tokens" in msg


def test_empty_train_split_names_the_splits(prefix):
    with pytest.raises(ValueError) as e:
        _loader(prefix, [0.0, 1.0, 1.0], [10, 10, 10])
    msg = str(e.value)
    assert "dataloader.train.splits" in msg and "[0.0, 1.0, 1.0]" in msg and "3 documents" in msg


def test_eval_split_repeated_many_times_is_refused(prefix):
    with pytest.raises(ValueError) as e:
        _loader(prefix, [2.0, 1.0, 0.0], [10, 3000, 0])
    text = str(e.value)
    assert "'gpt-2_valid'" in text and "3000 samples" in text and "holds 3 samples" in text
    assert "train.evaluation.eval_iter" in text and "dataloader.train.splits" in text
    _, valid, _ = _loader(prefix, [2.0, 1.0, 0.0], [10, 30, 0])  # repeated 10 times: accepted
    assert len(valid.dataset) >= 30


def test_train_net_reports_the_small_split(tmp_path):
    """End to end: the GPT-2 recipe on a corpus whose valid split (1 of 20 documents) is
    shorter than one 128-token sample fails before training, naming the split and the keys."""
    write_indexed(tmp_path / "tiny_text_document", [[1 + (i + k) % 5 for k in range(60)] for i in range(20)])
    (tmp_path / "vocab.json").write_text(json.dumps(VOCAB), encoding="utf-8")
    (tmp_path / "merges.txt").write_text(MERGES, encoding="utf-8")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p))
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "tools", "train_net.py"), "--config-file",
         os.path.join(ROOT, "configs", "gpt2_pretrain.py"), f"train.output_dir={tmp_path / 'out'}",
         f"tokenization.tokenizer.vocab_file={tmp_path / 'vocab.json'}",
         f"tokenization.tokenizer.merges_file={tmp_path / 'merges.txt'}",
         f"dataloader.train.dataset.0.data_prefix={tmp_path / 'tiny_text_document'}",
         "train.evaluation.eval_iter=100000"],
        cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=120, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert "GPT2Dataset 'gpt-2_valid': the split has 60 tokens in 1 documents" in out, out
    assert "seq_length + 1 = 129 tokens" in out and "model.cfg.max_seq_length" in out
    assert "Starting training" not in out


def test_unequal_blending_weights_are_refused_not_ignored(prefix):
    with pytest.raises(NotImplementedError, match=r"weights \[1\.0, 3\.0\]: blending datasets by weight is not"):
        build_nlp_train_val_test_loader(
            dataset=[LazyCall(GPT2Dataset)(name=n, data_prefix=prefix, seq_length=8, seed=1) for n in ("a", "b")],
            splits=[[2.0, 1.0, 0.0]] * 2, weights=[1.0, 3.0], train_val_test_num_samples=[10, 10, 0],
            train_batch_size=2, test_batch_size=2)


def test_an_unknown_loader_argument_is_an_error_naming_it():
    from libai.config import instantiate
    from libai.data import build_train_loader
    from libai.data.datasets import BlobsDataset

    node = LazyCall(build_train_loader)(dataset=LazyCall(BlobsDataset)(num_samples=8, dim=2, num_classes=2),
                                        train_batch_size=2, mixup_func=None)
    with pytest.raises(Exception, match="mixup_func"):
        instantiate(node)
