"""Readers of the GLUE (tab-separated) and CLUE (JSON lines) distributions, and their task registries.

Every reader returns a list of `Example(guid, text_a, text_b, label)`: `text_b` is None for
single-sentence tasks, `label` a str for classification, a float for regression (STS-B) and None
for unlabelled test files. A file is checked while it is read, because a bad row found later (at
tokenization or in the middle of training) no longer says where it came from: each malformed
row raises ValueError("<path>:<line>: <what is wrong>") with its 1-based line number. Train and
dev files must have their label column (key): only a test split may be unlabelled.

    spec = get_glue_task("SST-2")          # or get_clue_task("afqmc")
    examples = spec.read_split(data_dir, "dev")
    spec.labels, spec.regression, spec.dev_splits
"""
import csv
import json
import math
import os
import re
from dataclasses import dataclass, field
from typing import Callable, Optional, Tuple, Union

__all__ = ["Example", "TaskSpec", "GLUE_TASKS", "CLUE_TASKS", "get_glue_task", "get_clue_task", "read_tsv",
           "read_json_lines", "labels_from_examples"]


@dataclass(frozen=True)
class Example:
    guid: str
    text_a: str
    text_b: Optional[str] = None
    label: Union[str, float, None] = None


@dataclass(frozen=True)
class TaskSpec:
    """A task of a benchmark: `reader(path, require_label=False)` reads one of its files (with
    `require_label`, a file without the label column or key is an error), `labels` is its label
    list (label id = position; None for regression), `splits` maps a split name to its file name."""
    name: str
    reader: Callable
    labels: Optional[Tuple[str, ...]]
    splits: dict = field(default_factory=dict)
    regression: bool = False

    @staticmethod
    def labelled_split(split):
        """Whether a split's file must carry labels: all but the test splits ("test",
        "test_matched", ...), which the benchmarks distribute without them."""
        return not str(split).startswith("test")

    @property
    def dev_splits(self):
        """The split names to evaluate on (MNLI has two: matched and mismatched)."""
        return tuple(s for s in self.splits if s.startswith("dev"))

    def split_path(self, data_dir, split):
        if split not in self.splits:
            raise ValueError(f"{self.name} has no split {split!r}; its splits are {', '.join(self.splits)}")
        return os.path.join(str(data_dir), self.splits[split])

    def read_split(self, data_dir, split):
        path = self.split_path(data_dir, split)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"{self.name} {split} file not found: {path}")
        return self.reader(path, require_label=self.labelled_split(split))


# ---------------------------------------------------------------------------------------- checks
_NEED_LABELS = "a train or dev file must be labelled (only a test file may leave its labels out)"


def _bad(path, line, what):
    return ValueError(f"{path}:{line}: {what}")


def _check_label(path, line, label, label_list, regression):
    """The label as stored in an Example: a float for regression, else a str of `label_list`."""
    if regression:
        try:
            value = float(label)
        except ValueError:
            raise _bad(path, line, f"score {label!r} is not a number") from None
        if not math.isfinite(value):
            raise _bad(path, line, f"score {label!r} is not finite")
        return value
    label = str(label)
    if label_list is not None and label not in label_list:
        raise _bad(path, line, f"label {label!r} is not one of {list(label_list)}")
    return label


def labels_from_examples(examples):
    """The sorted distinct labels of `examples` (numerically when they are all integers), for a
    task with no fixed label list: build it from the train file so train and dev agree on ids."""
    labels = {e.label for e in examples if e.label is not None}
    if all(re.fullmatch(r"-?\d+", str(x)) for x in labels):
        return sorted(labels, key=int)
    return sorted(labels)


# -------------------------------------------------------------------------------------- GLUE TSV
def _tsv_rows(path):
    """(1-based line number, columns) of each non-blank line. QUOTE_NONE: GLUE sentences contain
    quote characters that are text, not CSV quoting (a quoted field would swallow tabs)."""
    with open(path, encoding="utf-8-sig", newline="") as f:
        reader = csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
        for row in reader:
            if row:
                yield reader.line_num, row


