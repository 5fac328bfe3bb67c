"""GPT2Tokenizer: parity with transformers' GPT2TokenizerFast on the same vocab/merges files,
round trips, special tokens, padding/truncation, padded vocab size, saving."""
import json
import os

import numpy as np
import pytest

from data_helpers import oracle
from libai.tokenizer import GPT2Tokenizer, vocab_size_with_padding

TEXTS = [
    "Hello world",
    " Hello world",
    "Hello  world   with    runs of spaces",
    "   leading spaces and trailing spaces   ",
    "line one\nline two\n\nline four\r\nwindows\r\n",
    "\ttabs\tand\t\ttabs\n\t\tindented",
    "Punctuation!?... (brackets) [x] {y} <z> \"quotes\" 'single' — dashes – and…",
    "Contractions: don't, I'm, we've, they're, she'll, it's, I'd",
    "Numbers 1234567890 3.14159 -42 1e-9 0x1F",
    "日本語のテキストと中文文本，한국어 텍스트",
    "Emoji 😀🎉👍🏽 family 👨‍👩‍👧‍👦 flags 🇫🇷",
    "Accents: café naïve résumé Ångström ß Σίσυφος",
    "<|endoftext|>",
    "before<|endoftext|>after",
    "doc one<|endoftext|> doc two <|endoftext|><|endoftext|>",
    "def f(x):\n    return x ** 2  # square\n",
    "",
    " ",
    "\n",
    "a" * 300,
    "Mixed\u00a0no-break\u2003em-space\u200bzero-width",
]


@pytest.fixture(params=["corpus", "tiny"])
def tok_dir(request, corpus, tiny_tokenizer_dir):
    return corpus["directory"] if request.param == "corpus" else str(tiny_tokenizer_dir)


def test_parity_with_transformers(tok_dir, tmp_path):
    ours = GPT2Tokenizer(os.path.join(tok_dir, "vocab.json"), os.path.join(tok_dir, "merges.txt"))
    ref = oracle(tok_dir, tmp_path)
    assert len(ours) == len(ref)
    assert ours.eos_token_id == ref.eos_token_id == ours.eod
    for text in TEXTS:
        ids = ours.encode(text)
        assert ids == ref.encode(text), repr(text)
        assert ours.tokenize(text) == ref.tokenize(text), repr(text)
        assert ours.decode(ids) == ref.decode(ids) == text, repr(text)
        assert ours.convert_ids_to_tokens(ids) == ref.convert_ids_to_tokens(ids)
        assert ours.convert_tokens_to_ids(ours.tokenize(text)) == ids
    assert ours.encode("before<|endoftext|>after").count(ours.eod) == 1
    assert ours.decode(ours.encode("x<|endoftext|>y"), skip_special_tokens=True) == \
        ref.decode(ref.encode("x<|endoftext|>y"), skip_special_tokens=True)
    batch = ours(TEXTS[:6], padding=True)
    ref_batch = ref(TEXTS[:6], padding=True) if ref.pad_token is not None else None
    assert [len(x) for x in batch["input_ids"]] == [max(len(ours.encode(t)) for t in TEXTS[:6])] * 6
    if ref_batch is not None:
        assert batch["attention_mask"] == ref_batch["attention_mask"]


def test_tokenizer_json_equivalent(tok_dir):
    a = GPT2Tokenizer(os.path.join(tok_dir, "vocab.json"), os.path.join(tok_dir, "merges.txt"))
    b = GPT2Tokenizer(tokenizer_file=os.path.join(tok_dir, "tokenizer.json"))
    c = GPT2Tokenizer.from_pretrained(tok_dir)
    for text in TEXTS:
        assert a.encode(text) == b.encode(text) == c.encode(text)
    assert len(a) == len(b) and a.vocab_size == b.vocab_size


def test_byte_fallback_roundtrip_random_unicode(corpus):
    tok = GPT2Tokenizer(corpus["vocab_file"], corpus["merges_file"])
    rng = np.random.default_rng(0)
    for _ in range(30):
        cps = rng.integers(0x20, 0x2FFF, size=40)
        text = "".join(chr(int(c)) for c in cps if not 0xD800 <= c <= 0xDFFF)
        assert tok.decode(tok.encode(text)) == text
    assert tok.decode(np.asarray(tok.encode("numpy ids"))) == "numpy ids"


