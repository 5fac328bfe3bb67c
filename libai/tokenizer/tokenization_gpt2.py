"""GPT-2's byte-level BPE tokenizer on the `tokenizers` library.

The pipeline is GPT-2's: no normalizer (unless `do_lower_case`), the ByteLevel pre-tokenizer
(GPT-2's split regex, bytes mapped to printable unicode, no prefix space), a BPE model without
subword prefixes/suffixes and the ByteLevel decoder. Vocabulary files are the standard
`vocab.json` + `merges.txt` (as written by OpenAI/HuggingFace) or a single `tokenizer.json`.
`<|endoftext|>` is GPT-2's only special token: it is the unk, bos and eos token and the
end-of-document (`eod`) separator, and it is matched whole in raw text.
"""
import json
import os

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers

from .base import TokenizerBase, existing_file, load_tokenizer_json, read_text, vocab_size_with_padding

__all__ = ["GPT2Tokenizer", "read_merges_file", "read_vocab_file", "vocab_size_with_padding"]

VOCAB_FILES_NAMES = {"vocab_file": "vocab.json", "merges_file": "merges.txt", "tokenizer_file": "tokenizer.json"}
ENDOFTEXT = "<|endoftext|>"
OWNER = "GPT2Tokenizer"


def _existing_file(path, key):
    return existing_file(path, key, OWNER)


def _read_text(path, key):
    return read_text(path, key, OWNER)


def read_vocab_file(path):
    """GPT-2's vocab.json as a dict token -> id; ValueError naming the file and the problem
    (not JSON, not an object, an id that is not a non-negative integer)."""
    path = _existing_file(path, "vocab_file")
    try:
        vocab = json.loads(_read_text(path, "vocab_file"))
    except json.JSONDecodeError as e:
        raise ValueError(f"GPT2Tokenizer: vocab_file {path} is not valid JSON ({e.msg}: line {e.lineno} column "
                         f"{e.colno}); expected a JSON object mapping each token to its integer id, as GPT-2's "
                         f"vocab.json") from None
    if not isinstance(vocab, dict):
        kind = {list: "list", str: "string"}.get(type(vocab), type(vocab).__name__)
        msg = (f"GPT2Tokenizer: vocab_file {path}: expected a JSON object mapping each token to its integer id, "
               f"got a {kind}")
        raise ValueError(msg)  # noqa: TRY004 (the file's content is wrong, not an argument's type)
    for token, i in vocab.items():
        if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < 2 ** 32:
            raise ValueError(f"GPT2Tokenizer: vocab_file {path}: token {token!r} has the id {i!r}; expected a "
                             f"non-negative integer")
    return vocab


def read_merges_file(path, vocab, vocab_path=None):
    """GPT-2's merges.txt as a list of (left, right) pairs: lines "left right" in rank order,
    `#version` lines and blank lines skipped. ValueError naming the file and the line when a line
    is not two tokens, or a token or the merged token is not in `vocab`."""
    path = _existing_file(path, "merges_file")
    where = f" (vocab_file {vocab_path})" if vocab_path else ""
    merges = []
    for n, line in enumerate(_read_text(path, "merges_file").split("\n"), start=1):
        line = line.rstrip("\r")
        if not line or line.startswith("#version"):
            continue
        parts = line.split(" ")
        if len(parts) != 2 or not all(parts):
            raise ValueError(f"GPT2Tokenizer: merges_file {path}, line {n}: expected two tokens separated by a "
                             f"space, got {line!r}")
        for token, what in ((parts[0], ""), (parts[1], ""), (parts[0] + parts[1], "the merged token ")):
            if token not in vocab:
                raise ValueError(f"GPT2Tokenizer: merges_file {path}, line {n}: {what}{token!r} is not in the "
                                 f"vocabulary{where}")
        merges.append((parts[0], parts[1]))
    return merges


