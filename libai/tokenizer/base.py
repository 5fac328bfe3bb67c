"""What every tokenizer here shares, on a `tokenizers.Tokenizer`: special tokens, the
vocabulary, tokens <-> ids, encode / decode of single texts and pairs, batched `__call__` with
padding, truncation and tensors, saving `tokenizer.json`. A subclass builds the backend
tokenizer from its model's files and says where its special tokens go
(`build_inputs_with_special_tokens`, `create_token_type_ids_from_sequences`)."""
import os

import numpy as np
from tokenizers import AddedToken

__all__ = ["TokenizerBase", "vocab_size_with_padding", "existing_file", "read_text", "to_id_list"]

# HuggingFace's order (SPECIAL_TOKENS_ATTRIBUTES): the order of all_special_tokens and of registration
SPECIAL_TOKEN_KEYS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
TRUNCATION_STRATEGIES = ("longest_first", "only_first", "only_second")


def vocab_size_with_padding(vocab_size, make_vocab_size_divisible_by=128, tensor_parallel_size=1):
    """Megatron/LiBai rule: round `vocab_size` up to a multiple of
    `make_vocab_size_divisible_by * tensor_parallel_size` (so the embedding splits evenly over the
    tensor-parallel ranks and the matmul shapes stay aligned)."""
    multiple = int(make_vocab_size_divisible_by or 1) * int(tensor_parallel_size or 1)
    if multiple <= 0:
        raise ValueError(f"make_vocab_size_divisible_by * tensor_parallel_size must be positive, got {multiple}")
    return -(-int(vocab_size) // multiple) * multiple


def token_str(tok):
    if tok is None:
        return None
    return tok.content if isinstance(tok, AddedToken) else str(tok)


def to_id_list(ids):
    """ids as a flat list of python ints (accepts int, list, numpy array, engine/torch tensors)."""
    if hasattr(ids, "numpy") and not isinstance(ids, np.ndarray):
        ids = ids.numpy()
    if isinstance(ids, np.ndarray):
        return [int(i) for i in ids.reshape(-1)]
    if isinstance(ids, (int, np.integer)):
        return [int(ids)]
    return [int(i) for i in ids]


def existing_file(path, key, owner):
    """The full path of `path` (argument `key` of `owner`), or FileNotFoundError naming both."""
    full = os.path.abspath(os.path.expanduser(str(path)))
    if not os.path.isfile(full):
        raise FileNotFoundError(f"{owner}: {key} {full} does not exist")
    return full


def read_text(path, key, owner):
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except UnicodeDecodeError as e:
        raise ValueError(f"{owner}: {key} {path} is not UTF-8 text ({e})") from None


def load_tokenizer_json(path, owner):
    from tokenizers import Tokenizer

    path = existing_file(path, "tokenizer_file", owner)
    try:
        return Tokenizer.from_file(path)
    except Exception as e:  # noqa: BLE001 (tokenizers raises a bare Exception, without the path)
        raise ValueError(f"{owner}: tokenizer_file {path} is not a valid tokenizer.json ({e})") from None


class TokenizerBase:
    """The shared tokenizer API (HuggingFace's names). Subclasses set `self._tokenizer` and call
    `_init_common`; they may override `build_inputs_with_special_tokens`,
    `create_token_type_ids_from_sequences` and `_pad_id`."""

    model_input_names = ["input_ids", "attention_mask"]
    vocab_files_names = {"tokenizer_file": "tokenizer.json"}
    tokenizer_file_name = "tokenizer.json"

    def _init_common(self, special_tokens, additional_special_tokens, model_max_length, padding_side,
                     truncation_side):
        self.model_max_length = model_max_length
        if padding_side not in ("right", "left") or truncation_side not in ("right", "left"):
            raise ValueError("padding_side and truncation_side must be 'right' or 'left'")
        self.padding_side, self.truncation_side = padding_side, truncation_side
        for key in SPECIAL_TOKEN_KEYS:
            setattr(self, key, token_str(special_tokens.get(key)))
        self.additional_special_tokens = [token_str(t) for t in (additional_special_tokens or [])]
        self._register_special_tokens(self.all_special_tokens)

    @classmethod
    def from_pretrained(cls, directory, **kwargs):
        """Load from a directory holding the model's vocabulary files (`vocab_files_names`:
        vocab.json + merges.txt for GPT-2, vocab.txt for BERT) or a tokenizer.json."""
        directory = str(directory)
        names = {k: v for k, v in cls.vocab_files_names.items() if k != "tokenizer_file"}
        files = {k: os.path.join(directory, name) for k, name in names.items()}
        if all(os.path.isfile(path) for path in files.values()):
            return cls(**files, **kwargs)
        tok_json = os.path.join(directory, cls.vocab_files_names["tokenizer_file"])
        if os.path.isfile(tok_json):
            return cls(tokenizer_file=tok_json, **kwargs)
        raise FileNotFoundError(f"{directory} has neither {' + '.join(names.values())} nor tokenizer.json")

    # ------------------------------------------------------------------ special tokens
    def _register_special_tokens(self, tokens):
        added = [AddedToken(t, single_word=False, lstrip=False, rstrip=False, normalized=False, special=True)
                 for t in tokens]
        if added:
            self._tokenizer.add_special_tokens(added)

    def add_special_tokens(self, special_tokens_dict):
        """Set/add special tokens: keys unk_token, bos_token, eos_token, pad_token, cls_token,
        sep_token, mask_token, additional_special_tokens. Returns the number of tokens new to the
        vocabulary."""
        before = len(self)
        new = []
        for key, value in special_tokens_dict.items():
            if key == "additional_special_tokens":
                vals = [token_str(v) for v in value]
                self.additional_special_tokens.extend(v for v in vals if v not in self.additional_special_tokens)
                new.extend(vals)
            elif key in SPECIAL_TOKEN_KEYS:
                setattr(self, key, token_str(value))
                new.append(token_str(value))
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

    @property
    def all_special_tokens(self):
        out = []
        for t in [getattr(self, k) for k in SPECIAL_TOKEN_KEYS] + self.additional_special_tokens:
            if t is not None and t not in out:
                out.append(t)
        return out

    @property
    def all_special_ids(self):
        return [self._tok_id(t) for t in self.all_special_tokens]

    def _tok_id(self, token):
        return None if token is None else self._tokenizer.token_to_id(token)

    unk_token_id = property(lambda self: self._tok_id(self.unk_token))
    bos_token_id = property(lambda self: self._tok_id(self.bos_token))
    eos_token_id = property(lambda self: self._tok_id(self.eos_token))
    pad_token_id = property(lambda self: self._tok_id(self.pad_token))
    cls_token_id = property(lambda self: self._tok_id(self.cls_token))
    sep_token_id = property(lambda self: self._tok_id(self.sep_token))
    mask_token_id = property(lambda self: self._tok_id(self.mask_token))

    # ------------------------------------------------------------------ vocabulary
    @property
    def vocab_size(self):
        """Size of the base vocabulary (without tokens added after it)."""
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

    # ------------------------------------------------------------------ tokens <-> ids
    def tokenize(self, text):
        """The tokens of `text`, no special tokens added."""
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
        return [self._tokenizer.id_to_token(i) for i in to_id_list(ids) if i not in special]

    def convert_tokens_to_string(self, tokens):
        return self._tokenizer.decoder.decode(list(tokens))

    # ------------------------------------------------------------------ special-token layout
    def build_inputs_with_special_tokens(self, ids, pair_ids=None):
        """The ids of one sequence (or a pair) with the model's special tokens (default: none)."""
        return list(ids) + (list(pair_ids) if pair_ids is not None else [])

    def create_token_type_ids_from_sequences(self, ids, pair_ids=None):
        """Segment ids for `build_inputs_with_special_tokens(ids, pair_ids)` (default: all 0)."""
        return [0] * len(self.build_inputs_with_special_tokens(ids, pair_ids))

    def num_special_tokens_to_add(self, pair=False):
        return len(self.build_inputs_with_special_tokens([], [] if pair else None))

    def _pad_id(self):
        return self.pad_token_id

    # ------------------------------------------------------------------ encode / decode
    def _cut(self, ids, n):
        """`ids` without `n` tokens, taken from the truncation side."""
        if n <= 0:
            return ids
        return ids[:len(ids) - n] if self.truncation_side == "right" else ids[n:]

    def truncate_sequences(self, ids, pair_ids=None, num_tokens_to_remove=0, truncation_strategy="longest_first"):
        """Remove `num_tokens_to_remove` tokens (HuggingFace's fast tokenizers' strategies):
        longest_first leaves the shorter sequence (the first on a tie) at most half of what
        remains, and the longer one the rest; only_first / only_second cut that sequence.
        Returns (ids, pair_ids)."""
        if truncation_strategy not in TRUNCATION_STRATEGIES:
            raise ValueError(f"truncation must be one of {TRUNCATION_STRATEGIES} (or True), "
                             f"got {truncation_strategy!r}")
        n = int(num_tokens_to_remove)
        if n <= 0:
            return ids, pair_ids
        if pair_ids is None or truncation_strategy == "only_first":
            if n > len(ids):
                raise ValueError(f"cannot remove {n} tokens from a sequence of {len(ids)} (max_length too short "
                                 "for the special tokens?)")
            return self._cut(ids, n), pair_ids
        if truncation_strategy == "only_second":
            if n > len(pair_ids):
                raise ValueError(f"cannot remove {n} tokens from the second sequence of {len(pair_ids)}")
            return ids, self._cut(pair_ids, n)
        target = len(ids) + len(pair_ids) - n
        if target < 0:
            raise ValueError("max_length is too short for the special tokens")
        # the shorter sequence (the first on a tie) keeps at most half, the longer the rest
        first_shorter = len(ids) <= len(pair_ids)
        short = min(len(ids) if first_shorter else len(pair_ids), target // 2)
        keep_a, keep_b = (short, target - short) if first_shorter else (target - short, short)
        return self._cut(ids, len(ids) - keep_a), self._cut(pair_ids, len(pair_ids) - keep_b)

    def _encode_ids(self, ids, pair_ids, add_special_tokens, truncation, max_length):
        """(input_ids, token_type_ids) of already tokenized sequences."""
        if truncation:
            strategy = "longest_first" if truncation is True else truncation
            limit = max_length if max_length is not None else self.model_max_length
            extra = self.num_special_tokens_to_add(pair_ids is not None) if add_special_tokens else 0
            total = len(ids) + (len(pair_ids) if pair_ids is not None else 0) + extra
            ids, pair_ids = self.truncate_sequences(ids, pair_ids, total - limit, strategy)
        if add_special_tokens:
            return (self.build_inputs_with_special_tokens(ids, pair_ids),
                    self.create_token_type_ids_from_sequences(ids, pair_ids))
        joined = list(ids) + (list(pair_ids) if pair_ids is not None else [])
        return joined, [0] * len(ids) + [1] * (len(joined) - len(ids))

    def encode(self, text, text_pair=None, add_special_tokens=True, truncation=False, max_length=None):
        """Token ids of `text` (and `text_pair`), with the model's special tokens when
        `add_special_tokens`. `truncation` (True: "longest_first", or a strategy name) cuts the
        result to `max_length` (default model_max_length)."""
        ids = self._tokenizer.encode(text, add_special_tokens=False).ids
        pair = self._tokenizer.encode(text_pair, add_special_tokens=False).ids if text_pair is not None else None
        return self._encode_ids(ids, pair, add_special_tokens, truncation, max_length)[0]

    def decode(self, token_ids, skip_special_tokens=False, clean_up_tokenization_spaces=False):
        text = self._tokenizer.decode(to_id_list(token_ids), skip_special_tokens=skip_special_tokens)
        if clean_up_tokenization_spaces:
            for a, b in ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
                         (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re")):
                text = text.replace(a, b)
        return text

    def batch_decode(self, sequences, skip_special_tokens=False, clean_up_tokenization_spaces=False):
        if hasattr(sequences, "numpy") and not isinstance(sequences, np.ndarray):
            sequences = sequences.numpy()
        return [self.decode(s, skip_special_tokens, clean_up_tokenization_spaces) for s in sequences]

    def __call__(self, text, text_pair=None, add_special_tokens=True, padding=False, truncation=False,
                 max_length=None, return_tensors=None, return_attention_mask=True, return_token_type_ids=None):
        """Encode a string (or a pair) or a list of them. Returns {"input_ids", "attention_mask"}
        and "token_type_ids" when the model uses them (`model_input_names`) or when asked.

        padding: False (no padding), True / "longest" (to the longest in the batch) or
            "max_length" (to `max_length`, default model_max_length) with `_pad_id()`
            (attention_mask marks it 0).
        truncation: False, True ("longest_first"), "only_first" or "only_second": cut each
            sequence to `max_length` (default model_max_length).
        return_tensors: None (lists), "np" (int64 arrays) or "flow" / "pt" (engine tensors);
            arrays need equal lengths (pad)."""
        single = isinstance(text, str)
        texts = [text] if single else list(text)
        pairs = None if text_pair is None else ([text_pair] if single else list(text_pair))
        if pairs is not None and len(pairs) != len(texts):
            raise ValueError(f"{len(texts)} texts but {len(pairs)} text pairs")
        if truncation and max_length is None:
            max_length = self.model_max_length
        encode = self._tokenizer.encode_batch
        firsts = [e.ids for e in encode(texts, add_special_tokens=False)] if texts else []
        seconds = [e.ids for e in encode(pairs, add_special_tokens=False)] if pairs else [None] * len(firsts)
        encoded = [self._encode_ids(a, b, add_special_tokens, truncation, max_length) for a, b in zip(firsts, seconds)]
        ids = [e[0] for e in encoded]
        types = [e[1] for e in encoded]
        masks = [[1] * len(x) for x in ids]
        if padding in (True, "longest", "max_length"):
            target = (max_length if max_length is not None else self.model_max_length) if padding == "max_length" \
                else max((len(x) for x in ids), default=0)
            pad_id = self._pad_id()
            for k, x in enumerate(ids):
                n = target - len(x)
                if n > 0:
                    if self.padding_side == "right":
                        ids[k], masks[k], types[k] = x + [pad_id] * n, masks[k] + [0] * n, types[k] + [0] * n
                    else:
                        ids[k], masks[k], types[k] = [pad_id] * n + x, [0] * n + masks[k], [0] * n + types[k]
        elif padding not in (False, None, "do_not_pad"):
            raise ValueError(f"padding must be False, True, 'longest' or 'max_length', got {padding!r}")
        out = {"input_ids": ids}
        if return_token_type_ids or (return_token_type_ids is None and "token_type_ids" in self.model_input_names):
            out["token_type_ids"] = types
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
        raise NotImplementedError

    def save_pretrained(self, save_directory):
        """The vocabulary files (`save_vocabulary`) and tokenizer.json into `save_directory`;
        returns the paths."""
        paths = self.save_vocabulary(save_directory)
        tok_path = os.path.join(save_directory, self.tokenizer_file_name)
        self._tokenizer.save(tok_path)
        return (*paths, tok_path)
