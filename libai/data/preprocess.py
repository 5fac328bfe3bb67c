"""JSONL or plain text -> Megatron mmap indexed datasets (the work behind tools/preprocess_data.py).

Each non-blank JSONL line is one document; for every key of `json_keys` its text is tokenized
and written to `{output_prefix}_{key}_{level}.bin/.idx`. A `.txt` input is plain text: each
non-blank line is one document (its line break dropped), or with `txt_document_per_file` the
whole file is one document (line breaks kept; a blank file is skipped); its documents go to the
one key of `json_keys` (default "text", so `{output_prefix}_text_{level}`). JSONL and .txt
inputs can be mixed, one after another in the order given:

* level `document` (GPT): one sequence per document (`eod` appended with `append_eod`); every
  document yields exactly one sequence, even an empty one (a JSON line with an empty text), so
  sequence i is document i;
* level `sentence` (`split_sentences`, BERT): one sequence per sentence
  (libai.data.sentences.split_sentences; sentences without tokens dropped, `eod` appended to a
  document's last sentence with `append_eod`), and the index's document boundaries group them,
  so document i (`doc_idx[i]:doc_idx[i + 1]`) is input document i, possibly empty.
"""
import multiprocessing
import os
import time

from libai.tokenizer.bpe_training import json_line_texts, read_text, read_text_lines

from .indexed_dataset import best_fitting_dtype, data_file_path, index_file_path, make_builder
from .sentences import split_sentences

__all__ = ["build_tokenizer_from_args", "Encoder", "preprocess_jsonl", "write_documents", "output_prefix_for",
           "is_text_file", "check_inputs"]


# tokenizer names of LiBai and Megatron -> (class name, forced do_lower_case or None)
TOKENIZERS = {"GPT2Tokenizer": ("GPT2Tokenizer", None), "GPT2BPETokenizer": ("GPT2Tokenizer", None),
              "BertTokenizer": ("BertTokenizer", None), "BertWordPieceLowerCase": ("BertTokenizer", True),
              "BertWordPieceCase": ("BertTokenizer", False)}


def build_tokenizer_from_args(tokenizer_name="GPT2Tokenizer", vocab_file=None, merge_file=None,
                              tokenizer_file=None, do_lower_case=False, **kwargs):
    if tokenizer_name not in TOKENIZERS:
        raise ValueError(f"unsupported tokenizer {tokenizer_name!r} (supported: {', '.join(TOKENIZERS)})")
    import libai.tokenizer

    cls_name, lower = TOKENIZERS[tokenizer_name]
    lower = do_lower_case if lower is None else lower
    if cls_name == "BertTokenizer":
        return libai.tokenizer.BertTokenizer(vocab_file=vocab_file, tokenizer_file=tokenizer_file,
                                             do_lower_case=lower, **kwargs)
    return libai.tokenizer.GPT2Tokenizer(vocab_file=vocab_file, merges_file=merge_file, tokenizer_file=tokenizer_file,
                                         do_lower_case=lower, **kwargs)


def output_prefix_for(output_prefix, key, level="document"):
    return f"{output_prefix}_{key}_{level}"


class Encoder:
    """Tokenizes JSONL lines; one tokenizer per worker process (built by `initializer`)."""

    tokenizer = None

    def __init__(self, tokenizer_args, json_keys=("text",), append_eod=False, split_sentences=False,
                 keep_newlines=False):
        self.tokenizer_args = dict(tokenizer_args)
        self.json_keys = list(json_keys)
        self.append_eod = bool(append_eod)
        self.split_sentences = bool(split_sentences)
        self.keep_newlines = bool(keep_newlines)

    def initializer(self):
        Encoder.tokenizer = build_tokenizer_from_args(**self.tokenizer_args)

    def encode_text(self, text):
        """The sequences of one document: [ids] (document level) or one per sentence."""
        tok = Encoder.tokenizer
        if not self.split_sentences:
            ids = tok.encode(text, add_special_tokens=False) if text else []
            return [ids + [tok.eod]] if self.append_eod else [ids]
        sequences = [ids for ids in (tok.encode(s, add_special_tokens=False)
                                     for s in split_sentences(text, self.keep_newlines)) if ids]
        if self.append_eod and sequences:
            sequences[-1].append(tok.eod)
        return sequences

    def encode(self, item):
        """(None, 0) for a blank document, else ({key: [sequence ids, ...]}, bytes of the input).

        `item` is a JSON line, or a `(kind, text, where)` of `_iter_documents`: kind "json" (a
        JSON line) or "text" (a plain-text document for the one key), `where` ("file:line")
        naming it in errors."""
        kind, text, where = item if isinstance(item, tuple) else ("json", item, None)
        if not text.strip():
            return None, 0
        if kind == "text":
            out = {self.json_keys[0]: self.encode_text(text)}
        else:
            texts = json_line_texts(text, self.json_keys, where or "input", "--json-keys",
                                    "a plain-text corpus must be named *.txt (one document per line)")
            out = {key: self.encode_text(t) for key, t in zip(self.json_keys, texts)}
        return out, len(text.encode("utf-8"))


def is_text_file(path):
    """A `.txt` input is plain text; any other is JSONL."""
    return os.fspath(path).lower().endswith(".txt")


