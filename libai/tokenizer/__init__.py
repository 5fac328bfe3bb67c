"""Tokenizers: GPT-2's byte-level BPE on the `tokenizers` library, and BPE training."""
from .bpe_training import iter_texts, train_bpe_tokenizer
from .tokenization_gpt2 import GPT2Tokenizer, vocab_size_with_padding

__all__ = ["GPT2Tokenizer", "vocab_size_with_padding", "train_bpe_tokenizer", "iter_texts", "build_tokenizer"]


def build_tokenizer(cfg):
    """instantiate(cfg.tokenizer) (LiBai): `cfg` is the tokenization namespace holding
    `tokenizer` (a LazyCall) and optionally `make_vocab_size_divisible_by`; returns the tokenizer."""
    from libai.config import instantiate, try_get_key

    tokenizer = instantiate(cfg.tokenizer)
    divisible = try_get_key(cfg, "make_vocab_size_divisible_by", default=None)
    if divisible is not None:
        tokenizer.padded_vocab = tokenizer.padded_vocab_size(divisible)
    return tokenizer
