"""BERT pretraining samples over a sentence-level indexed dataset (Megatron-LM's / LiBai's
BertDataset; the data comes from `tools/preprocess_data.py --split-sentences`).

1. **Samples mapping** (`build_samples_mapping`, Megatron's `helpers.build_mapping`): the
   documents of the split are walked epoch after epoch; each document is cut into runs of
   consecutive sentences whose tokens reach a target length (`max_seq_length` minus the special
   tokens; with probability `short_seq_prob` a random shorter target in [2, max]); each run is
   one sample (first sentence, end sentence, target length). With a binary head a document needs
   at least two sentences. Documents holding a sentence longer than `LONG_SENTENCE_LEN` tokens
   are skipped, as in Megatron. The mapping is shuffled, deterministic for the seed.
2. **A sample** (`build_training_sample`), drawn with `RandomState(seed + index)` so that it
   depends only on the seed and its index (any order, any resume): segment A = the first k
   sentences (k random), B = the rest; for sentence-order prediction ("sop", Megatron/ALBERT)
   A and B are swapped with probability 1/2 (label 1 = swapped); for next-sentence prediction
   ("nsp", original BERT) B is replaced with probability 1/2 by sentences of another document
   (label 1 = random). The pair is truncated to the target, one token at a time from the
   longer segment, at its front or back at random; then `[CLS] A [SEP] B [SEP]`.
3. **Masking** (`create_masked_lm_predictions`): `masked_lm_prob` (15%) of the tokens, at
   least one, in random order of candidates, each candidate a token or, with
   `whole_word_masking`, a whole word (a piece and the `##` pieces after it); each chosen token
   becomes `[MASK]` with probability 0.8, stays with 0.1 and becomes a random vocabulary token
   with 0.1.

`ds[i]` is an Instance of `input_ids`, `attention_mask` (1 for tokens, 0 for padding),
`tokentype_ids` (0 for `[CLS] A [SEP]`, 1 for `B [SEP]`), `ns_labels` (the binary-head label),
`lm_labels` (the original token at masked positions, -1 elsewhere) and `loss_mask` (1 at masked
positions), padded to `max_seq_length`.
"""
import numpy as np

import engine as flow

from ..indexed_dataset import open_indexed_dataset
from ..structures import DistTensorData, Instance

__all__ = ["BertDataset", "build_samples_mapping", "build_training_sample", "create_masked_lm_predictions",
           "truncate_segments", "LONG_SENTENCE_LEN"]

LONG_SENTENCE_LEN = 512
BINARY_HEAD_TASKS = ("sop", "nsp")


def build_samples_mapping(doc_idx, sizes, documents, max_num_samples, max_num_tokens, short_seq_prob, seed,
                          min_num_sentences, name="bert"):
    """int64[N, 3] rows (first sentence, end sentence, target length), shuffled (see the module
    docstring). Epochs are added until `max_num_samples` samples exist (one epoch when None)."""
    doc_idx, sizes = np.asarray(doc_idx, dtype=np.int64), np.asarray(sizes, dtype=np.int64)
    rng = np.random.RandomState(seed)

    def target_length():
        return rng.randint(2, max_num_tokens + 1) if short_seq_prob > 0 and rng.random_sample() < short_seq_prob \
            else max_num_tokens

    usable = [int(d) for d in documents
              if doc_idx[d + 1] - doc_idx[d] >= min_num_sentences
              and sizes[doc_idx[d]:doc_idx[d + 1]].max(initial=0) <= LONG_SENTENCE_LEN]
    if not usable:
        raise ValueError(f"BertDataset {name!r}: none of its {len(documents)} documents has {min_num_sentences} or "
                         f"more sentences of at most {LONG_SENTENCE_LEN} tokens (BERT's data is split into sentences: "
                         "tools/preprocess_data.py --split-sentences)")
    rows = []
    while True:
        for d in usable:
            first, last = int(doc_idx[d]), int(doc_idx[d + 1])
            start, seq_len, num_sent, target = first, 0, 0, target_length()
            for s in range(first, last):
                seq_len += int(sizes[s])
                num_sent += 1
                remaining = last - s - 1
                if (seq_len >= target and remaining > 1 and num_sent >= min_num_sentences) or remaining == 0:
                    if num_sent >= min_num_sentences:
                        rows.append((start, s + 1, target))
                    start, seq_len, num_sent, target = s + 1, 0, 0, target_length()
            if max_num_samples is not None and len(rows) >= max_num_samples:
                break
        if max_num_samples is None or len(rows) >= max_num_samples:
            break
    mapping = np.asarray(rows[:max_num_samples] if max_num_samples is not None else rows, dtype=np.int64)
    return mapping[np.random.RandomState(seed + 1).permutation(len(mapping))]


