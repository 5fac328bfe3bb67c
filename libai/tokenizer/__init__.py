"""Tokenizers on the `tokenizers` library: GPT-2's byte-level BPE, BERT's WordPiece, and the
training of both vocabularies."""
from libai.utils.libai_names import missing_names_getattr

from .base import vocab_size_with_padding
from .bpe_training import iter_texts, train_bpe_tokenizer, train_wordpiece_tokenizer
from .tokenization_bert import BertTokenizer
from .tokenization_gpt2 import GPT2Tokenizer

__all__ = ["GPT2Tokenizer", "BertTokenizer", "vocab_size_with_padding", "train_bpe_tokenizer",
           "train_wordpiece_tokenizer", "iter_texts", "build_tokenizer", "get_tokenizer", "set_tokenizer"]

_TOKENIZER = None


def get_tokenizer():
    """The run's tokenizer (LiBai's global): the one the trainer built from cfg.tokenization, or
    None before that. Datasets configured without a tokenizer (BertDataset) use it, so the data and
    the model's vocabulary come from one object."""
    return _TOKENIZER


def set_tokenizer(tokenizer):
    global _TOKENIZER
    _TOKENIZER = tokenizer
    return tokenizer


def build_tokenizer(cfg):
    """instantiate(cfg.tokenizer) (LiBai): `cfg` is the tokenization namespace holding
    `tokenizer` (a LazyCall) and optionally `make_vocab_size_divisible_by`; returns the tokenizer."""
    from libai.config import instantiate, try_get_key

    tokenizer = instantiate(cfg.tokenizer)
    divisible = try_get_key(cfg, "make_vocab_size_divisible_by", default=None)
    if divisible is not None:
        tokenizer.padded_vocab = tokenizer.padded_vocab_size(divisible)
    return tokenizer


__getattr__ = missing_names_getattr(__name__, {
    "RobertaTokenizer": "this project has GPT2Tokenizer and BertTokenizer",
    "T5Tokenizer": "this project has GPT2Tokenizer and BertTokenizer",
})

