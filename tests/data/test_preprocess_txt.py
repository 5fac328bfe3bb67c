"""Issue 17: tools/preprocess_data.py reads plain .txt inputs (one document per non-blank line, or
per file with --txt-document-per-file), alone or mixed with JSONL."""
import json
import os
import subprocess
import sys

import pytest

from data_helpers import ROOT, run_tool
from libai.data import MMapIndexedDataset
from libai.data.preprocess import Encoder, check_inputs
from libai.tokenizer import GPT2Tokenizer

LINES = ["The first document.", "", "Émoji 😀 and 日本語", "   ", "  spaced   out  ", "last line without newline"]


def _docs(prefix):
    ds = MMapIndexedDataset(prefix)
    assert ds.doc_idx.tolist() == list(range(len(ds) + 1))  # one sequence per document
    return [ds[i].tolist() for i in range(len(ds))]


@pytest.mark.parametrize("workers", [1, 2])
def test_txt_one_document_per_line(tmp_path, corpus, workers):
    inp = tmp_path / "corpus.txt"
    inp.write_text("\n".join(LINES[:-1]) + "\r\n" + LINES[-1], encoding="utf-8")  # a CRLF line break too
    prefix = str(tmp_path / "out" / "txt")
    proc = run_tool("tools/preprocess_data.py", "--input", str(inp), "--tokenizer-file", corpus["tokenizer_file"],
                    "--output-prefix", prefix, "--append-eod", "--workers", str(workers), "--chunk-size", "2",
                    "--no-progress")
    assert "txt_text_document" in proc.stdout
    tok = GPT2Tokenizer(tokenizer_file=corpus["tokenizer_file"])
    kept = [t for t in LINES if t.strip()]  # blank and whitespace-only lines are skipped
    assert _docs(prefix + "_text_document") == [tok.encode(t) + [tok.eod] for t in kept]


def test_txt_document_per_file_mixed_with_jsonl(tmp_path, corpus):
    a, b = "Chapter one.\n\nIt begins here.\n", "Second file,\nsecond book."
    (tmp_path / "a.txt").write_text(a, encoding="utf-8")
    (tmp_path / "blank.txt").write_text("\n \n", encoding="utf-8")  # a blank file is no document
    (tmp_path / "b.TXT").write_text(b, encoding="utf-8")
    (tmp_path / "c.jsonl").write_text(json.dumps({"body": "from json"}) + "\n", encoding="utf-8")
    prefix = str(tmp_path / "books")
    run_tool("tools/preprocess_data.py", "--input", *(str(tmp_path / f) for f in ("a.txt", "blank.txt", "b.TXT",
                                                                                 "c.jsonl")),
             "--json-keys", "body", "--txt-document-per-file", "--tokenizer-file", corpus["tokenizer_file"],
             "--output-prefix", prefix, "--no-progress")
    tok = GPT2Tokenizer(tokenizer_file=corpus["tokenizer_file"])
    assert _docs(prefix + "_body_document") == [tok.encode(a), tok.encode(b), tok.encode("from json")]


def _run_failing(*args):
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "preprocess_data.py"), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    return proc.stderr


def test_txt_option_errors(tmp_path):
    err = _run_failing("--input", "x.txt", "--json-keys", "text", "title", "--tokenizer-file", "t.json",
                       "--output-prefix", str(tmp_path / "o"))
    assert "one --json-keys name" in err and "x.txt" in err
    err = _run_failing("--input", "x.jsonl", "--txt-document-per-file", "--tokenizer-file", "t.json",
                       "--output-prefix", str(tmp_path / "o"))
    assert "--txt-document-per-file applies to .txt inputs" in err
    with pytest.raises(ValueError, match="one --json-keys name"):
        check_inputs(["a.jsonl", "b.txt"], ["text", "title"])
    check_inputs("a.txt", ["text"], txt_document_per_file=True)


def test_plain_text_without_txt_suffix_names_the_file_and_line(tmp_path, corpus):
    inp = tmp_path / "corpus.raw"
    inp.write_text(json.dumps({"text": "fine"}) + "\njust some words\n", encoding="utf-8")
    err = _run_failing("--input", str(inp), "--tokenizer-file", corpus["tokenizer_file"],
                       "--output-prefix", str(tmp_path / "o"), "--no-progress")
    assert f"{inp}:2: not a JSON line" in err and "*.txt" in err
    enc = Encoder({"tokenizer_file": corpus["tokenizer_file"]})
    enc.initializer()
    with pytest.raises(ValueError, match="must be an object"):
        enc.encode('"a string"')