class GPT2Tokenizer(TokenizerBase):
    """Byte-level BPE tokenizer of GPT-2.

    Args:
        vocab_file, merges_file: `vocab.json` and `merges.txt`.
        tokenizer_file: a `tokenizer.json` (used instead of vocab/merges when given).
        errors: kept for API compatibility (the ByteLevel decoder replaces invalid UTF-8).
        unk_token, bos_token, eos_token: default `<|endoftext|>` (as GPT-2).
        pad_token: default None (batch padding then uses the eos id with attention_mask 0).
        add_bos_token / add_eos_token: `encode(..., add_special_tokens=True)` prepends bos /
            appends eos.
        do_lower_case: lowercase the text before tokenization (a Lowercase normalizer).
        add_prefix_space: treat the first word like the others (GPT-2 default False).
        additional_special_tokens: more tokens matched whole in raw text.
        model_max_length: default `max_length` for truncation.
    """

    vocab_files_names = VOCAB_FILES_NAMES

    def __init__(self, vocab_file=None, merges_file=None, tokenizer_file=None, errors="replace",
                 unk_token=ENDOFTEXT, bos_token=ENDOFTEXT, eos_token=ENDOFTEXT, pad_token=None,
                 add_bos_token=False, add_eos_token=False, do_lower_case=False, add_prefix_space=False,
                 additional_special_tokens=None, model_max_length=1024, padding_side="right",
                 truncation_side="right", **kwargs):
        if tokenizer_file is not None:
            self._tokenizer = load_tokenizer_json(tokenizer_file, OWNER)
        elif vocab_file is not None and merges_file is not None:
            # read here rather than by BPE.from_file, whose errors name neither the file nor the line
            vocab_path = _existing_file(vocab_file, "vocab_file")
            vocab = read_vocab_file(vocab_path)
            merges = read_merges_file(merges_file, vocab, vocab_path)
            bpe = models.BPE(vocab, merges, dropout=None, continuing_subword_prefix="", end_of_word_suffix="",
                             fuse_unk=False)
            self._tokenizer = Tokenizer(bpe)
            self._tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=add_prefix_space)
            self._tokenizer.decoder = decoders.ByteLevel()
        else:
            raise ValueError("GPT2Tokenizer needs vocab_file and merges_file, or tokenizer_file")
        # ids only: offsets trimming and template post-processing are not used
        self._tokenizer.post_processor = None
        if do_lower_case:
            self._tokenizer.normalizer = normalizers.Lowercase()
        self.vocab_file, self.merges_file, self.tokenizer_file = vocab_file, merges_file, tokenizer_file
        self.errors = errors
        self.do_lower_case = bool(do_lower_case)
        self.add_prefix_space = bool(add_prefix_space)
        self.add_bos_token = bool(add_bos_token)
        self.add_eos_token = bool(add_eos_token)
        self._init_common(dict(unk_token=unk_token, bos_token=bos_token, eos_token=eos_token, pad_token=pad_token),
                          additional_special_tokens, model_max_length, padding_side, truncation_side)

    @property
    def eod(self):
        """End-of-document id (`<|endoftext|>`), appended between documents."""
        return self.eos_token_id

    eod_token_id = eod

    @property
    def eod_token(self):
        return self.eos_token

    def build_inputs_with_special_tokens(self, ids, pair_ids=None):
        """bos (with add_bos_token) + ids (+ pair_ids) + eos (with add_eos_token)."""
        out = list(ids) + (list(pair_ids) if pair_ids is not None else [])
        if self.add_bos_token and self.bos_token_id is not None:
            out = [self.bos_token_id] + out
        if self.add_eos_token and self.eos_token_id is not None:
            out = out + [self.eos_token_id]
        return out

    def _pad_id(self):
        """pad_token_id, or eos_token_id when there is no pad token (GPT-2 has none)."""
        return self.pad_token_id if self.pad_token_id is not None else self.eos_token_id

    def save_vocabulary(self, save_directory, filename_prefix=None):
        """Write vocab.json and merges.txt (BPE model only, no added tokens) into
        `save_directory`; returns their paths."""
        os.makedirs(save_directory, exist_ok=True)
        prefix = f"{filename_prefix}-" if filename_prefix else ""
        vocab_path = os.path.join(save_directory, prefix + VOCAB_FILES_NAMES["vocab_file"])
        merges_path = os.path.join(save_directory, prefix + VOCAB_FILES_NAMES["merges_file"])
        model = json.loads(self._tokenizer.to_str())["model"]
        vocab = model["vocab"]
        with open(vocab_path, "w", encoding="utf-8") as f:
            f.write(json.dumps(vocab, indent=2, sort_keys=True, ensure_ascii=False) + "\n")
        with open(merges_path, "w", encoding="utf-8") as f:
            f.write("#version: 0.2\n")
            for m in model["merges"]:
                f.write((m if isinstance(m, str) else " ".join(m)) + "\n")
        return vocab_path, merges_path

    def __repr__(self):
        return (f"GPT2Tokenizer(vocab_size={self.vocab_size}, len={len(self)}, eos={self.eos_token!r}, "
                f"add_bos_token={self.add_bos_token}, add_eos_token={self.add_eos_token}, "
                f"do_lower_case={self.do_lower_case})")
