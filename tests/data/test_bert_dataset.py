"""libai.data.datasets.BertDataset on a sentence-level dataset built here from the embedded
corpus: the samples mapping, segments and their labels, masking rates and positions, whole-word
masking, determinism."""
import numpy as np
import pytest

from libai.data.datasets import BertDataset
from libai.data.indexed_dataset import MMapIndexedDataset, MMapIndexedDatasetBuilder, data_file_path, index_file_path
from libai.data.sentences import split_sentences
from libai.tokenizer import BertTokenizer, train_wordpiece_tokenizer


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    from libai.data.corpus import default_corpus_documents

    out = tmp_path_factory.mktemp("bert_data")
    docs = list(default_corpus_documents())[:120]
    tok = BertTokenizer(vocab_file=train_wordpiece_tokenizer(docs, 1500, str(out / "tok"))["vocab_file"])
    prefix = str(out / "corpus_text_sentence")
    builder = MMapIndexedDatasetBuilder(data_file_path(prefix), dtype=np.uint16)
    for doc in docs:
        for sentence in split_sentences(doc):
            ids = tok.encode(sentence, add_special_tokens=False)
            if ids:
                builder.add_item(ids)
        builder.end_document()
    builder.finalize(index_file_path(prefix))
    return tok, prefix


def dataset(corpus, **kwargs):
    tok, prefix = corpus
    args = dict(data_prefix=prefix, tokenizer=tok, max_seq_length=128, max_num_samples=600, seed=7)
    args.update(kwargs)
    return BertDataset(**args)


def is_sublist(part, whole):
    return any(whole[k:k + len(part)] == part for k in range(len(whole) - len(part) + 1))


def restore(sample):
    """The tokens before masking."""
    tokens = sample["input_ids"].copy()
    masked = sample["loss_mask"] == 1
    tokens[masked] = sample["lm_labels"][masked]
    return tokens


def test_samples_mapping_covers_consecutive_sentences_of_one_document(corpus):
    ds = dataset(corpus)
    doc_idx = np.asarray(ds.indexed_dataset.doc_idx)
    assert len(ds) == 600
    for first, end, target in ds.samples_mapping:
        doc = np.searchsorted(doc_idx, first, side="right") - 1
        assert doc_idx[doc] <= first and end <= doc_idx[doc + 1] and end - first >= 2  # binary head: 2 or more
        assert 2 <= target <= 128 - 3


@pytest.mark.parametrize("task", ["sop", "nsp"])
def test_segments_types_and_binary_labels(corpus, task):
    tok, _ = corpus
    ds = dataset(corpus, binary_head_task=task, short_seq_prob=0.0, max_seq_length=512)
    labels = []
    for i in range(200):
        s = ds.get_sample(i)
        n = int(s["attention_mask"].sum())
        assert (s["attention_mask"][:n] == 1).all() and (s["attention_mask"][n:] == 0).all()
        tokens = restore(s)[:n]
        seps = np.flatnonzero(tokens == tok.sep_token_id)
        assert tokens[0] == tok.cls_token_id and len(seps) == 2 and seps[1] == n - 1
        assert (s["tokentype_ids"][:seps[0] + 1] == 0).all() and (s["tokentype_ids"][seps[0] + 1:n] == 1).all()
        assert (s["input_ids"][n:] == tok.pad_token_id).all()
        first, end, _ = ds.samples_mapping[i]
        sentences = [list(ds.indexed_dataset[k]) for k in range(first, end)]
        a, b = [int(t) for t in tokens[1:seps[0]]], [int(t) for t in tokens[seps[0] + 1:n - 1]]
        whole = [int(t) for sent in sentences for t in sent]
        label = int(s["ns_labels"])
        labels.append(label)
        if sum(len(x) for x in sentences) <= 512 - 3:  # not truncated: the segments are exact
            if label == 0:
                assert a + b == whole
            elif task == "sop":
                assert b + a == whole  # swapped
            else:  # B from another document (and A perhaps truncated, to fit B)
                assert is_sublist(a, whole) and not is_sublist(b, whole)
    assert 0.35 < np.mean(labels) < 0.65


def test_masking_rates_and_labels_only_at_masked_positions(corpus):
    tok, _ = corpus
    ds = dataset(corpus, max_num_samples=1500)
    special = set(tok.all_special_ids)
    n_tokens = n_masked = n_mask = n_kept = 0
    for i in range(len(ds)):
        s = ds.get_sample(i)
        n = int(s["attention_mask"].sum())
        masked = s["loss_mask"] == 1
        assert ((s["lm_labels"] != -1) == masked).all()
        original = restore(s)
        assert not any(int(t) in special for t in original[masked])  # never a special token
        n_tokens += n
        n_masked += int(masked.sum())
        n_mask += int((s["input_ids"][masked] == tok.mask_token_id).sum())
        n_kept += int((s["input_ids"][masked] == original[masked]).sum())
    # 15% of the tokens; 80% [MASK], 10% kept (plus random draws of the same token), 10% random
    assert 0.14 < n_masked / n_tokens < 0.16
    assert abs(n_mask / n_masked - 0.8) < 0.02 and abs(n_kept / n_masked - 0.1) < 0.02


def test_whole_word_masking_masks_whole_words(corpus):
    tok, _ = corpus
    ds = dataset(corpus, whole_word_masking=True)
    vocab = tok.inv_vocab
    special = set(tok.all_special_ids)
    checked = 0
    for i in range(300):
        s = ds.get_sample(i)
        original = restore(s)
        masked = s["loss_mask"] == 1
        for pos in range(1, int(s["attention_mask"].sum())):
            # (a segment cut at its front may start with a piece: its word is not in the sample)
            if vocab[int(original[pos])].startswith("##") and int(original[pos - 1]) not in special:
                assert masked[pos] == masked[pos - 1], (i, pos)  # a piece is masked with its word
                checked += 1
    assert checked > 100


def test_samples_are_deterministic_per_seed_and_index(corpus):
    a, b, c = dataset(corpus), dataset(corpus), dataset(corpus, seed=8)
    for i in (0, 5, 599, 17):  # any order
        sa, sb = a.get_sample(i), b.get_sample(i)
        assert all(np.array_equal(sa[k], sb[k]) for k in sa)
    assert not np.array_equal(a.samples_mapping, c.samples_mapping)
    inst, fields = a[3], a.get_sample(3)
    assert list(inst.get_fields()) == ["input_ids", "attention_mask", "tokentype_ids", "ns_labels", "lm_labels",
                                       "loss_mask"]
    assert all(np.array_equal(inst.get(k).tensor.numpy(), fields[k]) for k in fields)
    assert [inst.get(k).placement_idx for k in fields] == [0, 0, 0, -1, -1, -1]


def test_bad_arguments_and_unsplit_data_are_named(corpus, tmp_path):
    tok, prefix = corpus
    with pytest.raises(ValueError, match="binary_head_task must be one of"):
        dataset(corpus, binary_head_task="next")
    one = str(tmp_path / "one_sentence_docs")
    builder = MMapIndexedDatasetBuilder(data_file_path(one), dtype=np.uint16)
    for k in range(5):
        builder.add_item([5 + k, 6, 7])
        builder.end_document()
    builder.finalize(index_file_path(one))
    with pytest.raises(ValueError, match="--split-sentences"):
        BertDataset(name="x", indexed_dataset=MMapIndexedDataset(one), tokenizer=tok, max_seq_length=32)
