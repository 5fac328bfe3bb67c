"""The default corpus: Python's own documentation, no download.

Every Python installation ships `pydoc_data.topics.topics`, a dict of ~80 English help topics
(~460 KB of text: the language reference sections behind `help("if")` etc.). One topic is one
document. Two builds of it serve the recipes:

* `default_gpt2_corpus()`: a byte-level BPE tokenizer trained on it and the documents tokenized
  into a Megatron mmap dataset (EOD appended to each document), for GPT-2;
* `default_bert_corpus()`: a WordPiece vocabulary (lower-cased) trained on it and the documents
  split into sentences (libai.data.sentences), one sequence per sentence grouped into documents
  (the layout of `tools/preprocess_data.py --split-sentences`), for BERT. Code listings and
  grammar blocks have no sentence ends: a "sentence" over 128 tokens is cut at word starts.

Each is built once and cached under `cache_dir` (default `$LIBAI_CACHE_DIR/default_corpus` or
`~/.cache/libai/default_corpus`) in a directory named by a hash of the text and the settings.
Building happens in a temporary directory renamed into place, under a file lock, so concurrent
processes build it once and never see a partial result.
"""
import fcntl
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time

from engine.serialization import current_umask

__all__ = ["default_corpus_documents", "default_gpt2_corpus", "default_bert_corpus", "default_cache_dir",
           "apply_default_corpus", "DATA_NAME"]

DATA_NAME = "pydoc_topics"
_FORMAT_VERSION = 1


