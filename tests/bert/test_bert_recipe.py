"""The BERT recipe end to end: the default corpus's BERT build, the config filled with it, the
README command with short overrides (losses, SOP accuracy, evaluation metrics), and MLMEvaluator's
token-weighted metrics."""
import json
import math
import os

import numpy as np

import engine as flow
from libai.config import LazyConfig
from libai.data import MMapIndexedDataset
from libai.data.corpus import apply_default_corpus, default_bert_corpus, default_corpus_documents
from libai.evaluation import MLMEvaluator
from libai.tokenizer import BertTokenizer

from bert_helpers import CONFIG, TINY, records, train_bert


def test_default_bert_corpus(tmp_path):
    paths = default_bert_corpus(cache_dir=str(tmp_path), vocab_size=2000)
    tok = BertTokenizer(vocab_file=paths["vocab_file"])
    assert tok.convert_ids_to_tokens([0, 1, 2, 3, 4]) == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    ds = MMapIndexedDataset(paths["data_prefix"])
    meta = json.load(open(paths["meta_file"]))
    docs = default_corpus_documents()
    assert len(ds.doc_idx) - 1 == len(docs) == meta["documents"]
    assert len(ds) == meta["sentences"] > 4 * len(docs)  # several sentences per topic
    sizes = np.asarray(ds.sizes)
    assert sizes.max() <= 128 and sizes.min() >= 1 and int(sizes.sum()) == meta["tokens"]
    # no piece starts inside a word (cuts are at word starts)
    vocab = tok.get_vocab()
    inner = {i for t, i in vocab.items() if t.startswith("##")}
    assert not any(int(ds[i][0]) in inner for i in range(len(ds)))
    # a sentence of the first topic decodes to its (lower-cased) text
    first = tok.decode(ds[int(ds.doc_idx[0])].tolist())
    assert first.split()[0] in docs[0].lower()
    # cached: the same entry again, another vocabulary size is another entry
    assert default_bert_corpus(cache_dir=str(tmp_path), vocab_size=2000) == paths
    assert default_bert_corpus(cache_dir=str(tmp_path), vocab_size=1000)["directory"] != paths["directory"]


def test_the_recipe_is_filled_with_the_bert_build(tmp_path, monkeypatch):
    monkeypatch.setenv("LIBAI_CACHE_DIR", str(tmp_path))
    cfg = LazyConfig.load(CONFIG)
    cfg.tokenization.default_corpus_vocab_size = 1000
    paths = apply_default_corpus(cfg)
    assert cfg.tokenization.tokenizer.vocab_file == paths["vocab_file"] and paths["vocab_file"].endswith("vocab.txt")
    assert cfg.dataloader.train.dataset[0].data_prefix == paths["data_prefix"]
    assert paths["data_prefix"].endswith("_text_sentence")
    assert apply_default_corpus(cfg) is None  # idempotent


def test_readme_command_with_short_overrides(tmp_path):
    out = str(tmp_path / "run")
    train_bert(f"train.output_dir={out}", *TINY, "train.train_iter=30", "train.log_period=5",
               "train.evaluation.eval_period=15", "train.evaluation.eval_iter=4", "train.train_micro_batch_size=8",
               "train.test_micro_batch_size=8")
    recs = records(out)
    train = [r for r in recs if "lm_loss" in r]
    assert {"total_loss", "lm_loss", "sop_loss", "sop_acc"} <= set(train[0])
    for r in train:
        assert abs(r["total_loss"] - (r["lm_loss"] + r["sop_loss"])) < 1e-3 * r["total_loss"]
        assert 0.0 <= r["sop_acc"] <= 1.0
    assert train[-1]["lm_loss"] < train[0]["lm_loss"]
    evals = [r for r in recs if any(k.endswith("MLM_Acc") for k in r)]
    assert evals, recs[-1]
    keys = set(evals[-1])
    assert {"MLM_Acc", "MLM_PPL", "SOP_Acc"} <= {k.split("/")[-1] for k in keys}
    assert os.path.isdir(os.path.join(out, "model_final")) and os.path.isdir(os.path.join(out, "model_best"))


def test_mlm_evaluator_counts_tokens():
    rng = np.random.default_rng(0)
    ev = MLMEvaluator()
    ev.reset()
    masked = correct = 0
    loss_sum = 0.0
    for n_masked in (1, 9):  # unequal batches: a per-batch mean would be wrong
        scores = rng.normal(size=(2, 6, 11)).astype(np.float32)
        labels = np.full((2, 6), -1)
        mask = np.zeros((2, 6), np.int64)
        pos = rng.choice(12, n_masked, replace=False)
        mask.reshape(-1)[pos] = 1
        labels.reshape(-1)[pos] = rng.integers(0, 11, n_masked)
        labels.reshape(-1)[pos[0]] = scores.reshape(12, 11)[pos[0]].argmax()  # at least one hit
        lp = scores - np.log(np.exp(scores).sum(-1, keepdims=True))
        picked = np.take_along_axis(lp, np.maximum(labels, 0)[..., None], -1)[..., 0]
        batch_loss = float(-(picked * mask).sum() / mask.sum())
        ns, sr = np.array([0, 1]), np.array([[2.0, 1.0], [0.0, 3.0]], np.float32)
        ev.process({"lm_labels": flow.tensor(labels), "loss_mask": flow.tensor(mask), "ns_labels": flow.tensor(ns)},
                   {"prediction_scores": flow.tensor(scores), "lm_loss": flow.tensor(batch_loss),
                    "seq_relationship_score": flow.tensor(sr)})
        masked += n_masked
        correct += int(((scores.argmax(-1) == labels) & (mask == 1)).sum())
        loss_sum += batch_loss * n_masked
    res = ev.evaluate()
    assert res["MLM_Acc"] == 100.0 * correct / masked
    assert math.isclose(res["MLM_PPL"], math.exp(loss_sum / masked), rel_tol=1e-6)  # losses pass as float32
    assert res["SOP_Acc"] == 100.0
