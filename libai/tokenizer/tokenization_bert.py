"""BERT's WordPiece tokenizer on the `tokenizers` library.

The pipeline is BERT's (and HuggingFace's `BertTokenizerFast`): the BertNormalizer (control
characters removed, whitespace unified, spaces around CJK characters, optional lower-casing and
accent stripping), the BertPreTokenizer (split on whitespace and punctuation), WordPiece with
`##` continuation pieces (a word longer than `max_input_chars_per_word`, or one that cannot be
split into known pieces, becomes `[UNK]`) and the WordPiece decoder. The vocabulary file is the
standard `vocab.txt` (one token per line, the id is the line number) or a `tokenizer.json`.

A sequence is laid out `[CLS] A [SEP]`, a pair `[CLS] A [SEP] B [SEP]`, with token type 0 up to
and including the first `[SEP]` and 1 after it.
"""
import os

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers

from .base import TokenizerBase, existing_file, load_tokenizer_json, read_text

__all__ = ["BertTokenizer", "read_wordpiece_vocab"]

VOCAB_FILES_NAMES = {"vocab_file": "vocab.txt", "tokenizer_file": "tokenizer.json"}
OWNER = "BertTokenizer"


def read_wordpiece_vocab(path):
    """BERT's vocab.txt as a dict token -> id (the line number, from 0). ValueError naming the
    file and the line for an empty file, an empty line or a token given twice."""
    path = existing_file(path, "vocab_file", OWNER)
    vocab = {}
    lines = read_text(path, "vocab_file", OWNER).split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the final newline
    for n, line in enumerate(lines, start=1):
        token = line.rstrip("\r")
        if not token.strip():
            raise ValueError(f"{OWNER}: vocab_file {path}, line {n}: an empty token (vocab.txt holds one token per "
                             "line, its id is the line number)")
        if token in vocab:
            raise ValueError(f"{OWNER}: vocab_file {path}, line {n}: {token!r} is already on line {vocab[token] + 1}")
        vocab[token] = n - 1
    if not vocab:
        raise ValueError(f"{OWNER}: vocab_file {path} is empty")
    return vocab


class BertTokenizer(TokenizerBase):
    """WordPiece tokenizer of BERT (HuggingFace's BertTokenizer / BertTokenizerFast API).

    Args:
        vocab_file: `vocab.txt`. tokenizer_file: a `tokenizer.json` (used instead when given).
        do_lower_case: lower-case the text (default True, as bert-base-uncased).
        strip_accents: remove accents; None (default) follows do_lower_case, as in BERT.
        tokenize_chinese_chars: put spaces around CJK characters (each becomes a word).
        unk_token, sep_token, pad_token, cls_token, mask_token: `[UNK]`, `[SEP]`, `[PAD]`,
            `[CLS]`, `[MASK]`; matched whole in raw text (never lower-cased or split).
        max_input_chars_per_word: longer words become `[UNK]` (BERT: 100).
        additional_special_tokens: more tokens matched whole in raw text.
        model_max_length: default `max_length` for truncation (512).
    """

    vocab_files_names = VOCAB_FILES_NAMES
    model_input_names = ["input_ids", "token_type_ids", "attention_mask"]

    def __init__(self, vocab_file=None, tokenizer_file=None, do_lower_case=True, strip_accents=None,
                 tokenize_chinese_chars=True, unk_token="[UNK]", sep_token="[SEP]", pad_token="[PAD]",
                 cls_token="[CLS]", mask_token="[MASK]", max_input_chars_per_word=100,
                 additional_special_tokens=None, model_max_length=512, padding_side="right",
                 truncation_side="right"):
        if tokenizer_file is not None:
            self._tokenizer = load_tokenizer_json(tokenizer_file, OWNER)
        elif vocab_file is not None:
            vocab = read_wordpiece_vocab(vocab_file)
            if unk_token not in vocab:
                raise ValueError(f"{OWNER}: vocab_file {os.path.abspath(vocab_file)} has no unk_token {unk_token!r}")
            self._tokenizer = Tokenizer(models.WordPiece(vocab, unk_token=unk_token,
                                                         max_input_chars_per_word=max_input_chars_per_word))
            self._tokenizer.normalizer = normalizers.BertNormalizer(
                clean_text=True, handle_chinese_chars=tokenize_chinese_chars, strip_accents=strip_accents,
                lowercase=do_lower_case)
            self._tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
            self._tokenizer.decoder = decoders.WordPiece(prefix="##")
        else:
            raise ValueError(f"{OWNER} needs vocab_file or tokenizer_file")
        self._tokenizer.post_processor = None  # the special tokens are laid out here
        self.vocab_file, self.tokenizer_file = vocab_file, tokenizer_file
        self.do_lower_case = bool(do_lower_case)
        self.strip_accents = strip_accents
        self.tokenize_chinese_chars = bool(tokenize_chinese_chars)
        self._init_common(dict(unk_token=unk_token, sep_token=sep_token, pad_token=pad_token, cls_token=cls_token,
                               mask_token=mask_token),
                          additional_special_tokens, model_max_length, padding_side, truncation_side)

    @property
    def eod(self):
        """The end-of-document id of Megatron's BERT tokenizer: [SEP]."""
        return self.sep_token_id

    def build_inputs_with_special_tokens(self, ids, pair_ids=None):
        """[CLS] ids [SEP] (pair_ids [SEP])."""
        out = [self.cls_token_id] + list(ids) + [self.sep_token_id]
        if pair_ids is not None:
            out += list(pair_ids) + [self.sep_token_id]
        return out

    def create_token_type_ids_from_sequences(self, ids, pair_ids=None):
        """0 for [CLS] ids [SEP], 1 for pair_ids [SEP]."""
        first = [0] * (len(ids) + 2)
        return first if pair_ids is None else first + [1] * (len(pair_ids) + 1)

    def get_special_tokens_mask(self, ids, pair_ids=None):
        """1 where `build_inputs_with_special_tokens` puts a special token, 0 elsewhere."""
        mask = [1] + [0] * len(ids) + [1]
        return mask if pair_ids is None else mask + [0] * len(pair_ids) + [1]

    def save_vocabulary(self, save_directory, filename_prefix=None):
        """vocab.txt (the WordPiece vocabulary in id order, added tokens included) into
        `save_directory`; returns its path in a tuple."""
        os.makedirs(save_directory, exist_ok=True)
        prefix = f"{filename_prefix}-" if filename_prefix else ""
        path = os.path.join(save_directory, prefix + VOCAB_FILES_NAMES["vocab_file"])
        by_id = sorted(self.get_vocab().items(), key=lambda kv: kv[1])
        if [i for _, i in by_id] != list(range(len(by_id))):
            raise ValueError(f"{OWNER}: the vocabulary ids are not contiguous: it cannot be written as vocab.txt")
        with open(path, "w", encoding="utf-8") as f:
            f.writelines(token + "\n" for token, _ in by_id)
        return (path,)

    def __repr__(self):
        return (f"BertTokenizer(vocab_size={self.vocab_size}, len={len(self)}, do_lower_case={self.do_lower_case}, "
                f"strip_accents={self.strip_accents})")