def default_cache_dir():
    root = os.environ.get("LIBAI_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "libai")
    return os.path.join(root, "default_corpus")


def default_corpus_documents():
    """The documents (topic texts, in sorted topic order) of the default corpus."""
    from pydoc_data.topics import topics

    return [topics[k] for k in sorted(topics)]


def _gpt2_paths(directory):
    return {
        "directory": directory,
        "vocab_file": os.path.join(directory, "vocab.json"),
        "merges_file": os.path.join(directory, "merges.txt"),
        "tokenizer_file": os.path.join(directory, "tokenizer.json"),
        "data_prefix": os.path.join(directory, f"{DATA_NAME}_text_document"),
        "meta_file": os.path.join(directory, "meta.json"),
    }


def _bert_paths(directory):
    return {
        "directory": directory,
        "vocab_file": os.path.join(directory, "vocab.txt"),
        "tokenizer_file": os.path.join(directory, "tokenizer.json"),
        "data_prefix": os.path.join(directory, f"{DATA_NAME}_text_sentence"),
        "meta_file": os.path.join(directory, "meta.json"),
    }


def _complete(paths):
    from .indexed_dataset import MMapIndexedDataset

    files = [v for k, v in paths.items() if k not in ("directory", "data_prefix")]
    return all(os.path.isfile(f) for f in files) and MMapIndexedDataset.exists(paths["data_prefix"])


def _write_meta(paths, docs, token_lists, tok, start, **settings):
    meta = {"format_version": _FORMAT_VERSION, "source": "pydoc_data.topics.topics",
            "python": sys.version.split()[0], "documents": len(docs), **settings,
            "vocab_size": len(tok), "build_seconds": round(time.time() - start, 3)}
    meta["tokens"] = int(sum(len(t) for doc in token_lists for t in doc))
    with open(paths["meta_file"], "w") as f:
        json.dump(meta, f, indent=2)


def _build_gpt2(directory, docs, vocab_size, min_frequency, append_eod):
    from libai.tokenizer import GPT2Tokenizer, train_bpe_tokenizer

    from .preprocess import write_documents

    start = time.time()
    files = train_bpe_tokenizer(docs, vocab_size, directory, min_frequency=min_frequency,
                                special_tokens=("<|endoftext|>",), show_progress=False)
    tok = GPT2Tokenizer(vocab_file=files["vocab_file"], merges_file=files["merges_file"])
    token_lists = []
    for ids in (e.ids for e in tok.backend_tokenizer.encode_batch(docs, add_special_tokens=False)):
        token_lists.append(ids + [tok.eod] if append_eod else ids)
    paths = _gpt2_paths(directory)
    write_documents(token_lists, paths["data_prefix"], vocab_size=len(tok))
    _write_meta(paths, docs, [[t] for t in token_lists], tok, start, requested_vocab_size=int(vocab_size),
                min_frequency=int(min_frequency), append_eod=bool(append_eod), eod=tok.eod)


def _build_bert(directory, docs, vocab_size, min_frequency, lowercase):
    from libai.tokenizer import BertTokenizer, train_wordpiece_tokenizer

    from .indexed_dataset import MMapIndexedDatasetBuilder, best_fitting_dtype, data_file_path, index_file_path
    from .sentences import split_sentences

    start = time.time()
    files = train_wordpiece_tokenizer(docs, vocab_size, directory, min_frequency=min_frequency, lowercase=lowercase)
    tok = BertTokenizer(vocab_file=files["vocab_file"], do_lower_case=lowercase)
    paths = _bert_paths(directory)
    builder = MMapIndexedDatasetBuilder(data_file_path(paths["data_prefix"]), dtype=best_fitting_dtype(len(tok)))
    token_lists = []
    continuation = [t.startswith("##") for t, _ in sorted(tok.get_vocab().items(), key=lambda kv: kv[1])]
    for doc in docs:
        sentences = split_sentences(doc)
        encoded = [e.ids for e in tok.backend_tokenizer.encode_batch(sentences, add_special_tokens=False)]
        token_lists.append([piece for ids in encoded if ids for piece in _cut(ids, continuation)])
        for ids in token_lists[-1]:
            builder.add_item(ids)
        builder.end_document()
    builder.finalize(index_file_path(paths["data_prefix"]))
    _write_meta(paths, docs, token_lists, tok, start, requested_vocab_size=int(vocab_size),
                min_frequency=int(min_frequency), lowercase=bool(lowercase),
                sentences=int(sum(len(d) for d in token_lists)))


MAX_SENTENCE_TOKENS = 128


def _cut(ids, continuation, limit=MAX_SENTENCE_TOKENS):
    """`ids` in pieces of at most `limit` tokens, cut at word starts (not before a `##` piece).
    The documentation's code listings and grammar blocks have no sentence ends; whole, they would
    exceed BertDataset's 512-token sentence limit and drop their topics."""
    pieces, start = [], 0
    while len(ids) - start > limit:
        cut = start + limit
        while cut > start + 1 and continuation[ids[cut]]:
            cut -= 1
        pieces.append(ids[start:cut])
        start = cut
    pieces.append(ids[start:])
    return pieces


def _cached(kind, settings, paths_for, build, cache_dir, rebuild):
    """The cache entry of `kind` for `settings` (a tuple), built by `build(tmp_dir, docs)` when
    missing (see the module docstring)."""
    docs = default_corpus_documents()
    h = hashlib.sha1()
    tag = "" if kind == "gpt2" else f"{kind}|"  # (GPT-2's entries keep the names they had before BERT's)
    h.update(f"v{_FORMAT_VERSION}|{tag}{'|'.join(map(str, settings))}|".encode())
    for d in docs:
        h.update(d.encode("utf-8"))
        h.update(b"\x00")
    name = DATA_NAME if kind == "gpt2" else f"{DATA_NAME}-{kind}"
    key = f"{name}-v{settings[0]}-{h.hexdigest()[:12]}"
    cache_dir = os.path.abspath(os.path.expanduser(cache_dir or default_cache_dir()))
    os.makedirs(cache_dir, exist_ok=True)
    final = os.path.join(cache_dir, key)
    paths = paths_for(final)
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
                os.chmod(tmp, 0o777 & ~current_umask())  # mkdtemp's 0700 would hide the cache from others
                try:
                    build(tmp, docs)
                    os.rename(tmp, final)  # atomic: the directory appears complete
                except BaseException:
                    shutil.rmtree(tmp, ignore_errors=True)
                    if not _complete(paths):
                        raise
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return paths


def default_gpt2_corpus(cache_dir=None, vocab_size=8192, min_frequency=2, append_eod=True, rebuild=False):
    """Build (once) and return the GPT-2 build of the default corpus.

    Returns a dict: vocab_file, merges_file, tokenizer_file (the BPE tokenizer trained on the
    corpus, `<|endoftext|>` its special token), data_prefix (PREFIX of PREFIX.bin/.idx, one
    sequence per topic), meta_file (JSON: documents, tokens, vocab size, ...) and directory.
    `rebuild=True` discards a cached copy first."""
    return _cached("gpt2", (vocab_size, min_frequency, int(bool(append_eod))), _gpt2_paths,
                   lambda d, docs: _build_gpt2(d, docs, vocab_size, min_frequency, append_eod), cache_dir, rebuild)


def default_bert_corpus(cache_dir=None, vocab_size=8192, min_frequency=2, lowercase=True, rebuild=False):
    """Build (once) and return the BERT build of the default corpus.

    Returns a dict: vocab_file (`vocab.txt`, `[PAD]` = 0, then `[UNK] [CLS] [SEP] [MASK]`),
    tokenizer_file, data_prefix (PREFIX of the sentence-level PREFIX.bin/.idx: one sequence per
    sentence, one document per topic), meta_file (documents, sentences, tokens, ...) and directory."""
    return _cached("bert", (vocab_size, min_frequency, int(bool(lowercase))), _bert_paths,
                   lambda d, docs: _build_bert(d, docs, vocab_size, min_frequency, lowercase), cache_dir, rebuild)


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


def _is_bert_tokenizer(node):
    target = _node_get(node, "_target_")
    name = target if isinstance(target, str) else getattr(target, "__name__", "")
    return "Bert" in name.rsplit(".", 1)[-1]


def apply_default_corpus(cfg):
    """Fill the data paths a config leaves at None with the default corpus.

    The tokenizer says which build: a BertTokenizer with vocab_file (and tokenizer_file) None gets
    the BERT build's vocab.txt (`default_bert_corpus`, lower-cased as the tokenizer's
    do_lower_case); a GPT2Tokenizer with vocab_file, merges_file (and tokenizer_file) None gets
    the GPT-2 build's vocab.json / merges.txt (`default_gpt2_corpus`). A dataset of
    `dataloader.train` (or of a `dataloader.test` entry) with `data_prefix` None and no
    `indexed_dataset` gets the build's data prefix (an `indexed_dataset` node with data_prefix
    None gets it too). Each build is made once and cached, with
    `tokenization.default_corpus_vocab_size` tokens. Returns the corpus paths when something
    was filled in, else None. Idempotent."""
    from libai.config import try_get_key

    tok = try_get_key(cfg, "tokenization.tokenizer", default=None)
    is_tok = tok is not None and hasattr(tok, "keys") and "vocab_file" in tok
    bert = is_tok and _is_bert_tokenizer(tok)
    path_keys = ("vocab_file", "tokenizer_file") if bert else ("vocab_file", "merges_file", "tokenizer_file")
    fill_tok = is_tok and all(_node_get(tok, k) is None for k in path_keys)
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
    vocab = int(try_get_key(cfg, "tokenization.default_corpus_vocab_size", default=None) or 8192)
    if bert:
        lowercase = _node_get(tok, "do_lower_case", True)
        paths = default_bert_corpus(vocab_size=vocab, lowercase=True if lowercase is None else bool(lowercase))
    else:  # tokenization.append_eod: whether the default corpus's documents end with <|endoftext|>
        append_eod = try_get_key(cfg, "tokenization.append_eod", default=True)
        paths = default_gpt2_corpus(vocab_size=vocab, append_eod=True if append_eod is None else bool(append_eod))
    if fill_tok:
        tok.vocab_file = paths["vocab_file"]
        if not bert:
            tok.merges_file = paths["merges_file"]
    for node, key in datasets:
        node[key] = paths["data_prefix"]
    if datasets and not fill_tok and tok is not None:
        import logging

        logging.getLogger(__name__).warning(
            "the default corpus is used for the data but the tokenizer has its own files: the token ids "
            "of the data are the default corpus tokenizer's")
    return paths
