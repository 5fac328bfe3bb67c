"""JSONL -> Megatron mmap indexed datasets (the work behind tools/preprocess_data.py).

Each non-blank JSONL line is one document; for every key of `json_keys` its text is tokenized
(one sequence per document, `<|endoftext|>` appended with `append_eod`) and written to
`{output_prefix}_{key}_document.bin/.idx`. Every line yields exactly one sequence and one
document per key, even an empty one (length 0, or just the EOD), so sequence i is line i.
"""
import json
import multiprocessing
import os
import time

from .indexed_dataset import best_fitting_dtype, data_file_path, index_file_path, make_builder

__all__ = ["build_tokenizer_from_args", "Encoder", "preprocess_jsonl", "write_documents", "output_prefix_for"]


def build_tokenizer_from_args(tokenizer_name="GPT2Tokenizer", vocab_file=None, merge_file=None,
                              tokenizer_file=None, do_lower_case=False, **kwargs):
    if tokenizer_name not in ("GPT2Tokenizer", "GPT2BPETokenizer"):
        raise ValueError(f"unsupported tokenizer {tokenizer_name!r} (supported: GPT2Tokenizer)")
    from libai.tokenizer import GPT2Tokenizer

    return GPT2Tokenizer(vocab_file=vocab_file, merges_file=merge_file, tokenizer_file=tokenizer_file,
                         do_lower_case=do_lower_case, **kwargs)


def output_prefix_for(output_prefix, key, level="document"):
    return f"{output_prefix}_{key}_{level}"


class Encoder:
    """Tokenizes JSONL lines; one tokenizer per worker process (built by `initializer`)."""

    tokenizer = None

    def __init__(self, tokenizer_args, json_keys=("text",), append_eod=False):
        self.tokenizer_args = dict(tokenizer_args)
        self.json_keys = list(json_keys)
        self.append_eod = bool(append_eod)

    def initializer(self):
        Encoder.tokenizer = build_tokenizer_from_args(**self.tokenizer_args)

    def encode_text(self, text):
        tok = Encoder.tokenizer
        ids = tok.encode(text, add_special_tokens=False) if text else []
        if self.append_eod:
            ids.append(tok.eod)
        return ids

    def encode(self, line):
        """(None, 0) for a blank line, else ({key: ids}, bytes of the line)."""
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
                     workers=1, chunk_size=25, dataset_impl="mmap", show_progress=True, log_interval=None):
    """Tokenize the JSONL `input_files` into `{output_prefix}_{key}_document` mmap datasets with
    `workers` processes (a Pool with chunked imap, order preserved). Returns {key: prefix}."""
    encoder = Encoder(tokenizer_args, json_keys, append_eod)
    encoder.initializer()
    vocab_size = len(Encoder.tokenizer)
    out_dir = os.path.dirname(os.path.abspath(output_prefix))
    os.makedirs(out_dir, exist_ok=True)
    prefixes = {k: output_prefix_for(output_prefix, k) for k in encoder.json_keys}
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
            for key, ids in doc.items():
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
