"""A sentence(-pair) classification or regression dataset of tokenized Examples, as LiBai's
text-classification project feeds BERT-style models.

Examples are tokenized once, up front, in chunks through the tokenizer's batch call (one Python
call per chunk instead of per sample, without holding Python lists for a whole MNLI at once),
and kept as compact arrays; `__getitem__` returns the Instance the trainer's collate expects:

    Instance(input_ids, attention_mask, tokentype_ids,   # DistTensorData of int64 [max_seq_length]
             labels)                                     # int64 class id, or float32 score; on the last stage
"""
import numpy as np

import engine as flow
from libai.config.instantiate import instantiate, is_lazy_node
from libai.data.structures import DistTensorData, Instance

from .readers import get_clue_task, get_glue_task

__all__ = ["ClassificationDataset", "build_glue_dataset", "build_clue_dataset", "check_max_seq_length"]

_CHUNK = 2048


class ClassificationDataset:
    """`examples` (readers.Example) tokenized as `tokenizer(text_a, text_b, truncation=True,
    max_length=max_seq_length, padding="max_length")`; labels become their index in `label_list`
    (float32 scores when `regression`). Without `label_list` nor `regression` the dataset is
    unlabelled (a test file, all labels None): samples have no `labels`."""

    def __init__(self, examples, tokenizer, max_seq_length=128, label_list=None, regression=False):
        examples = list(examples)
        if not examples:
            raise ValueError("ClassificationDataset: no examples")
        self.max_seq_length = int(max_seq_length)
        self.label_list = None if label_list is None else list(label_list)
        self.regression = bool(regression)
        self.guids = [e.guid for e in examples]
        self.input_ids, self.attention_mask, self.tokentype_ids = _encode(tokenizer, examples, self.max_seq_length)
        if not self.labelled and any(e.label is not None for e in examples):
            raise ValueError("ClassificationDataset: the examples have labels but neither label_list nor "
                             "regression=True was given (labels_from_examples(train_examples) makes a list)")
        self.labels = self._label_array(examples) if self.labelled else None

    @property
    def labelled(self):
        return self.regression or self.label_list is not None

    def _label_array(self, examples):
        unlabelled = [e.guid for e in examples if e.label is None]
        if unlabelled:
            raise ValueError(f"ClassificationDataset: example {unlabelled[0]} has no label "
                             f"({len(unlabelled)} unlabelled); pass label_list=None for a test file")
        if self.regression:
            return np.asarray([float(e.label) for e in examples], dtype=np.float32)
        index = {label: i for i, label in enumerate(self.label_list)}
        for e in examples:
            if str(e.label) not in index:
                raise ValueError(f"ClassificationDataset: example {e.guid} has label {e.label!r}, "
                                 f"not one of {self.label_list}")
        return np.asarray([index[str(e.label)] for e in examples], dtype=np.int64)

    def __len__(self):
        return len(self.guids)

    def __getitem__(self, idx):
        idx = int(idx)
        fields = dict(
            input_ids=DistTensorData(flow.tensor(self.input_ids[idx].astype(np.int64))),
            attention_mask=DistTensorData(flow.tensor(self.attention_mask[idx].astype(np.int64))),
            tokentype_ids=DistTensorData(flow.tensor(self.tokentype_ids[idx].astype(np.int64))),
        )
        if self.labels is not None:
            fields["labels"] = DistTensorData(flow.tensor(self.labels[idx]), placement_idx=-1)
        return Instance(**fields)