def truncate_segments(tokens_a, tokens_b, max_num_tokens, np_rng):
    """Remove tokens in place, one at a time from the longer segment (A on a tie), at its front
    or back at random, until both fit in `max_num_tokens`. Returns whether anything was cut."""
    truncated = False
    while len(tokens_a) + len(tokens_b) > max_num_tokens:
        tokens = tokens_a if len(tokens_a) >= len(tokens_b) else tokens_b
        if np_rng.random_sample() < 0.5:
            del tokens[0]
        else:
            tokens.pop()
        truncated = True
    return truncated


def create_masked_lm_predictions(tokens, special_ids, vocab_ids, is_continuation, mask_id, masked_lm_prob,
                                 max_predictions, np_rng, whole_word_masking=False):
    """(tokens with masks applied, sorted masked positions, their original tokens); see the
    module docstring. `is_continuation[id]` tells whether a token id is a `##` piece."""
    candidates = []
    for i, token in enumerate(tokens):
        if token in special_ids:
            continue
        if whole_word_masking and candidates and is_continuation[token] and candidates[-1][-1] == i - 1:
            candidates[-1].append(i)
        else:
            candidates.append([i])
    num_to_predict = min(max_predictions, max(1, int(round(len(tokens) * masked_lm_prob))))
    order = np_rng.permutation(len(candidates))
    output = list(tokens)
    masked = []
    for c in order:
        group = candidates[c]
        if len(masked) >= num_to_predict:
            break
        if len(masked) + len(group) > num_to_predict:
            continue
        for i in group:
            masked.append(i)
            if np_rng.random_sample() < 0.8:
                output[i] = mask_id
            elif np_rng.random_sample() >= 0.5:
                output[i] = int(vocab_ids[np_rng.randint(0, len(vocab_ids))])
            # else: kept as it is
    masked.sort()
    return output, masked, [tokens[i] for i in masked]


def build_training_sample(sentences, target_length, max_seq_length, tokenizer_ids, masked_lm_prob, np_rng,
                          binary_head=True, task="sop", random_sentences=None, whole_word_masking=False):
    """One sample as numpy arrays (dict of the Instance fields); `tokenizer_ids` holds cls, sep,
    pad, mask, the special ids, the non-special vocabulary ids and the continuation table.
    `random_sentences()` gives sentences of another document (for task "nsp")."""
    ids = tokenizer_ids
    is_random = 0
    if binary_head:
        a_end = 1 if len(sentences) == 2 else int(np_rng.randint(1, len(sentences)))
        tokens_a = [t for s in sentences[:a_end] for t in s]
        tokens_b = [t for s in sentences[a_end:] for t in s]
        if task == "sop":
            if np_rng.random_sample() < 0.5:
                tokens_a, tokens_b, is_random = tokens_b, tokens_a, 1
        elif np_rng.random_sample() < 0.5:
            tokens_b = [t for s in random_sentences(max(1, target_length - len(tokens_a))) for t in s]
            is_random = 1
    else:
        tokens_a, tokens_b = [t for s in sentences for t in s], []
    truncate_segments(tokens_a, tokens_b, target_length, np_rng)
    tokens = [ids["cls"]] + tokens_a + [ids["sep"]]
    types = [0] * len(tokens)
    if binary_head:
        tokens += tokens_b + [ids["sep"]]
        types += [1] * (len(tokens_b) + 1)
    max_predictions = int(masked_lm_prob * target_length)
    tokens, positions, labels = create_masked_lm_predictions(
        tokens, ids["special"], ids["vocab"], ids["continuation"], ids["mask"], masked_lm_prob,
        max(1, max_predictions), np_rng, whole_word_masking)
    n, pad = len(tokens), max_seq_length - len(tokens)
    if pad < 0:
        raise ValueError(f"a sample of {n} tokens does not fit max_seq_length {max_seq_length}")
    lm_labels = np.full(max_seq_length, -1, dtype=np.int64)
    loss_mask = np.zeros(max_seq_length, dtype=np.int64)
    lm_labels[positions] = labels
    loss_mask[positions] = 1
    return {
        "input_ids": np.asarray(tokens + [ids["pad"]] * pad, dtype=np.int64),
        "attention_mask": np.asarray([1] * n + [0] * pad, dtype=np.int64),
        "tokentype_ids": np.asarray(types + [0] * pad, dtype=np.int64),
        "ns_labels": np.asarray(is_random, dtype=np.int64),
        "lm_labels": lm_labels,
        "loss_mask": loss_mask,
    }