def read_tsv(path, text_a, text_b=None, label=None, header=True, label_list=None, regression=False,
             require_label=False):
    """Read a tab-separated file. With `header`, `text_a`/`text_b`/`label` are column names of the
    first line (a file without the label column, a test file, gives label None; with
    `require_label`, a train or dev file, it is an error); without, they are column indices.
    Every row must have as many columns as the first."""
    rows = _tsv_rows(path)
    first = next(rows, None)
    if first is None:
        return []
    if header:
        names = first[1]
        missing = [c for c in (text_a, text_b) if c is not None and c not in names]
        if missing:
            raise _bad(path, first[0], f"no column {missing[0]!r} in the header {names}")
        if require_label and label is not None and label not in names:
            raise _bad(path, first[0], f"no label column {label!r} in the header {names}: {_NEED_LABELS}")
        cols = [names.index(c) if c in names else None for c in (text_a, text_b, label)]
        width, body = len(names), rows
    else:
        cols = [text_a, text_b, label]
        width, body = len(first[1]), _chain(first, rows)
        need = max(c for c in cols if c is not None) + 1
        if width < need:
            raise _bad(path, first[0], f"{width} tab-separated columns, expected at least {need}")
    ia, ib, il = cols
    stem = os.path.splitext(os.path.basename(path))[0]
    examples = []
    for line, row in body:
        if len(row) != width:
            raise _bad(path, line, f"{len(row)} tab-separated columns, expected {width}")
        lab = None if il is None else _check_label(path, line, row[il], label_list, regression)
        examples.append(Example(f"{stem}-{line}", row[ia], None if ib is None else row[ib], lab))
    return examples


def _chain(first, rest):
    yield first
    yield from rest


def _columns(text_a, text_b, label, labels=None, regression=False):
    """A GLUE reader that finds its columns by header name."""
    def reader(path, require_label=False):
        return read_tsv(path, text_a, text_b, label, label_list=labels, regression=regression,
                        require_label=require_label)
    return reader


def _read_cola(path, labels, require_label=False):
    """CoLA's train/dev files have no header (source, label, notation, sentence); its test file
    has the header `index<TAB>sentence`."""
    with open(path, encoding="utf-8-sig") as f:
        first = f.readline().rstrip("\r\n").split("\t")
    if first[:2] == ["index", "sentence"]:
        if require_label:
            raise _bad(path, 1, f"no label column: the header {first} is CoLA's test file's (train and dev files "
                                f"have no header: source, label, notation, sentence); {_NEED_LABELS}")
        return read_tsv(path, "sentence", label_list=labels)
    return read_tsv(path, 3, None, 1, header=False, label_list=labels)


def _glue(name, reader, labels, regression=False, splits=None):
    labels = None if labels is None else tuple(labels)
    if callable(reader):
        read = reader
    else:
        read = _columns(*reader, labels=labels, regression=regression)
    splits = splits or {"train": "train.tsv", "dev": "dev.tsv", "test": "test.tsv"}
    return TaskSpec(name, read, labels, dict(splits), regression)


_BINARY = ("0", "1")
_NLI = ("contradiction", "entailment", "neutral")
_RTE = ("entailment", "not_entailment")

GLUE_TASKS = {
    "cola": _glue("CoLA", lambda p, require_label=False: _read_cola(p, _BINARY, require_label), _BINARY),
    "sst-2": _glue("SST-2", ("sentence", None, "label"), _BINARY),
    "mrpc": _glue("MRPC", ("#1 String", "#2 String", "Quality"), _BINARY),
    "sts-b": _glue("STS-B", ("sentence1", "sentence2", "score"), None, regression=True),
    "qqp": _glue("QQP", ("question1", "question2", "is_duplicate"), _BINARY),
    "mnli": _glue("MNLI", ("sentence1", "sentence2", "gold_label"), _NLI,
                  splits={"train": "train.tsv", "dev_matched": "dev_matched.tsv",
                          "dev_mismatched": "dev_mismatched.tsv", "test_matched": "test_matched.tsv",
                          "test_mismatched": "test_mismatched.tsv"}),
    "qnli": _glue("QNLI", ("question", "sentence", "label"), _RTE),
    "rte": _glue("RTE", ("sentence1", "sentence2", "label"), _RTE),
    "wnli": _glue("WNLI", ("sentence1", "sentence2", "label"), _BINARY),
}