def _encode(tokenizer, examples, max_len):
    """(input_ids int32, attention_mask int8, tokentype_ids int8), each [n, max_len]: small dtypes
    because a large train set (MNLI: 393k pairs) is held in memory for the whole run."""
    pairs = [e.text_b is not None for e in examples]
    if any(pairs) and not all(pairs):
        single = examples[pairs.index(False)] if pairs[0] else examples[0]
        raise ValueError(f"ClassificationDataset: examples mix sentence pairs and single sentences "
                         f"(e.g. {single.guid} has no text_b)")
    n = len(examples)
    ids = np.zeros((n, max_len), dtype=np.int32)
    mask = np.zeros((n, max_len), dtype=np.int8)
    types = np.zeros((n, max_len), dtype=np.int8)
    for start in range(0, n, _CHUNK):
        chunk = examples[start:start + _CHUNK]
        text_b = [e.text_b for e in chunk] if pairs[0] else None
        enc = tokenizer([e.text_a for e in chunk], text_b, truncation=True, max_length=max_len, padding="max_length")
        end = start + len(chunk)
        ids[start:end] = np.asarray(enc["input_ids"], dtype=np.int64)
        mask[start:end] = np.asarray(enc["attention_mask"], dtype=np.int64)
        if enc.get("token_type_ids") is not None:  # tokenizers without segments: all zeros
            types[start:end] = np.asarray(enc["token_type_ids"], dtype=np.int64)
    return ids, mask, types


def _resolve_tokenizer(tokenizer):
    if tokenizer is None:  # the run's tokenizer, built by the trainer from cfg.tokenization
        from libai.tokenizer import get_tokenizer

        tokenizer = get_tokenizer()
        if tokenizer is None:
            raise ValueError("no tokenizer: give tokenizer=, or run through the trainer, which builds "
                             "cfg.tokenization.tokenizer first")
    elif is_lazy_node(tokenizer):
        tokenizer = instantiate(tokenizer)
    return tokenizer


def check_max_seq_length(max_seq_length, max_position_embeddings):
    """A ValueError naming both config keys when the samples (`max_seq_length`, the task configs'
    task.max_seq_length) are longer than the model's position table (model.cfg.max_position_embeddings;
    None: not known here, e.g. a HuggingFace folder's model, nothing checked)."""
    if max_position_embeddings is not None and int(max_seq_length) > int(max_position_embeddings):
        raise ValueError(f"max_seq_length {int(max_seq_length)} (task.max_seq_length) exceeds the model's "
                         f"max_position_embeddings {int(max_position_embeddings)} "
                         f"(model.cfg.max_position_embeddings): set task.max_seq_length to at most "
                         f"{int(max_position_embeddings)}, or fine-tune a model with more positions")


def _build(spec, data_dir, split, tokenizer, max_seq_length, max_position_embeddings):
    check_max_seq_length(max_seq_length, max_position_embeddings)
    examples = spec.read_split(data_dir, split)  # train and dev files must be labelled
    labelled = any(e.label is not None for e in examples)
    label_list = spec.labels if labelled and not spec.regression else None
    return ClassificationDataset(examples, _resolve_tokenizer(tokenizer), max_seq_length, label_list=label_list,
                                 regression=spec.regression and labelled)


def build_glue_dataset(task, data_dir, split, tokenizer=None, max_seq_length=128, max_position_embeddings=None):
    """The ClassificationDataset of a GLUE task's split ("train", "dev", MNLI's "dev_matched" /
    "dev_mismatched", "test"...) read from `data_dir`/<split>.tsv. `tokenizer` is a tokenizer, its
    LazyCall config, or None: the run's (libai.tokenizer.get_tokenizer()). Train and dev files must
    have their label column; test files (no label column) give an unlabelled dataset.
    `max_position_embeddings` (the model's; the task configs interpolate it) refuses a longer
    `max_seq_length` before anything is read."""
    return _build(get_glue_task(task), data_dir, split, tokenizer, max_seq_length, max_position_embeddings)


def build_clue_dataset(task, data_dir, split, tokenizer=None, max_seq_length=128, max_position_embeddings=None):
    """As build_glue_dataset, for a CLUE task's `data_dir`/<split>.json."""
    return _build(get_clue_task(task), data_dir, split, tokenizer, max_seq_length, max_position_embeddings)