def check_inputs(input_files, json_keys=("text",), txt_document_per_file=False):
    """ValueError for options that do not fit the inputs (.txt ones take exactly one key)."""
    if isinstance(input_files, (str, os.PathLike)):
        input_files = [input_files]
    text_files = [os.fspath(p) for p in input_files if is_text_file(p)]
    if text_files and len(json_keys) != 1:
        raise ValueError(f"a .txt input ({text_files[0]}) has one text per document, written under one key: give "
                         f"one --json-keys name (default text), got {list(json_keys)}")
    if txt_document_per_file and not text_files:
        raise ValueError("--txt-document-per-file applies to .txt inputs; none given")


def _iter_documents(input_files, txt_document_per_file=False):
    """(kind, text, "file:line") per line of the inputs (per file for a .txt with
    `txt_document_per_file`), for Encoder.encode."""
    if isinstance(input_files, (str, os.PathLike)):
        input_files = [input_files]
    for path in input_files:
        path = os.fspath(path)
        text = is_text_file(path)
        if text and txt_document_per_file:
            yield "text", read_text(path), path
            continue
        for i, line in read_text_lines(path):
            yield ("text", line.rstrip("\r\n"), f"{path}:{i}") if text else ("json", line, f"{path}:{i}")


def preprocess_jsonl(input_files, output_prefix, tokenizer_args, json_keys=("text",), append_eod=False,
                     workers=1, chunk_size=25, dataset_impl="mmap", show_progress=True, log_interval=None,
                     split_sentences=False, keep_newlines=False, txt_document_per_file=False):
    """Tokenize the JSONL and .txt `input_files` (see the module docstring) into
    `{output_prefix}_{key}_document` mmap datasets (`..._sentence` with `split_sentences`) with
    `workers` processes (a Pool with chunked imap, order preserved). Returns {key: prefix}.

    The files are written under temporary names and renamed at the end: a run that fails (an
    input error: InputFileError naming the file and line) leaves no output and keeps the files
    a previous run wrote under the same prefix."""
    check_inputs(input_files, json_keys, txt_document_per_file)
    encoder = Encoder(tokenizer_args, json_keys, append_eod, split_sentences, keep_newlines)
    encoder.initializer()
    vocab_size = len(Encoder.tokenizer)
    out_dir = os.path.dirname(os.path.abspath(output_prefix))
    os.makedirs(out_dir, exist_ok=True)
    level = "sentence" if split_sentences else "document"
    prefixes = {k: output_prefix_for(output_prefix, k, level) for k in encoder.json_keys}
    # written under temporary names, renamed once all is written: a failed run leaves no file and
    # keeps a previous pair of the same prefix
    paths = {k: (data_file_path(p), index_file_path(p)) for k, p in prefixes.items()}
    tmp = f".tmp{os.getpid()}"
    builders = {}
    pool = None
    try:
        for k, (bin_path, _) in paths.items():
            builders[k] = make_builder(bin_path + tmp, impl=dataset_impl, vocab_size=vocab_size)
        lines = _iter_documents(input_files, txt_document_per_file)
        if workers and workers > 1:
            os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
            pool = multiprocessing.Pool(int(workers), initializer=encoder.initializer)
            encoded = pool.imap(encoder.encode, lines, int(chunk_size))
        else:
            encoded = map(encoder.encode, lines)
        _write_encoded(encoded, builders, show_progress, log_interval)
        if pool is not None:
            pool.close()
            pool.join()
        for k, (bin_path, idx_path) in paths.items():
            builders[k].finalize(idx_path + tmp)
        for bin_path, idx_path in paths.values():
            os.replace(bin_path + tmp, bin_path)
            os.replace(idx_path + tmp, idx_path)
    except BaseException:
        if pool is not None:
            pool.terminate()
            pool.join()
        for builder in builders.values():
            builder._file.close()
        for bin_path, idx_path in paths.values():
            for path in (bin_path + tmp, idx_path + tmp):
                if os.path.exists(path):
                    os.remove(path)
        raise
    return prefixes


def _write_encoded(encoded, builders, show_progress, log_interval):
    """Add the (document, input bytes) pairs of Encoder.encode to the {key: builder}."""
    from tqdm import tqdm

    start = time.time()
    total_bytes = 0
    n_docs = 0
    bar = tqdm(encoded, desc="tokenizing", unit="doc", disable=not show_progress, mininterval=0.5)
    for doc, nbytes in bar:
        if doc is None:
            continue
        total_bytes += nbytes
        n_docs += 1
        for key, sequences in doc.items():
            for ids in sequences:
                builders[key].add_item(ids)
            builders[key].end_document()
        if log_interval and n_docs % log_interval == 0:
            elapsed = max(time.time() - start, 1e-9)
            bar.write(f"processed {n_docs} documents ({n_docs / elapsed:.1f} docs/s, "
                      f"{total_bytes / elapsed / 1024 / 1024:.2f} MB/s)")
    bar.close()


def write_documents(token_lists, output_prefix, vocab_size=None, dtype=None):
    """Write already tokenized documents (one sequence each) as an mmap dataset at `output_prefix`."""
    from .indexed_dataset import MMapIndexedDatasetBuilder

    builder = MMapIndexedDatasetBuilder(data_file_path(output_prefix), dtype=dtype or best_fitting_dtype(vocab_size))
    for ids in token_lists:
        builder.add_item(ids)
        builder.end_document()
    builder.finalize(index_file_path(output_prefix))
    return output_prefix
