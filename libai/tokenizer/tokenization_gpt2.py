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

import numpy as np
from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers

__all__ = ["GPT2Tokenizer", "read_merges_file", "read_vocab_file", "vocab_size_with_padding"]

VOCAB_FILES_NAMES = {"vocab_file": "vocab.json", "merges_file": "merges.txt", "tokenizer_file": "tokenizer.json"}
ENDOFTEXT = "<|endoftext|>"


def vocab_size_with_padding(vocab_size, make_vocab_size_divisible_by=128, tensor_parallel_size=1):
    """Megatron/LiBai rule: round `vocab_size` up to a multiple of
    `make_vocab_size_divisible_by * tensor_parallel_size` (so the embedding splits evenly over the
    tensor-parallel ranks and the matmul shapes stay aligned)."""
    multiple = int(make_vocab_size_divisible_by or 1) * int(tensor_parallel_size or 1)
    if multiple <= 0:
        raise ValueError(f"make_vocab_size_divisible_by * tensor_parallel_size must be positive, got {multiple}")
    return -(-int(vocab_size) // multiple) * multiple


def _token_str(tok):
    if tok is None:
        return None
    return tok.content if isinstance(tok, AddedToken) else str(tok)


def _to_id_list(ids):
    """ids as a flat list of python ints (accepts int, list, numpy array, engine/torch tensors)."""
    if hasattr(ids, "numpy") and not isinstance(ids, np.ndarray):
        ids = ids.numpy()
    if isinstance(ids, np.ndarray):
        return [int(i) for i in ids.reshape(-1)]
    if isinstance(ids, (int, np.integer)):
        return [int(ids)]
    return [int(i) for i in ids]


def _existing_file(path, key):
    """The full path of `path` (argument `key`), or FileNotFoundError naming both."""
    full = os.path.abspath(os.path.expanduser(str(path)))
    if not os.path.isfile(full):
        raise FileNotFoundError(f"GPT2Tokenizer: {key} {full} does not exist")
    return full


def _read_text(path, key):
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except UnicodeDecodeError as e:
        raise ValueError(f"GPT2Tokenizer: {key} {path} is not UTF-8 text ({e})") from None


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


class GPT2Tokenizer:
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
    model_input_names = ["input_ids", "attention_mask"]

    def __init__(self, vocab_file=None, merges_file=None, tokenizer_file=None, errors="replace",
                 unk_token=ENDOFTEXT, bos_token=ENDOFTEXT, eos_token=ENDOFTEXT, pad_token=None,
                 add_bos_token=False, add_eos_token=False, do_lower_case=False, add_prefix_space=False,
                 additional_special_tokens=None, model_max_length=1024, padding_side="right",
                 truncation_side="right", **kwargs):
        if tokenizer_file is not None:
            path = _existing_file(tokenizer_file, "tokenizer_file")
            try:
                self._tokenizer = Tokenizer.from_file(path)
            except Exception as e:  # noqa: BLE001 (tokenizers raises a bare Exception, without the path)
                raise ValueError(f"GPT2Tokenizer: tokenizer_file {path} is not a valid tokenizer.json ({e})") from None
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
        self.model_max_length = model_max_length
        if padding_side not in ("right", "left") or truncation_side not in ("right", "left"):
            raise ValueError("padding_side and truncation_side must be 'right' or 'left'")
        self.padding_side, self.truncation_side = padding_side, truncation_side
        self.unk_token = _token_str(unk_token)
        self.bos_token = _token_str(bos_token)
        self.eos_token = _token_str(eos_token)
        self.pad_token = _token_str(pad_token)
        self.additional_special_tokens = [_token_str(t) for t in (additional_special_tokens or [])]
        specials = []
        for t in [self.unk_token, self.bos_token, self.eos_token, self.pad_token] + self.additional_special_tokens:
            if t is not None and t not in specials:
                specials.append(t)
        self._register_special_tokens(specials)

    # ------------------------------------------------------------------ construction helpers
    @classmethod
    def from_pretrained(cls, directory, **kwargs):
        """Load from a directory holding tokenizer.json, or vocab.json + merges.txt."""
        directory = str(directory)
        tok_json = os.path.join(directory, VOCAB_FILES_NAMES["tokenizer_file"])
        vocab = os.path.join(directory, VOCAB_FILES_NAMES["vocab_file"])
        merges = os.path.join(directory, VOCAB_FILES_NAMES["merges_file"])
        if os.path.isfile(vocab) and os.path.isfile(merges):
            return cls(vocab_file=vocab, merges_file=merges, **kwargs)
        if os.path.isfile(tok_json):
            return cls(tokenizer_file=tok_json, **kwargs)
        raise FileNotFoundError(f"{directory} has neither vocab.json + merges.txt nor tokenizer.json")

    def _register_special_tokens(self, tokens):
        added = [AddedToken(t, single_word=False, lstrip=False, rstrip=False, normalized=False, special=True)
                 for t in tokens]
        if added:
            self._tokenizer.add_special_tokens(added)

    def add_special_tokens(self, special_tokens_dict):
        """Set/add special tokens: keys unk_token, bos_token, eos_token, pad_token,
        additional_special_tokens. Returns the number of tokens new to the vocabulary."""
        before = len(self)
        new = []
        for key, value in special_tokens_dict.items():
            if key == "additional_special_tokens":
                vals = [_token_str(v) for v in value]
                self.additional_special_tokens.extend(v for v in vals if v not in self.additional_special_tokens)
                new.extend(vals)
            elif key in ("unk_token", "bos_token", "eos_token", "pad_token"):
                setattr(self, key, _token_str(value))
                new.append(_token_str(value))
            else:
                raise KeyError(f"unknown special token key {key!r}")
        self._register_special_tokens(new)
        return len(self) - before

    def add_tokens(self, tokens):
        """Add ordinary (non-special) tokens; returns how many were new."""
        if isinstance(tokens, str):
            tokens = [tokens]
        return self._tokenizer.add_tokens([AddedToken(t, normalized=False) if isinstance(t, str) else t
                                           for t in tokens])

    @property
    def backend_tokenizer(self):
        """The underlying `tokenizers.Tokenizer`."""
        return self._tokenizer

    # ------------------------------------------------------------------ vocabulary
    @property
    def vocab_size(self):
        """Size of the base BPE vocabulary (without tokens added after it)."""
        return self._tokenizer.get_vocab_size(with_added_tokens=False)

    def __len__(self):
        """Full vocabulary size, added tokens included."""
        return self._tokenizer.get_vocab_size(with_added_tokens=True)

    def get_vocab(self):
        return self._tokenizer.get_vocab(with_added_tokens=True)

    @property
    def vocab(self):
        return self.get_vocab()

    @property
    def inv_vocab(self):
        return {v: k for k, v in self.get_vocab().items()}

    def padded_vocab_size(self, make_vocab_size_divisible_by=128, tensor_parallel_size=1):
        """len(self) rounded up to a multiple of make_vocab_size_divisible_by * tensor_parallel_size."""
        return vocab_size_with_padding(len(self), make_vocab_size_divisible_by, tensor_parallel_size)

    def _tok_id(self, token):
        return None if token is None else self._tokenizer.token_to_id(token)

    @property
    def unk_token_id(self):
        return self._tok_id(self.unk_token)

    @property
    def bos_token_id(self):
        return self._tok_id(self.bos_token)

    @property
    def eos_token_id(self):
        return self._tok_id(self.eos_token)

    @property
    def pad_token_id(self):
        return self._tok_id(self.pad_token)

    @property
    def eod(self):
        """End-of-document id (`<|endoftext|>`), appended between documents."""
        return self.eos_token_id

    eod_token_id = eod

    @property
    def eod_token(self):
        return self.eos_token

    @property
    def all_special_tokens(self):
        out = []
        for t in [self.bos_token, self.eos_token, self.unk_token, self.pad_token] + self.additional_special_tokens:
            if t is not None and t not in out:
                out.append(t)
        return out

    @property
    def all_special_ids(self):
        return [self._tok_id(t) for t in self.all_special_tokens]

    # ------------------------------------------------------------------ tokens <-> ids
    def tokenize(self, text):
        """The BPE tokens (byte-level unicode strings) of `text`, no special tokens added."""
        return self._tokenizer.encode(text, add_special_tokens=False).tokens

    def convert_tokens_to_ids(self, tokens):
        if isinstance(tokens, str):
            i = self._tokenizer.token_to_id(tokens)
            return self.unk_token_id if i is None else i
        return [self.convert_tokens_to_ids(t) for t in tokens]

    def convert_ids_to_tokens(self, ids, skip_special_tokens=False):
        if isinstance(ids, (int, np.integer)):
            return self._tokenizer.id_to_token(int(ids))
        special = set(self.all_special_ids) if skip_special_tokens else set()
        return [self._tokenizer.id_to_token(i) for i in _to_id_list(ids) if i not in special]

    def convert_tokens_to_string(self, tokens):
        return self._tokenizer.decoder.decode(list(tokens))

    # ------------------------------------------------------------------ encode / decode
    def _add_special(self, ids):
        if self.add_bos_token and self.bos_token_id is not None:
            ids = [self.bos_token_id] + ids
        if self.add_eos_token and self.eos_token_id is not None:
            ids = ids + [self.eos_token_id]
        return ids

    def _truncate(self, ids, max_length):
        if max_length is None or len(ids) <= max_length:
            return ids
        return ids[:max_length] if self.truncation_side == "right" else ids[len(ids) - max_length:]

    def encode(self, text, add_special_tokens=True, truncation=False, max_length=None):
        """Token ids of `text`; with add_special_tokens the bos/eos of add_bos_token /
        add_eos_token are added. `truncation` cuts to `max_length` (default model_max_length)."""
        ids = self._tokenizer.encode(text, add_special_tokens=False).ids
        if add_special_tokens:
            ids = self._add_special(ids)
        if truncation:
            ids = self._truncate(ids, max_length if max_length is not None else self.model_max_length)
        return ids

    def decode(self, token_ids, skip_special_tokens=False, clean_up_tokenization_spaces=False):
        """Text of `token_ids` (invalid UTF-8 byte sequences become U+FFFD)."""
        text = self._tokenizer.decode(_to_id_list(token_ids), skip_special_tokens=skip_special_tokens)
        if clean_up_tokenization_spaces:
            for a, b in ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
                         (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re")):
                text = text.replace(a, b)
        return text

    def batch_decode(self, sequences, skip_special_tokens=False, clean_up_tokenization_spaces=False):
        if hasattr(sequences, "numpy") and not isinstance(sequences, np.ndarray):
            sequences = sequences.numpy()
        return [self.decode(s, skip_special_tokens, clean_up_tokenization_spaces) for s in sequences]

    def __call__(self, text, add_special_tokens=True, padding=False, truncation=False, max_length=None,
                 return_tensors=None, return_attention_mask=True):
        """Encode a string or a list of strings. Returns {"input_ids", "attention_mask"}.

        padding: False (no padding), True / "longest" (to the longest in the batch) or
            "max_length" (to `max_length`, default model_max_length); the pad id is pad_token_id,
            or eos_token_id when there is no pad token (attention_mask marks it 0).
        truncation: cut each sequence to `max_length` (default model_max_length).
        return_tensors: None (lists), "np" (int64 arrays) or "flow" / "pt" (engine tensors);
            arrays need equal lengths (pad)."""
        single = isinstance(text, str)
        texts = [text] if single else list(text)
        if truncation and max_length is None:
            max_length = self.model_max_length
        encs = self._tokenizer.encode_batch(texts, add_special_tokens=False) if texts else []
        ids = []
        for e in encs:
            x = e.ids
            if add_special_tokens:
                x = self._add_special(x)
            if truncation:
                x = self._truncate(x, max_length)
            ids.append(x)
        masks = [[1] * len(x) for x in ids]
        if padding in (True, "longest", "max_length"):
            target = (max_length if max_length is not None else self.model_max_length) if padding == "max_length" \
                else max((len(x) for x in ids), default=0)
            pad_id = self.pad_token_id if self.pad_token_id is not None else self.eos_token_id
            for k, x in enumerate(ids):
                n = target - len(x)
                if n > 0:
                    if self.padding_side == "right":
                        ids[k], masks[k] = x + [pad_id] * n, masks[k] + [0] * n
                    else:
                        ids[k], masks[k] = [pad_id] * n + x, [0] * n + masks[k]
        elif padding not in (False, None, "do_not_pad"):
            raise ValueError(f"padding must be False, True, 'longest' or 'max_length', got {padding!r}")
        out = {"input_ids": ids}
        if return_attention_mask:
            out["attention_mask"] = masks
        if return_tensors is not None:
            if len({len(x) for x in ids}) > 1:
                raise ValueError("sequences have different lengths: pass padding=True to return tensors")
            arrays = {k: np.asarray(v, dtype=np.int64).reshape(len(v), -1) for k, v in out.items()}
            if return_tensors == "np":
                out = arrays
            elif return_tensors in ("flow", "pt", "of"):
                import engine as flow

                out = {k: flow.tensor(v) for k, v in arrays.items()}
            else:
                raise ValueError(f"return_tensors must be None, 'np' or 'flow', got {return_tensors!r}")
        if single:
            out = {k: v[0] for k, v in out.items()}
        return out

    batch_encode = __call__

    # ------------------------------------------------------------------ saving
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

    def save_pretrained(self, save_directory):
        """vocab.json, merges.txt and tokenizer.json into `save_directory`; returns the paths."""
        vocab_path, merges_path = self.save_vocabulary(save_directory)
        tok_path = os.path.join(save_directory, VOCAB_FILES_NAMES["tokenizer_file"])
        self._tokenizer.save(tok_path)
        return vocab_path, merges_path, tok_path

    def __repr__(self):
        return (f"GPT2Tokenizer(vocab_size={self.vocab_size}, len={len(self)}, eos={self.eos_token!r}, "
                f"add_bos_token={self.add_bos_token}, add_eos_token={self.add_eos_token}, "
                f"do_lower_case={self.do_lower_case})")
