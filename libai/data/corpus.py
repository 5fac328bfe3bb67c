"""The default GPT-2 corpus: Python's own documentation, no download.

Every Python installation ships `pydoc_data.topics.topics`, a dict of ~80 English help topics
(~460 KB of text: the language reference sections behind `help("if")` etc.). One topic is one
document. `default_gpt2_corpus()` trains a byte-level BPE tokenizer on it and tokenizes it into
a Megatron mmap dataset (EOD appended to each document), once: the files are cached under
`cache_dir` (default `$LIBAI_CACHE_DIR/default_corpus` or `~/.cache/libai/default_corpus`) in a
directory named by a hash of the text and the settings. Building happens in a temporary
directory renamed into place, under a file lock, so concurrent processes build it once and
never see a partial result.
"""
import fcntl
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time

__all__ = ["default_corpus_documents", "default_gpt2_corpus", "default_cache_dir", "apply_default_corpus", "DATA_NAME"]

DATA_NAME = "pydoc_topics"
_FORMAT_VERSION = 1


def default_cache_dir():
    root = os.environ.get("LIBAI_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "libai")
    return os.path.join(root, "default_corpus")


def default_corpus_documents():
    """The documents (topic texts, in sorted topic order) of the default corpus."""
    from pydoc_data.topics import topics

    return [topics[k] for k in sorted(topics)]


def _paths(directory):
    return {
        "directory": directory,
        "vocab_file": os.path.join(directory, "vocab.json"),
        "merges_file": os.path.join(directory, "merges.txt"),
        "tokenizer_file": os.path.join(directory, "tokenizer.json"),
        "data_prefix": os.path.join(directory, f"{DATA_NAME}_text_document"),
        "meta_file": os.path.join(directory, "meta.json"),
    }


def _complete(paths):
    from .indexed_dataset import MMapIndexedDataset

    return (all(os.path.isfile(paths[k]) for k in ("vocab_file", "merges_file", "tokenizer_file", "meta_file"))
            and MMapIndexedDataset.exists(paths["data_prefix"]))


def _build(directory, docs, vocab_size, min_frequency, append_eod):
    from libai.tokenizer import GPT2Tokenizer, train_bpe_tokenizer

    from .preprocess import write_documents

    start = time.time()
    files = train_bpe_tokenizer(docs, vocab_size, directory, min_frequency=min_frequency,
                                special_tokens=("<|endoftext|>",), show_progress=False)
    tok = GPT2Tokenizer(vocab_file=files["vocab_file"], merges_file=files["merges_file"])
    token_lists = []
    for ids in (e.ids for e in tok.backend_tokenizer.encode_batch(docs, add_special_tokens=False)):
        token_lists.append(ids + [tok.eod] if append_eod else ids)
    prefix = _paths(directory)["data_prefix"]
    write_documents(token_lists, prefix, vocab_size=len(tok))
    meta = {"format_version": _FORMAT_VERSION, "source": "pydoc_data.topics.topics",
            "python": sys.version.split()[0], "documents": len(docs),
            "tokens": int(sum(len(t) for t in token_lists)), "requested_vocab_size": int(vocab_size),
            "vocab_size": len(tok), "min_frequency": int(min_frequency), "append_eod": bool(append_eod),
            "eod": tok.eod, "build_seconds": round(time.time() - start, 3)}
    with open(_paths(directory)["meta_file"], "w") as f:
        json.dump(meta, f, indent=2)


def default_gpt2_corpus(cache_dir=None, vocab_size=8192, min_frequency=2, append_eod=True, rebuild=False):
    """Build (once) and return the default corpus files.

    Returns a dict: vocab_file, merges_file, tokenizer_file (the BPE tokenizer trained on the
    corpus, `<|endoftext|>` its special token), data_prefix (PREFIX of PREFIX.bin/.idx, one
    sequence per topic), meta_file (JSON: documents, tokens, vocab size, ...) and directory.
    `rebuild=True` discards a cached copy first."""
    docs = default_corpus_documents()
    h = hashlib.sha1()
    h.update(f"v{_FORMAT_VERSION}|{vocab_size}|{min_frequency}|{int(bool(append_eod))}|".encode())
    for d in docs:
        h.update(d.encode("utf-8"))
        h.update(b"\x00")
    key = f"{DATA_NAME}-v{vocab_size}-{h.hexdigest()[:12]}"
    cache_dir = os.path.abspath(os.path.expanduser(cache_dir or default_cache_dir()))
    os.makedirs(cache_dir, exist_ok=True)
    final = os.path.join(cache_dir, key)
    paths = _paths(final)
    if not rebuild and _complete(paths):
        return paths
    with open(os.path.join(cache_dir, key + ".lock"), "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if rebuild and os.path.isdir(final):
                shutil.rmtree(final)
            if not _complete(paths):
                if os.path.isdir(final):  # a partial copy left by hand: replace it
                    shutil.rmtree(final)
                tmp = tempfile.mkdtemp(prefix=key + ".tmp-", dir=cache_dir)
                try:
                    _build(tmp, docs, vocab_size, min_frequency, append_eod)
                    os.rename(tmp, final)  # atomic: the directory appears complete
                except BaseException:
                    shutil.rmtree(tmp, ignore_errors=True)
                    if not _complete(paths):
                        raise
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return paths


def _node_get(node, key, default=None):
    try:
        return node.get(key, default) if hasattr(node, "get") else getattr(node, key, default)
    except Exception:
        return default


def _dataset_nodes(cfg):
    from libai.config import try_get_key

    nodes = []
    for path in ("dataloader.train",):
        loader = try_get_key(cfg, path, default=None)
        if loader is None:
            continue
        ds = _node_get(loader, "dataset")
        if ds is None:
            continue
        nodes.extend(list(ds) if not hasattr(ds, "keys") else [ds])
    for loader in (try_get_key(cfg, "dataloader.test", default=None) or []):
        ds = _node_get(loader, "dataset")
        if ds is not None:
            nodes.extend(list(ds) if not hasattr(ds, "keys") else [ds])
    return [n for n in nodes if hasattr(n, "keys")]


def apply_default_corpus(cfg):
    """Fill the GPT-2 data paths a config leaves at None with the default corpus.

    `tokenization.tokenizer` with vocab_file, merges_file (and tokenizer_file) all None gets the
    default corpus's vocab.json / merges.txt; a dataset of `dataloader.train` (or of a
    `dataloader.test` entry) with `data_prefix` None and no `indexed_dataset` gets its data
    prefix (an `indexed_dataset` node with data_prefix None gets it too). The corpus is built
    once and cached (`default_gpt2_corpus(vocab_size=tokenization.default_corpus_vocab_size)`).
    Returns the corpus paths when something was filled in, else None. Idempotent."""
    from libai.config import try_get_key

    tok = try_get_key(cfg, "tokenization.tokenizer", default=None)
    fill_tok = (tok is not None and hasattr(tok, "keys") and "vocab_file" in tok
                and _node_get(tok, "vocab_file") is None and _node_get(tok, "merges_file") is None
                and _node_get(tok, "tokenizer_file") is None)
    datasets = []
    for ds in _dataset_nodes(cfg):
        idx = _node_get(ds, "indexed_dataset")
        if "data_prefix" in ds and _node_get(ds, "data_prefix") is None and idx is None:
            datasets.append((ds, "data_prefix"))
        elif (idx is not None and hasattr(idx, "keys") and "data_prefix" in idx
              and _node_get(idx, "data_prefix") is None):
            datasets.append((idx, "data_prefix"))
            if "data_prefix" in ds and _node_get(ds, "data_prefix") is None:
                datasets.append((ds, "data_prefix"))
    if not fill_tok and not datasets:
        return None
    vocab = try_get_key(cfg, "tokenization.default_corpus_vocab_size", default=None) or 8192
    paths = default_gpt2_corpus(vocab_size=int(vocab))
    if fill_tok:
        tok.vocab_file = paths["vocab_file"]
        tok.merges_file = paths["merges_file"]
    for node, key in datasets:
        node[key] = paths["data_prefix"]
    if datasets and not fill_tok and tok is not None:
        import logging

        logging.getLogger(__name__).warning(
            "the default corpus is used for the data but the tokenizer has its own files: the token ids "
            "of the data are the default corpus tokenizer's")
    return paths