# ---------------------------------------------------------------------------------- CLUE JSON lines
def read_json_lines(path, text_a_key, text_b_key=None, label_key="label", label_list=None, skip_labels=(),
                    require_label=False):
    """Read one JSON object per line. The file is labelled when its first object has `label_key`
    (CLUE test files have none) or with `require_label` (a train or dev file), and then every
    object must have it. Rows whose label is in `skip_labels` are dropped (CMNLI/OCNLI mark rows
    without annotator agreement "-"). A list value (CSL's keywords) is joined with spaces."""
    stem = os.path.splitext(os.path.basename(path))[0]
    examples, labelled = [], None
    with open(path, encoding="utf-8-sig") as f:
        for line, text in enumerate(f, 1):
            if not text.strip():
                continue
            try:
                obj = json.loads(text)
            except json.JSONDecodeError as e:
                raise _bad(path, line, f"invalid JSON ({e})") from None
            if not isinstance(obj, dict):
                raise _bad(path, line, f"expected a JSON object, got {type(obj).__name__}")
            if labelled is None:
                labelled = require_label or label_key in obj
            for key in (text_a_key, text_b_key, label_key if labelled else None):
                if key is not None and key not in obj:
                    hint = f": {_NEED_LABELS}" if require_label and key == label_key else ""
                    raise _bad(path, line, f"missing key {key!r} (keys: {sorted(obj)}){hint}")
            label = obj[label_key] if labelled else None
            if label is not None and str(label) in skip_labels:
                continue
            if label is not None:
                label = _check_label(path, line, label, label_list, regression=False)
            guid = f"{stem}-{obj['id']}" if "id" in obj else f"{stem}-{line}"
            text_b = None if text_b_key is None else _text(obj[text_b_key])
            examples.append(Example(guid, _text(obj[text_a_key]), text_b, label))
    return examples


def _text(value):
    return " ".join(map(str, value)) if isinstance(value, list) else str(value)


def _clue(name, text_a, text_b, labels, skip_labels=()):
    labels = tuple(labels)

    def reader(path, require_label=False):
        return read_json_lines(path, text_a, text_b, label_list=labels, skip_labels=skip_labels,
                               require_label=require_label)
    return TaskSpec(name, reader, labels, {"train": "train.json", "dev": "dev.json", "test": "test.json"})


# TNEWS codes 100..116 without 105 and 111 (15 classes), IFLYTEK 0..118, as in CLUE's baselines
_TNEWS = tuple(str(100 + i) for i in range(17) if i not in (5, 11))
_IFLYTEK = tuple(str(i) for i in range(119))

CLUE_TASKS = {
    "afqmc": _clue("AFQMC", "sentence1", "sentence2", _BINARY),
    "tnews": _clue("TNEWS", "sentence", None, _TNEWS),
    "iflytek": _clue("IFLYTEK", "sentence", None, _IFLYTEK),
    "cmnli": _clue("CMNLI", "sentence1", "sentence2", _NLI, skip_labels=("-",)),
    "ocnli": _clue("OCNLI", "sentence1", "sentence2", _NLI, skip_labels=("-",)),
    "csl": _clue("CSL", "keyword", "abst", _BINARY),
}


# ------------------------------------------------------------------------------------- lookup
def _norm(name):
    return re.sub(r"[^a-z0-9]", "", str(name).lower())


def _lookup(registry, name, benchmark):
    for key, spec in registry.items():
        if _norm(key) == _norm(name):
            return spec
    raise KeyError(f"unknown {benchmark} task {name!r}; known: {', '.join(s.name for s in registry.values())}")


def get_glue_task(name):
    """The TaskSpec of a GLUE task, by name in any case, with or without dash ("SST-2", "sst2")."""
    return _lookup(GLUE_TASKS, name, "GLUE")


def get_clue_task(name):
    """The TaskSpec of a CLUE task, by name in any case ("AFQMC", "tnews")."""
    return _lookup(CLUE_TASKS, name, "CLUE")
