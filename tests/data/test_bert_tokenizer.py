"""libai.tokenizer.BertTokenizer against transformers' BertTokenizerFast on the same vocab.txt
(a WordPiece vocabulary learned here from the embedded corpus by tools/train_tokenizer.py), and
the WordPiece training itself."""
import os
import re
import subprocess
import sys

import pytest

from libai.tokenizer import BertTokenizer, train_wordpiece_tokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

TEXTS = [
    "Hello, world! The quick brown fox jumps over the lazy dog.",
    "Héllo Wörld: naïve café façade, résumé; ÀÉÎÕÜ.",  # accents (stripped when lower-casing)
    "unbelievably antidisestablishmentarianism supercalifragilisticexpialidocious",  # split into pieces
    "def f(x): return x**2 + 3.14159  # code-ish punctuation (){}[]<>",
    "中文字符和日本語のテキスト 한국어",  # CJK: one word per character
    "tabs\tand\nnewlines\r\n and  double  spaces\u00a0nbsp, zero\u200bwidth",
    "The [MASK] is here and [CLS] there [SEP] with [UNK] specials.",
    "emoji 🙂🚀 and symbols ∑∫√ ≠ ≤ — “quotes” ‘single’ …",
    "",
    "a" * 120 + " short",  # a word longer than max_input_chars_per_word becomes [UNK]
]
PAIRS = [(TEXTS[0], TEXTS[1]), (TEXTS[2], TEXTS[6]), (TEXTS[4], "a b"), (TEXTS[3], TEXTS[5])]


@pytest.fixture(scope="module")
def vocab_file(tmp_path_factory):
    from libai.data.corpus import default_corpus_documents

    out = tmp_path_factory.mktemp("wordpiece")
    docs = list(default_corpus_documents())[:300] + TEXTS[:3]
    return train_wordpiece_tokenizer(docs, 2000, str(out), min_frequency=2)["vocab_file"]


def pair_of_tokenizers(vocab_file, **kwargs):
    from transformers import BertTokenizerFast

    return BertTokenizer(vocab_file=vocab_file, **kwargs), BertTokenizerFast(vocab=vocab_file, **kwargs)


@pytest.mark.parametrize("options", [{}, {"do_lower_case": False}, {"do_lower_case": True, "strip_accents": False},
                                     {"do_lower_case": False, "strip_accents": True},
                                     {"tokenize_chinese_chars": False}])
def test_single_texts_match_bert_tokenizer_fast(vocab_file, options):
    ours, theirs = pair_of_tokenizers(vocab_file, **options)
    for text in TEXTS:
        assert ours.tokenize(text) == theirs.tokenize(text), text
        assert ours.encode(text) == theirs.encode(text), text
        got, want = ours(text), theirs(text)
        assert got == {k: want[k] for k in ("input_ids", "token_type_ids", "attention_mask")}, text
        assert ours.decode(ours.encode(text), skip_special_tokens=True) == \
            theirs.decode(theirs.encode(text), skip_special_tokens=True, clean_up_tokenization_spaces=False)


def test_pairs_truncation_and_padding_match(vocab_file):
    ours, theirs = pair_of_tokenizers(vocab_file)
    a, b = [p[0] for p in PAIRS], [p[1] for p in PAIRS]
    for kwargs in ({}, {"truncation": True, "max_length": 16}, {"truncation": "only_second", "max_length": 40},
                   {"truncation": "only_first", "max_length": 32}, {"padding": True},
                   {"padding": "max_length", "max_length": 40, "truncation": True}):
        got, want = ours(a, b, **kwargs), theirs(a, b, **kwargs)
        assert got == {k: want[k] for k in got}, kwargs
    assert ours.encode(*PAIRS[0]) == theirs.encode(*PAIRS[0])
    got = ours(TEXTS[:4], padding=True, truncation=True, max_length=12, return_tensors="np")
    want = theirs(TEXTS[:4], padding=True, truncation=True, max_length=12, return_tensors="np")
    assert all((got[k] == want[k]).all() for k in want)


def test_special_token_layout_and_ids(vocab_file):
    tok = BertTokenizer(vocab_file=vocab_file)
    assert [tok.pad_token_id, tok.unk_token_id, tok.cls_token_id, tok.sep_token_id, tok.mask_token_id] == \
        [0, 1, 2, 3, 4]  # the trainer writes the special tokens first
    assert tok.build_inputs_with_special_tokens([7, 8], [9]) == [2, 7, 8, 3, 9, 3]
    assert tok.create_token_type_ids_from_sequences([7, 8], [9]) == [0, 0, 0, 0, 1, 1]
    assert tok.get_special_tokens_mask([7, 8], [9]) == [1, 0, 0, 1, 0, 1]
    assert tok.num_special_tokens_to_add(pair=True) == 3 and len(tok) == tok.vocab_size
    assert tok.padded_vocab_size(128, 2) % 256 == 0 and tok.padded_vocab_size(128, 2) >= len(tok)


def test_vocab_and_tokenizer_json_round_trip(vocab_file, tmp_path):
    tok = BertTokenizer(vocab_file=vocab_file)
    vocab_path, json_path = tok.save_pretrained(str(tmp_path))
    assert open(vocab_path, encoding="utf-8").read() == open(vocab_file, encoding="utf-8").read()
    for other in (BertTokenizer.from_pretrained(str(tmp_path)), BertTokenizer(tokenizer_file=json_path)):
        assert all(other.encode(t, s) == tok.encode(t, s) for t, s in PAIRS)


@pytest.mark.parametrize("content, message", [
    ("[PAD]\n[UNK]\n\nhello\n", "line 3: an empty token"),
    ("[PAD]\n[UNK]\nhello\nhello\n", "line 4: 'hello' is already on line 3"),
    ("", "is empty"),
    ("[PAD]\nhello\n", re.escape("has no unk_token '[UNK]'")),
])
def test_a_malformed_vocab_is_named(tmp_path, content, message):
    path = tmp_path / "vocab.txt"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(ValueError, match=message) as e:
        BertTokenizer(vocab_file=str(path))
    assert str(path) in str(e.value)


def test_train_tokenizer_tool_writes_a_wordpiece_vocab(tmp_path):
    text = tmp_path / "corpus.txt"
    text.write_text("\n".join(TEXTS * 20), encoding="utf-8")
    out = tmp_path / "tok"
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "train_tokenizer.py"), "--type", "wordpiece",
                           "--input", str(text), "--vocab-size", "300", "--output-dir", str(out), "--quiet"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    tok = BertTokenizer(vocab_file=str(out / "vocab.txt"))
    assert tok.tokenize("The quick brown fox")[0] == "the"
    assert tok.decode(tok.encode("The quick brown fox"), skip_special_tokens=True) == "the quick brown fox"
    assert open(out / "vocab.txt", encoding="utf-8").read().split("\n")[:5] == \
        ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
