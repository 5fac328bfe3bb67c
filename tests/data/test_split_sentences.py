"""Sentence splitting and BERT's sentence-level indexed datasets
(`tools/preprocess_data.py --split-sentences`)."""
import json
import os
import subprocess
import sys

import pytest

from libai.data import get_indexed_dataset
from libai.data.sentences import split_sentences
from libai.tokenizer import BertTokenizer, train_wordpiece_tokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.parametrize("text, sentences", [
    ("Hello world. This is Mr. Smith. He paid $3.50 for it! Really? Yes.",
     ["Hello world.", "This is Mr. Smith.", "He paid $3.50 for it!", "Really?", "Yes."]),
    ("J. S. Bach wrote music. See e.g. the fugues. It was 1750.",
     ["J. S. Bach wrote music.", "See e.g. the fugues.", "It was 1750."]),
    ('"Stop!" he said. (Then he left.) The end...', ['"Stop!" he said.', "(Then he left.)", "The end..."]),
    ("First line one\nline two.\n\nSecond para. Ends here", ["First line one line two.", "Second para.", "Ends here"]),
    ("no capital after. so no split here. OK now.", ["no capital after. so no split here.", "OK now."]),
    ("Version 2.0 is out. Use it.", ["Version 2.0 is out.", "Use it."]),
    ("", []),
    (" \n\n \t", []),
])
def test_split_sentences(text, sentences):
    assert split_sentences(text) == sentences


def test_keep_newlines_keeps_the_inner_line_breaks():
    assert split_sentences("One\nsentence here. Two.", keep_newlines=True) == ["One\nsentence here.", "Two."]


def test_preprocess_split_sentences_writes_one_sequence_per_sentence_grouped_by_document(tmp_path):
    docs = ["The first document. It has two sentences.", "", "Only one here!",
            "Three? Yes. Three sentences."]
    vocab = train_wordpiece_tokenizer(docs * 30, 200, str(tmp_path / "tok"), min_frequency=1)["vocab_file"]
    data = tmp_path / "data.jsonl"
    data.write_text("\n".join(json.dumps({"text": d}) for d in docs) + "\n", encoding="utf-8")
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "preprocess_data.py"), "--input", str(data),
                           "--split-sentences", "--tokenizer-name", "BertWordPieceLowerCase", "--vocab-file", vocab,
                           "--append-eod", "--output-prefix", str(tmp_path / "out" / "bert"), "--no-progress"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    ds = get_indexed_dataset(str(tmp_path / "out" / "bert_text_sentence"))
    tok = BertTokenizer(vocab_file=vocab)
    assert list(ds.doc_idx) == [0, 2, 2, 3, 6]  # the empty line is an empty document
    expected = [s for d in docs for s in split_sentences(d)]
    assert len(ds) == len(expected) == 6
    for i, sentence in enumerate(expected):
        ids = list(ds[i])
        last_of_doc = i + 1 in ds.doc_idx[1:]
        assert ids == tok.encode(sentence, add_special_tokens=False) + ([tok.sep_token_id] if last_of_doc else [])


def test_preprocess_refuses_keep_newlines_without_split_sentences(tmp_path):
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "preprocess_data.py"), "--input", "x.jsonl",
                           "--keep-newlines", "--vocab-file", "v.json", "--merge-file", "m.txt",
                           "--output-prefix", str(tmp_path / "o")], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--keep-newlines applies to --split-sentences" in proc.stderr
