"""The project's embedded default task, "pydoc topics": which of four chapters of Python's
documentation does a sentence come from?

    compound         the compound statements (if, while, for, try, with, def, class, ...)
    debugger         pdb, the debugger and its commands
    string-methods   the methods of str
    specialnames     the data model's special method names (__init__, __eq__, ...)

It is built from the same text as the BERT recipe's default corpus (Python's own documentation,
`pydoc_data.topics`), so it needs no download, and it is a real topic classification (as CLUE's
TNEWS or AG News) in the setting where pretraining matters: few labels. Each topic gives 60
labelled training sentences and 70 held-out dev sentences; a model trained from scratch must learn
what the words mean from 240 sentences, while the pretrained one has read all of the text (without
labels) and knows which words go together.

Construction (deterministic): the sentences (libai.data.sentences) of the four topics with 6 to
40 words ending with a period, without those that more than one of the four topics contains;
each topic's sentences are shuffled with a fixed seed, the first 60 are train, the next 70 dev.
The files are CLUE-style JSON lines (`{"sentence": ..., "label": topic}`), read by the CLUE
reader, in a cache directory next to the default corpus.
"""
import hashlib
import json
import os
import tempfile

import numpy as np

__all__ = ["TOPICS", "topic_examples", "build_topic_files", "build_topic_dataset"]

TOPICS = ("compound", "debugger", "string-methods", "specialnames")
TRAIN_PER_TOPIC, DEV_PER_TOPIC = 60, 70
_VERSION = 1


def _topic_sentences():
    from pydoc_data.topics import topics

    from libai.data.sentences import split_sentences

    per_topic = {t: [s for s in split_sentences(topics[t]) if s.endswith(".") and 6 <= len(s.split()) <= 40]
                 for t in TOPICS}
    count = {}
    for sentences in per_topic.values():
        for s in set(sentences):
            count[s] = count.get(s, 0) + 1
    return {t: list(dict.fromkeys(s for s in sentences if count[s] == 1)) for t, sentences in per_topic.items()}


def topic_examples(seed=0):
    """{"train": [(sentence, topic)], "dev": [...]} (see the module docstring)."""
    rng = np.random.RandomState(seed)
    out = {"train": [], "dev": []}
    for topic, sentences in _topic_sentences().items():
        if len(sentences) < TRAIN_PER_TOPIC + DEV_PER_TOPIC:
            raise RuntimeError(f"pydoc topics: topic {topic!r} has {len(sentences)} usable sentences, fewer than "
                               f"{TRAIN_PER_TOPIC + DEV_PER_TOPIC} (a different Python's documentation?)")
        order = rng.permutation(len(sentences))
        out["train"] += [(sentences[i], topic) for i in order[:TRAIN_PER_TOPIC]]
        out["dev"] += [(sentences[i], topic) for i in order[TRAIN_PER_TOPIC:TRAIN_PER_TOPIC + DEV_PER_TOPIC]]
    return out


def build_topic_files(cache_dir=None, seed=0):
    """The directory holding train.json and dev.json (written once, atomically)."""
    from pydoc_data.topics import topics

    from libai.data.corpus import default_cache_dir

    h = hashlib.sha1(f"v{_VERSION}|{seed}|{TOPICS}|".encode())
    for t in TOPICS:
        h.update(topics[t].encode("utf-8"))
    directory = os.path.join(os.path.abspath(cache_dir or default_cache_dir()), f"pydoc-topics-{h.hexdigest()[:12]}")
    if all(os.path.isfile(os.path.join(directory, f)) for f in ("train.json", "dev.json")):
        return directory
    os.makedirs(directory, exist_ok=True)
    for split, rows in topic_examples(seed).items():
        fd, tmp = tempfile.mkstemp(dir=directory, suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.writelines(json.dumps({"sentence": s, "label": t}) + "\n" for s, t in rows)
        os.replace(tmp, os.path.join(directory, f"{split}.json"))
    return directory


def build_topic_dataset(split, tokenizer=None, max_seq_length=64, data_dir=None, cache_dir=None,
                        max_position_embeddings=None):
    """The ClassificationDataset of the task's `split` ("train" or "dev"); `data_dir` None: the
    files built by build_topic_files. `tokenizer` None: the run's tokenizer. A `max_seq_length`
    longer than `max_position_embeddings` (the model's) is refused first."""
    from .classification_dataset import ClassificationDataset, _resolve_tokenizer, check_max_seq_length
    from .readers import read_json_lines

    check_max_seq_length(max_seq_length, max_position_embeddings)
    path = os.path.join(data_dir or build_topic_files(cache_dir), f"{split}.json")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"pydoc topics {split} file not found: {path}")
    examples = read_json_lines(path, "sentence", label_list=TOPICS, require_label=True)
    return ClassificationDataset(examples, _resolve_tokenizer(tokenizer), max_seq_length, label_list=list(TOPICS))
