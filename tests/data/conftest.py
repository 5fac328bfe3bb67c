"""Shared fixtures of the data tests: a default corpus built once per session in a temporary
cache, and a tiny tokenizer trained with tools/train_tokenizer.py."""
import json

import pytest

from data_helpers import TINY_TEXT, run_tool


@pytest.fixture(scope="session")
def corpus(tmp_path_factory):
    from libai.data.corpus import default_gpt2_corpus

    return default_gpt2_corpus(cache_dir=str(tmp_path_factory.mktemp("corpus_cache")), vocab_size=2048)


@pytest.fixture(scope="session")
def tiny_tokenizer_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny_tok")
    (d / "a.txt").write_text(TINY_TEXT * 3, encoding="utf-8")
    with open(d / "b.jsonl", "w", encoding="utf-8") as f:
        for line in TINY_TEXT.splitlines():
            f.write(json.dumps({"text": line, "other": 1}) + "\n")
    out = d / "tok"
    run_tool("tools/train_tokenizer.py", "--input", str(d / "a.txt"), str(d / "b.jsonl"), "--vocab-size", "400",
             "--output-dir", str(out), "--quiet")
    return out
