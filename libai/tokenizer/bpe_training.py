"""Training vocabularies: GPT-2's byte-level BPE and BERT's WordPiece (used by
tools/train_tokenizer.py and the default corpus)."""
import io
import json
import os
import warnings

__all__ = ["iter_texts", "train_bpe_tokenizer", "train_wordpiece_tokenizer", "BERT_SPECIAL_TOKENS",
           "VocabSizeWarning", "InputFileError", "MissingKeyError", "read_text_lines", "read_text",
           "json_line_texts"]

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


class InputFileError(ValueError):
    """An input file of the data tools that cannot be read as asked (not UTF-8 text, gzipped, a
    bad JSON line); the message names the file and, where there is one, the line."""


class MissingKeyError(InputFileError, KeyError):
    """A JSON line without a requested key (a KeyError too, as it was before)."""

    def __str__(self):  # the message as it is, not KeyError's repr of it
        return str(self.args[0]) if self.args else ""


GZIP_MAGIC = b"\x1f\x8b"
_NOT_UTF8 = "the input must be UTF-8 text"


def _open_utf8(path):
    """`path` opened as UTF-8 text (universal newlines); InputFileError for a gzip file."""
    f = open(path, "rb")
    if f.peek(2)[:2] == GZIP_MAGIC:
        f.close()
        raise InputFileError(f"{path}: gzip-compressed (it starts with the gzip magic bytes 1f 8b), not text: "
                             f"{_NOT_UTF8}; decompress it first (gunzip -k {path})")
    return io.TextIOWrapper(f, encoding="utf-8")


def _utf8_error(path, err):
    """InputFileError naming the line and byte offset of the first bytes of `path` that are not UTF-8."""
    offset = 0
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):  # no UTF-8 sequence holds a b"\n" byte
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError as e:
                return InputFileError(f"{path}:{lineno}: not UTF-8 text (byte 0x{raw[e.start]:02x} at byte offset "
                                      f"{offset + e.start}: {e.reason}): {_NOT_UTF8}; convert it first (e.g. "
                                      f"iconv -f latin1 -t utf-8 for Latin-1)")
            offset += len(raw)
    return InputFileError(f"{path}: not UTF-8 text ({err}): {_NOT_UTF8}")


def read_text_lines(path):
    """Yield (line number, line) of the UTF-8 text file `path` (universal newlines, line ends
    kept); InputFileError for a gzip file or bytes that are not UTF-8, naming file and line."""
    path = os.fspath(path)
    try:
        with _open_utf8(path) as f:
            yield from enumerate(f, 1)
    except UnicodeDecodeError as e:
        raise _utf8_error(path, e) from None


def read_text(path):
    """The whole UTF-8 text file `path` (universal newlines); errors as read_text_lines."""
    path = os.fspath(path)
    try:
        with _open_utf8(path) as f:
            return f.read()
    except UnicodeDecodeError as e:
        raise _utf8_error(path, e) from None


def _json_kind(value):
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"a boolean ({json.dumps(value)})"
    if isinstance(value, (int, float)):
        return f"a number ({value!r})"
    return {list: "an array", dict: "an object", str: "a string"}.get(type(value), type(value).__name__)


def json_line_texts(line, keys, where, key_option="--json-keys", not_json_hint=""):
    """The strings under `keys` of the JSON line `line` (named `where`, "file:line", in errors):
    InputFileError for a line that is not a JSON object or a value that is not a string (null
    included), MissingKeyError for a missing key (naming the keys present and `key_option`)."""
    try:
        data = json.loads(line)
    except json.JSONDecodeError as e:
        raise InputFileError(f"{where}: not a JSON line ({e}){'; ' + not_json_hint if not_json_hint else ''}") from None
    if not isinstance(data, dict):
        raise InputFileError(f"{where}: a JSON line must be an object with the key(s) {list(keys)}, "
                             f"got {_json_kind(data)}")
    texts = []
    for key in keys:
        if key not in data:
            raise MissingKeyError(f"{where}: JSON line has no key {key!r} (keys: {sorted(data)}); name the "
                                  f"text's key with {key_option}")
        if not isinstance(data[key], str):
            raise InputFileError(f"{where}: key {key!r} holds {_json_kind(data[key])}, not a string")
        texts.append(data[key])
    return texts


def iter_texts(files, json_key="text"):
    """Yield the documents of `files`: a `.jsonl`/`.json` file gives the `json_key` string of
    each non-blank line; any other file is read whole as one text. Files must be UTF-8 text; a
    line that is not a JSON object, lacks `json_key` or holds no string there is an
    InputFileError (MissingKeyError) naming the file and the line."""
    if isinstance(files, (str, os.PathLike)):
        files = [files]
    for path in files:
        path = os.fspath(path)
        if path.endswith((".jsonl", ".json")):
            for lineno, line in read_text_lines(path):
                if line.strip():
                    yield json_line_texts(line, [json_key], f"{path}:{lineno}", "--json-key",
                                          "a file ending in .jsonl or .json is read as JSON lines, one object "
                                          "per line")[0]
        else:
            yield read_text(path)


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