def test_special_tokens_and_options(corpus):
    v, m = corpus["vocab_file"], corpus["merges_file"]
    tok = GPT2Tokenizer(v, m)
    eod = tok.eod
    assert tok.eos_token == tok.bos_token == tok.unk_token == "<|endoftext|>"
    assert tok.bos_token_id == tok.unk_token_id == eod and tok.pad_token_id is None
    assert tok.encode("hi", add_special_tokens=True) == tok.encode("hi", add_special_tokens=False)
    both = GPT2Tokenizer(v, m, add_bos_token=True, add_eos_token=True)
    assert both.encode("hi") == [eod] + tok.encode("hi") + [eod]
    assert both.encode("hi", add_special_tokens=False) == tok.encode("hi")
    lower = GPT2Tokenizer(v, m, do_lower_case=True)
    assert lower.encode("HeLLo WORLD") == tok.encode("hello world")
    # padding / truncation
    out = tok(["a b c d e f", "a"], padding=True, return_tensors="np")
    assert out["input_ids"].shape == out["attention_mask"].shape and out["input_ids"].shape[0] == 2
    assert out["attention_mask"][1].sum() == len(tok.encode("a"))
    assert (out["input_ids"][1][out["attention_mask"][1] == 0] == eod).all()
    tr = tok(["one two three four five six seven"], truncation=True, max_length=3)
    assert tr["input_ids"][0] == tok.encode("one two three four five six seven")[:3]
    ml = tok("x", padding="max_length", max_length=5)
    assert len(ml["input_ids"]) == 5 and ml["attention_mask"] == [1, 0, 0, 0, 0]
    n = tok.add_special_tokens({"pad_token": "<pad>"})
    assert n == 1 and tok.pad_token_id == len(tok) - 1 and len(tok) == tok.vocab_size + 1
    assert tok.encode("a<pad>b").count(tok.pad_token_id) == 1
    flow_out = tok(["a b", "c"], padding=True, return_tensors="flow")
    assert tuple(flow_out["input_ids"].shape) == out["input_ids"][:, :2].shape or flow_out["input_ids"].shape[0] == 2


def test_padded_vocab_size(corpus):
    assert vocab_size_with_padding(50257, 128, 1) == 50304
    assert vocab_size_with_padding(50257, 128, 2) == 50432
    assert vocab_size_with_padding(50304, 128, 1) == 50304
    assert vocab_size_with_padding(1000, 1, 1) == 1000
    tok = GPT2Tokenizer(corpus["vocab_file"], corpus["merges_file"])
    for div, tp in ((128, 1), (128, 4), (64, 2), (1, 1)):
        p = tok.padded_vocab_size(div, tp)
        assert p % (div * tp) == 0 and len(tok) <= p < len(tok) + div * tp


def test_save_vocabulary_roundtrip(corpus, tmp_path):
    tok = GPT2Tokenizer(corpus["vocab_file"], corpus["merges_file"])
    vp, mp = tok.save_vocabulary(str(tmp_path), filename_prefix="x")
    assert os.path.basename(vp) == "x-vocab.json" and os.path.basename(mp) == "x-merges.txt"
    with open(vp, encoding="utf-8") as f, open(corpus["vocab_file"], encoding="utf-8") as g:
        assert json.load(f) == json.load(g)
    again = GPT2Tokenizer(vp, mp)
    for text in TEXTS:
        assert again.encode(text) == tok.encode(text)
    paths = tok.save_pretrained(str(tmp_path / "pre"))
    assert all(os.path.isfile(p) for p in paths)
    assert GPT2Tokenizer.from_pretrained(str(tmp_path / "pre")).encode(TEXTS[9]) == tok.encode(TEXTS[9])


def test_train_tokenizer_outputs(tiny_tokenizer_dir):
    for name in ("vocab.json", "merges.txt", "tokenizer.json"):
        assert (tiny_tokenizer_dir / name).is_file()
    vocab = json.loads((tiny_tokenizer_dir / "vocab.json").read_text(encoding="utf-8"))
    assert "<|endoftext|>" in vocab and len(vocab) <= 400
    assert (tiny_tokenizer_dir / "merges.txt").read_text(encoding="utf-8").startswith("#version")
    tok = GPT2Tokenizer.from_pretrained(str(tiny_tokenizer_dir))
    assert len(tok) == len(vocab)
    # all 256 byte symbols are in the alphabet: nothing is unknown
    assert tok.decode(tok.encode("zzz ⟪unseen⟫ ☃")) == "zzz ⟪unseen⟫ ☃"


def test_errors():
    with pytest.raises(ValueError):
        GPT2Tokenizer()
