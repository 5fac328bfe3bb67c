"""The default corpus (Python's pydoc topics): built once, cached, concurrent-safe."""
import json
import multiprocessing
import os
import time

import numpy as np

from libai.data import MMapIndexedDataset
from libai.data.corpus import default_corpus_documents, default_gpt2_corpus
from libai.tokenizer import GPT2Tokenizer


def test_corpus_contents(corpus):
    docs = default_corpus_documents()
    ds = MMapIndexedDataset(corpus["data_prefix"])
    tok = GPT2Tokenizer(corpus["vocab_file"], corpus["merges_file"])
    meta = json.load(open(corpus["meta_file"]))
    assert len(ds) == len(docs) == meta["documents"] and len(docs) > 50
    assert sum(len(d) for d in docs) > 200_000
    assert int(np.sum(ds.sizes)) == meta["tokens"] and meta["vocab_size"] == len(tok) <= 2048
    for i in (0, len(docs) // 2, len(docs) - 1):
        assert ds[i].tolist() == tok.encode(docs[i]) + [tok.eod]
        assert tok.decode(ds[i][:-1]) == docs[i]


def test_cached_second_call_fast_same_files(tmp_path):
    t0 = time.time()
    a = default_gpt2_corpus(cache_dir=str(tmp_path), vocab_size=1024)
    build = time.time() - t0
    mtimes = {k: os.stat(a[k]).st_mtime_ns for k in ("vocab_file", "merges_file", "tokenizer_file", "meta_file")}
    t0 = time.time()
    b = default_gpt2_corpus(cache_dir=str(tmp_path), vocab_size=1024)
    assert time.time() - t0 < max(0.2, build / 5)
    assert a == b
    assert {k: os.stat(b[k]).st_mtime_ns for k in mtimes} == mtimes
    # no temporary directories left behind; another vocab size is another entry
    c = default_gpt2_corpus(cache_dir=str(tmp_path), vocab_size=512)
    assert c["directory"] != a["directory"]
    assert not [n for n in os.listdir(tmp_path) if ".tmp" in n]


def _build(cache_dir, q):
    q.put(default_gpt2_corpus(cache_dir=cache_dir, vocab_size=1024))


def test_concurrent_builders_agree(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_build, args=(str(tmp_path), q)) for _ in range(3)]
    for p in procs:
        p.start()
    results = [q.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    assert all(r == results[0] for r in results)
    assert MMapIndexedDataset.exists(results[0]["data_prefix"])
    entries = [n for n in os.listdir(tmp_path) if not n.endswith(".lock")]
    assert entries == [os.path.basename(results[0]["directory"])]


def test_cache_dir_from_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("LIBAI_CACHE_DIR", str(tmp_path / "root"))
    p = default_gpt2_corpus(vocab_size=600)
    assert p["directory"].startswith(str(tmp_path / "root" / "default_corpus"))


def test_tokenization_append_eod_reaches_the_default_corpus(tmp_path, monkeypatch):
    from libai.config import LazyConfig
    from libai.data.corpus import apply_default_corpus

    monkeypatch.setenv("LIBAI_CACHE_DIR", str(tmp_path))
    ends = {}
    for append_eod in (True, False):
        cfg = LazyConfig.load(os.path.join(os.path.dirname(__file__), "..", "..", "configs", "gpt2_pretrain.py"))
        cfg.tokenization.default_corpus_vocab_size = 600
        cfg.tokenization.append_eod = append_eod
        paths = apply_default_corpus(cfg)
        tok = GPT2Tokenizer(paths["vocab_file"], paths["merges_file"])
        ends[append_eod] = int(MMapIndexedDataset(paths["data_prefix"])[0][-1]) == tok.eod
    assert ends == {True: True, False: False}
