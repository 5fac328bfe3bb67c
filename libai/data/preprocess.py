"""JSONL -> Megatron mmap indexed datasets (the work behind tools/preprocess_data.py).

Each non-blank JSONL line is one document; for every key of `json_keys` its text is tokenized
and written to `{output_prefix}_{key}_{level}.bin/.idx`:

* level `document` (GPT): one sequence per document (`eod` appended with `append_eod`); every
  line yields exactly one sequence, even an empty one, so sequence i is line i;
* level `sentence` (`split_sentences`, BERT): one sequence per sentence
  (libai.data.sentences.split_sentences; sentences without tokens dropped, `eod` appended to a
  document's last sentence with `append_eod`), and the index's document boundaries group them,
  so document i (`doc_idx[i]:doc_idx[i + 1]`) is line i, possibly empty.
"""
import json
import multiprocessing
import os
import time

from .indexed_dataset import best_fitting_dtype, data_file_path, index_file_path, make_builder
from .sentences import split_sentences

__all__ = ["build_tokenizer_from_args", "Encoder", "preprocess_jsonl", "write_documents", "output_prefix_for"]


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

    def encode(self, line):
        """(None, 0) for a blank line, else ({key: [sequence ids, ...]}, bytes of the line)."""
        if not line.strip():
            return None, 0
        data = json.loads(line)
        out = {}
        for key in self.json_keys:
            if key not in data:
                raise KeyError(f"JSON line has no key {key!r} (keys: {sorted(data)})")
            out[key] = self.encode_text(data[key])
        return out, len(line.encode("utf-8"))


def _iter_lines(input_files):
    if isinstance(input_files, (str, os.PathLike)):
        input_files = [input_files]
    for path in input_files:
        with open(path, encoding="utf-8") as f:
            yield from f


def preprocess_jsonl(input_files, output_prefix, tokenizer_args, json_keys=("text",), append_eod=False,
                     workers=1, chunk_size=25, dataset_impl="mmap", show_progress=True, log_interval=None,
                     split_sentences=False, keep_newlines=False):
    """Tokenize the JSONL `input_files` into `{output_prefix}_{key}_document` mmap datasets
    (`..._sentence` with `split_sentences`) with `workers` processes (a Pool with chunked imap,
    order preserved). Returns {key: prefix}."""
    encoder = Encoder(tokenizer_args, json_keys, append_eod, split_sentences, keep_newlines)
    encoder.initializer()
    vocab_size = len(Encoder.tokenizer)
    out_dir = os.path.dirname(os.path.abspath(output_prefix))
    os.makedirs(out_dir, exist_ok=True)
    level = "sentence" if split_sentences else "document"
    prefixes = {k: output_prefix_for(output_prefix, k, level) for k in encoder.json_keys}
    builders = {k: make_builder(data_file_path(p), impl=dataset_impl, vocab_size=vocab_size)
                for k, p in prefixes.items()}
    lines = _iter_lines(input_files)
    pool = None
    if workers and workers > 1:
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        pool = multiprocessing.Pool(int(workers), initializer=encoder.initializer)
        encoded = pool.imap(encoder.encode, lines, int(chunk_size))
    else:
        encoded = map(encoder.encode, lines)
    from tqdm import tqdm

    start = time.time()
    total_bytes = 0
    n_docs = 0
    try:
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
    finally:
        if pool is not None:
            pool.close()
            pool.join()
    for key, p in prefixes.items():
        builders[key].finalize(index_file_path(p))
    return prefixes


def write_documents(token_lists, output_prefix, vocab_size=None, dtype=None):
    """Write already tokenized documents (one sequence each) as an mmap dataset at `output_prefix`."""
    from .indexed_dataset import MMapIndexedDatasetBuilder

    builder = MMapIndexedDatasetBuilder(data_file_path(output_prefix), dtype=dtype or best_fitting_dtype(vocab_size))
    for ids in token_lists:
        builder.add_item(ids)
        builder.end_document()
    builder.finalize(index_file_path(output_prefix))
    return output_prefix