def _resolve_tokenizer(tokenizer):
    if tokenizer is None:
        from libai.tokenizer import get_tokenizer

        tokenizer = get_tokenizer()
        if tokenizer is None:
            raise ValueError("BertDataset needs the tokenizer of its data (a BertTokenizer): give tokenizer=, or "
                             "run it through the trainer, which builds cfg.tokenization.tokenizer first")
    else:
        from libai.config.instantiate import instantiate, is_lazy_node

        if is_lazy_node(tokenizer):
            tokenizer = instantiate(tokenizer)
    if tokenizer.mask_token_id is None or tokenizer.cls_token_id is None:
        raise ValueError(f"BertDataset needs a tokenizer with [CLS], [SEP] and [MASK] tokens, got "
                         f"{type(tokenizer).__name__}")
    return tokenizer


class BertDataset:
    """BERT masked-LM (+ binary head) samples from the documents `documents` of a
    sentence-level mmap dataset (see the module docstring).

    Args:
        name: the split's name ("train", "valid", ...), used in messages.
        data_prefix: PREFIX_text_sentence (its .bin/.idx), or give `indexed_dataset`.
        tokenizer: a BertTokenizer (or LazyCall of one): its [CLS] [SEP] [PAD] [MASK] ids, the
            vocabulary for random replacements and the `##` pieces for whole-word masking. None:
            the run's tokenizer (libai.tokenizer.get_tokenizer(), built by the trainer from
            cfg.tokenization).
        documents: indices of the documents of this split; default all.
        max_num_samples (or num_samples): samples wanted (epochs are added until there are that many);
            None: one epoch.
        max_seq_length: tokens per sample, special tokens included (padded to it).
        masked_lm_prob (or LiBai's mask_lm_prob), short_seq_prob: Megatron's 0.15 and 0.1.
        binary_head: segment pairs with a sentence-level label (else one segment, label 0).
        binary_head_task: "sop" (sentence order, Megatron/LiBai) or "nsp" (next sentence, BERT).
        whole_word_masking: mask whole words rather than single pieces.
        seed: the mapping's shuffle and each sample's draws.
    """

    def __init__(self, name="bert", data_prefix=None, indexed_dataset=None, tokenizer=None, documents=None,
                 max_num_samples=None, max_seq_length=512, masked_lm_prob=0.15, short_seq_prob=0.1,
                 binary_head=True, binary_head_task="sop", whole_word_masking=False, seed=1234, num_samples=None,
                 mask_lm_prob=None):
        if mask_lm_prob is not None:  # LiBai's name
            masked_lm_prob = mask_lm_prob
        if num_samples is not None:  # the name build_nlp_train_val_test_loader passes
            max_num_samples = num_samples
        if binary_head_task not in BINARY_HEAD_TASKS:
            raise ValueError(f"BertDataset: binary_head_task must be one of {BINARY_HEAD_TASKS}, "
                             f"got {binary_head_task!r}")
        if not 0 < masked_lm_prob < 1:
            raise ValueError(f"BertDataset: masked_lm_prob must be in (0, 1), got {masked_lm_prob}")
        tokenizer = _resolve_tokenizer(tokenizer)
        indexed_dataset, data_prefix = open_indexed_dataset(indexed_dataset, data_prefix, "BertDataset")
        self._settings = dict(max_seq_length=max_seq_length, masked_lm_prob=masked_lm_prob,
                              short_seq_prob=short_seq_prob, binary_head=binary_head,
                              binary_head_task=binary_head_task, whole_word_masking=whole_word_masking, seed=seed)
        self.name, self.data_prefix, self.indexed_dataset = name, data_prefix, indexed_dataset
        self.tokenizer = tokenizer
        doc_idx = np.asarray(indexed_dataset.doc_idx, dtype=np.int64)
        self.documents = np.arange(len(doc_idx) - 1) if documents is None else np.asarray(documents, dtype=np.int64)
        self.max_seq_length = int(max_seq_length)
        self.masked_lm_prob, self.seed = float(masked_lm_prob), int(seed)
        self.binary_head, self.task = bool(binary_head), binary_head_task
        self.whole_word_masking = bool(whole_word_masking)
        self._doc_idx = doc_idx
        max_num_tokens = self.max_seq_length - (3 if self.binary_head else 2)
        self.samples_mapping = build_samples_mapping(
            doc_idx, indexed_dataset.sizes, self.documents, max_num_samples, max_num_tokens, short_seq_prob,
            self.seed, 2 if self.binary_head else 1, name)
        vocab = tokenizer.get_vocab()
        special = set(tokenizer.all_special_ids)
        continuation = np.zeros(max(vocab.values()) + 1, dtype=bool)
        for token, i in vocab.items():
            continuation[i] = token.startswith("##")
        self._ids = {"cls": tokenizer.cls_token_id, "sep": tokenizer.sep_token_id, "pad": tokenizer.pad_token_id,
                     "mask": tokenizer.mask_token_id, "special": special, "continuation": continuation,
                     "vocab": np.asarray(sorted(i for i in vocab.values() if i not in special), dtype=np.int64)}

    def subset(self, documents, num_samples=None, name=None):
        """A BertDataset over `documents` of the same data, tokenizer and settings (for
        build_nlp_train_val_test_loader's splits)."""
        return type(self)(name=name or self.name, data_prefix=self.data_prefix, indexed_dataset=self.indexed_dataset,
                          tokenizer=self.tokenizer, documents=documents, max_num_samples=num_samples,
                          **self._settings)

    def __len__(self):
        return self.samples_mapping.shape[0]

    def _sentences(self, first, end):
        return [self.indexed_dataset[i].astype(np.int64).tolist() for i in range(first, end)]

    def get_sample(self, idx):
        """The numpy fields of sample `idx` (see the module docstring)."""
        if idx < 0:
            idx += len(self)
        if not 0 <= idx < len(self):
            raise IndexError(f"sample {idx} out of range for {len(self)} samples")
        first, end, target = (int(v) for v in self.samples_mapping[idx])
        np_rng = np.random.RandomState((self.seed + idx) % 2**32)
        current = int(np.searchsorted(self._doc_idx, first, side="right") - 1)

        def random_sentences(n_tokens):
            others = self.documents[self.documents != current]
            if len(others) == 0:
                raise ValueError(f"BertDataset {self.name!r}: next-sentence prediction needs two documents or more")
            d = int(others[np_rng.randint(0, len(others))])
            lo, hi = int(self._doc_idx[d]), int(self._doc_idx[d + 1])
            out, total, s = [], 0, int(np_rng.randint(lo, hi)) if hi > lo else lo
            while s < hi and total < n_tokens:
                out.append(self.indexed_dataset[s].astype(np.int64).tolist())
                total += len(out[-1])
                s += 1
            return out

        return build_training_sample(self._sentences(first, end), target, self.max_seq_length, self._ids,
                                     self.masked_lm_prob, np_rng, self.binary_head, self.task, random_sentences,
                                     self.whole_word_masking)

    def __getitem__(self, idx):
        sample = self.get_sample(int(idx))
        return Instance(
            input_ids=DistTensorData(flow.tensor(sample["input_ids"])),
            attention_mask=DistTensorData(flow.tensor(sample["attention_mask"])),
            tokentype_ids=DistTensorData(flow.tensor(sample["tokentype_ids"])),
            ns_labels=DistTensorData(flow.tensor(sample["ns_labels"]), placement_idx=-1),
            lm_labels=DistTensorData(flow.tensor(sample["lm_labels"]), placement_idx=-1),
            loss_mask=DistTensorData(flow.tensor(sample["loss_mask"]), placement_idx=-1),
        )
