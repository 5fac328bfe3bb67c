"""Training vocabularies: GPT-2's byte-level BPE and BERT's WordPiece (used by
tools/train_tokenizer.py and the default corpus)."""
import json
import os
import warnings

__all__ = ["iter_texts", "train_bpe_tokenizer", "train_wordpiece_tokenizer", "BERT_SPECIAL_TOKENS",
           "VocabSizeWarning"]

BERT_SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


class VocabSizeWarning(UserWarning):
    """The trained vocabulary has fewer tokens than the vocab_size asked for."""


def _warn_if_short(kind, requested, actual, min_frequency):
    """Warn (VocabSizeWarning) when training stopped below the requested size: the trainers
    (tokenizers') stop merging once no pair of pieces occurs `min_frequency` times or more."""
    if actual >= requested:
        return
    warnings.warn(
        f"{kind}: requested vocab size {requested} (--vocab-size), but the trained vocabulary has only {actual} "
        f"tokens ({requested - actual} fewer): training stops when no pair of adjacent pieces left occurs at least "
        f"min_frequency={min_frequency} times (--min-frequency), which a small corpus reaches early. For more "
        f"tokens train on more text or lower min_frequency; the {actual}-token vocabulary is written and works "
        f"as it is.",
        VocabSizeWarning, stacklevel=3)


def iter_texts(files, json_key="text"):
    """Yield the documents of `files`: a `.jsonl`/`.json` file gives the `json_key` field of each
    line (lines without it are skipped); any other file is read whole as one text."""
    if isinstance(files, (str, os.PathLike)):
        files = [files]
    for path in files:
        path = str(path)
        if path.endswith((".jsonl", ".json")):
            with open(path, encoding="utf-8") as f:
                for line in f:
                    line = line.strip()
                    if not line:
                        continue
                    value = json.loads(line).get(json_key)
                    if isinstance(value, str):
                        yield value
        else:
            with open(path, encoding="utf-8") as f:
                yield f.read()


def train_bpe_tokenizer(texts, vocab_size, output_dir, min_frequency=2, special_tokens=("<|endoftext|>",),
                        show_progress=False):
    """Train a byte-level BPE (tokenizers' ByteLevelBPETokenizer: GPT-2's pre-tokenizer, the 256
    byte symbols as initial alphabet) on the strings of `texts` and write `vocab.json`,
    `merges.txt` and a GPT-2 `tokenizer.json` (the same model, loadable by GPT2Tokenizer) into
    `output_dir`. Returns {"vocab_file", "merges_file", "tokenizer_file"}."""
    from tokenizers import ByteLevelBPETokenizer

    from .tokenization_gpt2 import GPT2Tokenizer

    os.makedirs(output_dir, exist_ok=True)
    bpe = ByteLevelBPETokenizer(add_prefix_space=False)
    bpe.train_from_iterator(texts, vocab_size=int(vocab_size), min_frequency=int(min_frequency),
                            special_tokens=list(special_tokens), show_progress=show_progress)
    _warn_if_short("byte-level BPE", int(vocab_size), bpe.get_vocab_size(), int(min_frequency))
    vocab_file, merges_file = bpe.save_model(str(output_dir))
    tok = GPT2Tokenizer(vocab_file=vocab_file, merges_file=merges_file)
    tokenizer_file = os.path.join(str(output_dir), "tokenizer.json")
    tok.backend_tokenizer.save(tokenizer_file)
    return {"vocab_file": vocab_file, "merges_file": merges_file, "tokenizer_file": tokenizer_file}


def train_wordpiece_tokenizer(texts, vocab_size, output_dir, min_frequency=2, lowercase=True,
                              special_tokens=BERT_SPECIAL_TOKENS, show_progress=False):
    """Train a BERT WordPiece vocabulary (tokenizers' BertWordPieceTokenizer: BERT's normalizer,
    lower-cased by default, and pre-tokenizer; `##` continuation pieces) on the strings of
    `texts`; write `vocab.txt` (the special tokens first, `[PAD]` = 0) and the matching
    `tokenizer.json` (loadable by BertTokenizer) into `output_dir`. Returns {"vocab_file",
    "tokenizer_file"}."""
    from tokenizers import BertWordPieceTokenizer

    from .tokenization_bert import BertTokenizer

    os.makedirs(output_dir, exist_ok=True)
    wordpiece = BertWordPieceTokenizer(lowercase=lowercase)
    wordpiece.train_from_iterator(texts, vocab_size=int(vocab_size), min_frequency=int(min_frequency),
                                  special_tokens=list(special_tokens), show_progress=show_progress)
    _warn_if_short("WordPiece", int(vocab_size), wordpiece.get_vocab_size(), int(min_frequency))
    (vocab_file,) = wordpiece.save_model(str(output_dir))
    tok = BertTokenizer(vocab_file=vocab_file, do_lower_case=lowercase)
    tokenizer_file = os.path.join(str(output_dir), "tokenizer.json")
    tok.backend_tokenizer.save(tokenizer_file)
    return {"vocab_file": vocab_file, "tokenizer_file": tokenizer_file}
