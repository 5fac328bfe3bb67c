"""MMapIndexedDataset format and tools/preprocess_data.py end to end."""
import json
import struct

import numpy as np
import pytest

from data_helpers import run_tool
from libai.data import MMapIndexedDataset, MMapIndexedDatasetBuilder, best_fitting_dtype
from libai.data.indexed_dataset import data_file_path, index_file_path
from libai.tokenizer import GPT2Tokenizer


def _write(prefix, docs, dtype):
    b = MMapIndexedDatasetBuilder(data_file_path(prefix), dtype=dtype)
    for d in docs:
        b.add_item(np.asarray(d))
        b.end_document()
    b.finalize(index_file_path(prefix))


@pytest.mark.parametrize("dtype", [np.uint16, np.int32, np.int64])
def test_roundtrip_and_layout(tmp_path, dtype):
    rng = np.random.default_rng(0)
    docs = [rng.integers(0, 60000 if dtype == np.uint16 else 10**6, size=n) for n in (5, 0, 17, 1, 300)]
    prefix = str(tmp_path / "x")
    assert not MMapIndexedDataset.exists(prefix)
    _write(prefix, docs, dtype)
    assert MMapIndexedDataset.exists(prefix)
    ds = MMapIndexedDataset(prefix)
    assert len(ds) == len(docs) and ds.dtype == np.dtype(dtype)
    assert ds.sizes.tolist() == [len(d) for d in docs]
    assert ds.doc_idx.tolist() == list(range(len(docs) + 1))
    for i, d in enumerate(docs):
        assert np.array_equal(ds[i], d)
    assert np.array_equal(ds[-1], docs[-1])
    parts = ds[1:4]
    assert len(parts) == 3 and all(np.array_equal(p, d) for p, d in zip(parts, docs[1:4]))
    assert np.array_equal(ds.get(4, offset=10, length=7), docs[4][10:17])
    assert np.array_equal(ds.get(4, offset=290), docs[4][290:])
    assert np.array_equal(ds.get(2, length=3), docs[2][:3])
    with pytest.raises(IndexError):
        ds.get(0, offset=3, length=5)
    with pytest.raises(IndexError):
        ds[5]
    # the Megatron byte layout of the index
    raw = open(index_file_path(prefix), "rb").read()
    assert raw[:9] == b"MMIDIDX\x00\x00"
    assert struct.unpack("<Q", raw[9:17])[0] == 1
    assert raw[17] == {np.uint16: 8, np.int32: 4, np.int64: 5}[dtype]
    n, ndoc = struct.unpack("<QQ", raw[18:34])
    assert (n, ndoc) == (5, 6)
    sizes = np.frombuffer(raw, np.int32, n, 34)
    pointers = np.frombuffer(raw, np.int64, n, 34 + 4 * n)
    assert sizes.tolist() == [5, 0, 17, 1, 300]
    item = np.dtype(dtype).itemsize
    assert pointers.tolist() == (np.concatenate([[0], np.cumsum(sizes[:-1])]) * item).tolist()
    assert len(raw) == 34 + 4 * n + 8 * n + 8 * ndoc
    assert (tmp_path / "x.bin").stat().st_size == sizes.sum() * item


def test_best_fitting_dtype_and_range_check(tmp_path):
    assert best_fitting_dtype(50257) == np.uint16
    assert best_fitting_dtype(65499) == np.uint16
    assert best_fitting_dtype(65500) == np.int32
    b = MMapIndexedDatasetBuilder(str(tmp_path / "y.bin"), dtype=np.uint16)
    with pytest.raises(ValueError):
        b.add_item([70000])


def test_bad_magic(tmp_path):
    (tmp_path / "z.idx").write_bytes(b"NOTANIDX" + b"\x00" * 40)
    (tmp_path / "z.bin").write_bytes(b"")
    with pytest.raises(ValueError, match="magic"):
        MMapIndexedDataset(str(tmp_path / "z"))


@pytest.mark.parametrize("workers", [1, 2])
def test_preprocess_data_end_to_end(tmp_path, corpus, workers):
    texts = ["First document.\nWith two lines.", "", "Émoji 😀 and 日本語", "  spaced   out  ",
             "<|endoftext|> inside", "x" * 1000] + [f"document number {i} " * (i % 7 + 1) for i in range(60)]
    inp = tmp_path / "data.jsonl"
    with open(inp, "w", encoding="utf-8") as f:
        for t in texts:
            f.write(json.dumps({"text": t, "title": t[:5]}, ensure_ascii=False) + "\n")
        f.write("\n")  # a blank line is skipped
    prefix = str(tmp_path / "out" / "my-gpt2")
    proc = run_tool("tools/preprocess_data.py", "--input", str(inp), "--json-keys", "text", "title",
                    "--tokenizer-name", "GPT2Tokenizer", "--vocab-file", corpus["vocab_file"],
                    "--merge-file", corpus["merges_file"], "--output-prefix", prefix, "--append-eod",
                    "--workers", str(workers), "--chunk-size", "4", "--dataset-impl", "mmap")
    assert "my-gpt2_text_document" in proc.stdout
    tok = GPT2Tokenizer(corpus["vocab_file"], corpus["merges_file"])
    for key in ("text", "title"):
        ds = MMapIndexedDataset(prefix + f"_{key}_document")
        assert len(ds) == len(texts) and ds.dtype == np.uint16
        assert ds.doc_idx.tolist() == list(range(len(texts) + 1))
        for i, t in enumerate(texts):
            want = tok.encode(t if key == "text" else t[:5]) + [tok.eod]
            assert ds[i].tolist() == want, (key, i)


def test_preprocess_without_eod(tmp_path, corpus):
    inp = tmp_path / "d.jsonl"
    inp.write_text("\n".join(json.dumps({"text": t}) for t in ["a b c", "d e"]) + "\n", encoding="utf-8")
    run_tool("tools/preprocess_data.py", "--input", str(inp), "--tokenizer-file", corpus["tokenizer_file"],
             "--output-prefix", str(tmp_path / "p"), "--no-progress")
    ds = MMapIndexedDataset(str(tmp_path / "p_text_document"))
    tok = GPT2Tokenizer(tokenizer_file=corpus["tokenizer_file"])
    assert [ds[i].tolist() for i in range(2)] == [tok.encode("a b c"), tok.encode("d e")]
