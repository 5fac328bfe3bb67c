"""projects/text_classification data and evaluation: GLUE/CLUE readers on files in the official
layouts, ClassificationDataset against transformers' BertTokenizerFast, ClsEvaluator's F1 and
RegEvaluator against independent references, and both evaluators on 2 MPI ranks."""
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests", "distributed")]  # `projects` lives at the repository root

from libai.evaluation import ClsEvaluator, RegEvaluator  # noqa: E402
from mpi_helper import run_mpi  # noqa: E402
from projects.text_classification.dataset import (GLUE_TASKS, ClassificationDataset, Example,  # noqa: E402
                                                  build_clue_dataset, build_glue_dataset, get_clue_task,
                                                  get_glue_task, labels_from_examples, read_json_lines)


def write(path, lines):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def tsv(*cols):
    return "\t".join(cols)


def where(path, line):
    """The start of the error message that names the file and the line."""
    return re.escape(f"{path}:{line}: ")


# ------------------------------------------------------------------------------------------ GLUE
MNLI_TRAIN_HEADER = ["index", "promptID", "pairID", "genre", "sentence1_binary_parse", "sentence2_binary_parse",
                     "sentence1_parse", "sentence2_parse", "sentence1", "sentence2", "label1", "gold_label"]
MNLI_DEV_HEADER = MNLI_TRAIN_HEADER[:11] + ["label2", "label3", "label4", "label5", "gold_label"]
STSB_HEADER = ["index", "genre", "filename", "year", "old_index", "source1", "source2", "sentence1", "sentence2",
               "score"]


def mnli_row(i, s1, s2, labels):
    return tsv(str(i), "31193", f"{i}n", "government", "( ( x ) )", "( y )", "(ROOT x)", "(ROOT y)", s1, s2, *labels)


def test_sst2_keeps_quotes_and_reads_test_file(tmp_path):
    d = tmp_path / "SST-2"
    write(d / "train.tsv", [tsv("sentence", "label"), tsv('it \'s a "charming" and often affecting journey . ', "1"),
                            tsv('"the movie is a mess', "0"), tsv("unflinchingly bleak \"\" and desperate", "0")])
    write(d / "test.tsv", [tsv("index", "sentence"), tsv("0", 'uneasy mishmash of styles and "genres" .')])
    spec = get_glue_task("SST-2")
    train = spec.read_split(d, "train")
    assert [(e.text_a, e.text_b, e.label) for e in train] == [
        ('it \'s a "charming" and often affecting journey . ', None, "1"), ('"the movie is a mess', None, "0"),
        ('unflinchingly bleak "" and desperate', None, "0")]
    assert train[0].guid == "train-2"  # the line it came from
    test = spec.read_split(d, "test")
    assert [(e.text_a, e.label) for e in test] == [('uneasy mishmash of styles and "genres" .', None)]


@pytest.mark.parametrize("name", ["sst-2", "SST-2", "sst2", "Sst_2"])
def test_task_names_in_any_spelling(name):
    assert get_glue_task(name) is GLUE_TASKS["sst-2"]
    assert get_glue_task("STS-B").regression and get_glue_task("stsb").labels is None
    assert get_clue_task("AFQMC").name == "AFQMC"
    with pytest.raises(KeyError, match="unknown GLUE task 'sst-3'"):
        get_glue_task("sst-3")


def test_cola_has_no_header_but_its_test_file_has(tmp_path):
    d = tmp_path / "CoLA"
    write(d / "dev.tsv", [tsv("gj04", "1", "", "The sailors rode the breeze clear of the rocks."),
                          tsv("gj04", "0", "*", 'The "more" we study verbs, the crazier they get get.')])
    write(d / "test.tsv", [tsv("index", "sentence"), tsv("0", "Bill whistled past the house.")])
    spec = get_glue_task("cola")
    dev = spec.read_split(d, "dev")
    assert [(e.text_a, e.label) for e in dev] == [("The sailors rode the breeze clear of the rocks.", "1"),
                                                  ('The "more" we study verbs, the crazier they get get.', "0")]
    assert [(e.text_a, e.label) for e in spec.read_split(d, "test")] == [("Bill whistled past the house.", None)]


def test_pair_tasks_by_header_name(tmp_path):
    mrpc = write(tmp_path / "MRPC" / "train.tsv", [
        tsv("Quality", "#1 ID", "#2 ID", "#1 String", "#2 String"),
        tsv("1", "702876", "702977", 'Amrozi accused his brother , whom he called " the witness " .',
            "Referring to him as only \" the witness \" , Amrozi accused his brother .")])
    qnli = write(tmp_path / "QNLI" / "dev.tsv", [tsv("index", "question", "sentence", "label"),
                                                 tsv("0", "What came into force after the new constitution?",
                                                     "As of that day, the new constitution entered into force.",
                                                     "entailment")])
    rte = write(tmp_path / "RTE" / "dev.tsv", [tsv("index", "sentence1", "sentence2", "label"),
                                               tsv("0", "Dana Reeve died.", "Christopher Reeve had an accident.",
                                                   "not_entailment")])
    qqp = write(tmp_path / "QQP" / "dev.tsv", [tsv("id", "qid1", "qid2", "question1", "question2", "is_duplicate"),
                                               tsv("201359", "303345", "303346", "Why are African-Americans so "
                                                   "beautiful?", "Why are hispanics so beautiful?", "0")])
    assert [(e.text_a[:6], e.text_b[-9:], e.label) for e in get_glue_task("mrpc").reader(str(mrpc))] == \
        [("Amrozi", "brother .", "1")]
    assert [(e.text_a[:4], e.label) for e in get_glue_task("qnli").reader(str(qnli))] == [("What", "entailment")]
    assert [(e.text_b, e.label) for e in get_glue_task("rte").reader(str(rte))] == \
        [("Christopher Reeve had an accident.", "not_entailment")]
    assert [(e.text_b, e.label) for e in get_glue_task("qqp").reader(str(qqp))] == \
        [("Why are hispanics so beautiful?", "0")]


def test_mnli_matched_and_mismatched(tmp_path):
    d = tmp_path / "MNLI"
    write(d / "train.tsv", [tsv(*MNLI_TRAIN_HEADER), mnli_row(0, "Conceptually cream skimming has two dimensions.",
                                                             "Product and geography are what make it work.",
                                                             ["neutral", "neutral"])])
    write(d / "dev_matched.tsv", [tsv(*MNLI_DEV_HEADER), mnli_row(0, 'The new rights are "nice" enough',
                                                                  "Everyone really likes the newest benefits ",
                                                                  ["neutral", "entailment", "neutral", "neutral",
                                                                   "neutral", "neutral"])])
    write(d / "dev_mismatched.tsv", [tsv(*MNLI_DEV_HEADER), mnli_row(0, "Your contribution helped make it possible.",
                                                                     "Your contributions were of no help.",
                                                                     ["contradiction"] * 6)])
    spec = get_glue_task("MNLI")
    assert spec.dev_splits == ("dev_matched", "dev_mismatched")
    assert [e.label for e in spec.read_split(d, "train")] == ["neutral"]
    matched = spec.read_split(d, "dev_matched")
    assert [(e.text_a, e.text_b, e.label) for e in matched] == [
        ('The new rights are "nice" enough', "Everyone really likes the newest benefits ", "neutral")]
    assert [e.label for e in spec.read_split(d, "dev_mismatched")] == ["contradiction"]
    with pytest.raises(ValueError, match="MNLI has no split 'dev'.*dev_matched, dev_mismatched"):
        spec.read_split(d, "dev")


def test_stsb_scores_are_floats(tmp_path):
    d = tmp_path / "STS-B"
    write(d / "dev.tsv", [tsv(*STSB_HEADER),
                          tsv("0", "main-captions", "MSRvid", "2012test", "0000", "none", "none",
                              "A man with a hard hat is dancing.", "A man wearing a hard hat is dancing.", "5.000"),
                          tsv("1", "main-captions", "MSRvid", "2012test", "0002", "none", "none",
                              'A "young" child is riding a horse.', "A child is riding a horse.", "4.750")])
    write(d / "test.tsv", [tsv(*STSB_HEADER[:-1]), tsv("0", "main-news", "headlines", "2016", "0001", "none", "none",
                                                       "Rick Santorum sues", "Santorum endorses")])
    spec = get_glue_task("sts-b")
    dev = spec.read_split(d, "dev")
    assert [(e.text_a[:7], e.label) for e in dev] == [("A man w", 5.0), ('A "youn', 4.75)]
    assert all(isinstance(e.label, float) for e in dev)
    assert spec.read_split(d, "test")[0].label is None


def test_glue_malformed_lines_name_file_and_line(tmp_path):
    sst = write(tmp_path / "sst.tsv", [tsv("sentence", "label"), tsv("good", "1"), "no tab here"])
    with pytest.raises(ValueError, match=where(sst, 3) + "1 tab-separated columns, expected 2"):
        get_glue_task("sst2").reader(str(sst))
    cola = write(tmp_path / "cola.tsv", [tsv("gj04", "1", "", "Fine."), tsv("gj04", "1", "Too few.")])
    with pytest.raises(ValueError, match=where(cola, 2) + "3 tab-separated columns, expected 4"):
        get_glue_task("cola").reader(str(cola))
    stsb = write(tmp_path / "stsb.tsv", [tsv(*STSB_HEADER), tsv(*["x"] * 9, "4.0"), tsv(*["x"] * 9, "n/a")])
    with pytest.raises(ValueError, match=where(stsb, 3) + "score 'n/a' is not a number"):
        get_glue_task("sts-b").reader(str(stsb))
    rte = write(tmp_path / "rte.tsv", [tsv("index", "sentence1", "sentence2", "label"), tsv("0", "a", "b", "yes")])
    with pytest.raises(ValueError, match=where(rte, 2) + r"label 'yes' is not one of \['entailment'"):
        get_glue_task("rte").reader(str(rte))
    mnli = write(tmp_path / "mnli.tsv", [tsv("index", "sentence1", "gold_label"), tsv("0", "a", "neutral")])
    with pytest.raises(ValueError, match=where(mnli, 1) + "no column 'sentence2'"):
        get_glue_task("mnli").reader(str(mnli))


def test_missing_file_names_task_and_path(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"QNLI train file not found: .*train\.tsv"):
        get_glue_task("qnli").read_split(tmp_path, "train")
    with pytest.raises(FileNotFoundError, match=r"OCNLI dev file not found: .*dev\.json"):
        get_clue_task("ocnli").read_split(tmp_path, "dev")


# ------------------------------------------------------------------------------------------ CLUE
def jsonl(path, objs):
    return write(path, [o if isinstance(o, str) else json.dumps(o, ensure_ascii=False) for o in objs])


def test_clue_pairs_skip_unlabelled_rows(tmp_path):
    d = tmp_path / "ocnli"
    jsonl(d / "dev.json", [
        {"sentence1": "身上裹一件工厂发的棉大衣", "sentence2": "她穿着一件棉大衣", "label": "entailment",
         "genre": "lit", "id": 0},
        {"sentence1": "我们要\"努力\"", "sentence2": "我们不努力", "label": "-", "genre": "gov", "id": 1},
        {"sentence1": "今天下雨", "sentence2": "今天没有下雨", "label": "contradiction", "genre": "news", "id": 2},
    ])
    jsonl(d / "test.json", [{"sentence1": "一月份跟二月份肯定有一个月份有", "sentence2": "肯定有一个月份有", "id": 0}])
    spec = get_clue_task("OCNLI")
    assert [(e.guid, e.text_b, e.label) for e in spec.read_split(d, "dev")] == [
        ("dev-0", "她穿着一件棉大衣", "entailment"), ("dev-2", "今天没有下雨", "contradiction")]
    assert [e.label for e in spec.read_split(d, "test")] == [None]


def test_clue_single_sentence_tasks_and_generic_reader(tmp_path):
    tnews = jsonl(tmp_path / "tnews.json", [
        {"label": "102", "label_desc": "news_entertainment", "sentence": "江疏影甜甜圈自拍", "keywords": "江疏影"},
        {"label": "110", "label_desc": "news_military", "sentence": "以色列大规模空袭", "keywords": ""}])
    assert [(e.text_a, e.text_b, e.label) for e in get_clue_task("tnews").reader(str(tnews))] == [
        ("江疏影甜甜圈自拍", None, "102"), ("以色列大规模空袭", None, "110")]
    iflytek = jsonl(tmp_path / "iflytek.json", [{"label": "11", "label_des": "休闲益智", "sentence": "一款游戏"}])
    assert get_clue_task("iflytek").reader(str(iflytek))[0].label == "11"
    afqmc = jsonl(tmp_path / "afqmc.json", [{"sentence1": "花呗如何还款", "sentence2": "花呗怎么还款", "label": "1"}])
    assert [(e.text_a, e.text_b, e.label) for e in get_clue_task("afqmc").reader(str(afqmc))] == \
        [("花呗如何还款", "花呗怎么还款", "1")]
    csl = jsonl(tmp_path / "csl.json", [{"id": 1, "abst": "摘要", "keyword": ["水声", "模型"], "label": "0"}])
    assert [(e.text_a, e.text_b) for e in get_clue_task("csl").reader(str(csl))] == [("水声 模型", "摘要")]
    generic = jsonl(tmp_path / "any.json", [{"q": "a", "cls": "z"}, {"q": "b", "cls": "x"}, {"q": "c", "cls": "z"}])
    examples = read_json_lines(str(generic), "q", label_key="cls")
    assert [e.label for e in examples] == ["z", "x", "z"] and labels_from_examples(examples) == ["x", "z"]
    assert labels_from_examples([Example("a", "t", label=lab) for lab in ("110", "102", "9", "110")]) == \
        ["9", "102", "110"]


def test_clue_malformed_lines_name_file_and_line(tmp_path):
    ok = {"sentence1": "a", "sentence2": "b", "label": "1"}
    bad_json = jsonl(tmp_path / "bad_json.json", [ok, ok, '{"sentence1": "a", "sentence2": '])
    with pytest.raises(ValueError, match=where(bad_json, 3) + "invalid JSON"):
        get_clue_task("afqmc").reader(str(bad_json))
    no_key = jsonl(tmp_path / "no_key.json", [ok, {"sentence1": "a", "label": "0"}])
    with pytest.raises(ValueError, match=where(no_key, 2) + "missing key 'sentence2'"):
        get_clue_task("afqmc").reader(str(no_key))
    no_label = jsonl(tmp_path / "no_label.json", [ok, "", {"sentence1": "a", "sentence2": "b"}])
    with pytest.raises(ValueError, match=where(no_label, 3) + "missing key 'label'"):
        get_clue_task("afqmc").reader(str(no_label))
    bad_label = jsonl(tmp_path / "bad_label.json", [{"sentence1": "a", "sentence2": "b", "label": "maybe"}])
    with pytest.raises(ValueError, match=where(bad_label, 1) + "label 'maybe' is not one of"):
        get_clue_task("cmnli").reader(str(bad_label))


# -------------------------------------------------------------------------------- the dataset
PAIRS = [("The quick brown fox jumps over the lazy dog.", 'A "quick" dog sleeps.'),
         ("Hello world!", "unbelievably long words get split into wordpieces " * 4),
         ("short", "")]


@pytest.fixture(scope="module")
def vocab_file(tmp_path_factory):
    from libai.tokenizer import train_wordpiece_tokenizer

    texts = [a + " " + b for a, b in PAIRS] * 2 + ["the fox is brown and the dog is lazy"]
    out = tmp_path_factory.mktemp("wordpiece")
    return train_wordpiece_tokenizer(texts, 150, str(out), min_frequency=1)["vocab_file"]


def reference(vocab_file, texts, pairs, max_len):
    from transformers import BertTokenizerFast

    hf = BertTokenizerFast(vocab=vocab_file)  # transformers 5 ignores `vocab_file=`
    return hf(texts, pairs, truncation=True, max_length=max_len, padding="max_length", return_tensors="np")


def field(ds, i, name):
    return getattr(ds[i], name).tensor.numpy()


def test_dataset_pairs_match_bert_tokenizer_fast(vocab_file):
    from libai.tokenizer import BertTokenizer

    examples = [Example(f"g{i}", a, b, lab) for i, ((a, b), lab) in enumerate(zip(PAIRS, ["neutral", "entailment",
                                                                                           "contradiction"]))]
    ds = ClassificationDataset(examples, BertTokenizer(vocab_file=vocab_file), max_seq_length=16,
                               label_list=["contradiction", "entailment", "neutral"])
    want = reference(vocab_file, [a for a, _ in PAIRS], [b for _, b in PAIRS], 16)
    assert len(ds) == 3
    for i in range(3):
        assert np.array_equal(field(ds, i, "input_ids"), want["input_ids"][i])
        assert np.array_equal(field(ds, i, "tokentype_ids"), want["token_type_ids"][i])
        assert np.array_equal(field(ds, i, "attention_mask"), want["attention_mask"][i])
        assert field(ds, i, "input_ids").dtype == np.int64
    assert want["attention_mask"][2].sum() < 16 and want["token_type_ids"][1].sum() > 0  # padded; pairs
    assert [int(field(ds, i, "labels")) for i in range(3)] == [2, 1, 0]
    assert ds[0].labels.placement_idx == -1 and ds[0].input_ids.placement_idx == 0
    assert ds[0].labels.tensor.numpy().dtype == np.int64 and ds[0].labels.tensor.shape == ()


def test_dataset_single_sentences_and_regression(vocab_file):
    from libai.tokenizer import BertTokenizer

    tok = BertTokenizer(vocab_file=vocab_file)
    texts = [a for a, _ in PAIRS] + [PAIRS[1][1]]
    ds = ClassificationDataset([Example(str(i), t, None, 0.5 * i) for i, t in enumerate(texts)], tok,
                               max_seq_length=12, regression=True)
    want = reference(vocab_file, texts, None, 12)
    for i in range(len(texts)):
        assert np.array_equal(field(ds, i, "input_ids"), want["input_ids"][i])
        assert not field(ds, i, "tokentype_ids").any()
        assert np.array_equal(field(ds, i, "attention_mask"), want["attention_mask"][i])
    labels = [field(ds, i, "labels") for i in range(len(texts))]
    assert all(x.dtype == np.float32 for x in labels) and [float(x) for x in labels] == [0.0, 0.5, 1.0, 1.5]


def test_dataset_label_errors(vocab_file):
    from libai.tokenizer import BertTokenizer

    tok = BertTokenizer(vocab_file=vocab_file)
    with pytest.raises(ValueError, match="example b has no label"):
        ClassificationDataset([Example("a", "x", label="1"), Example("b", "y")], tok, 8, label_list=["0", "1"])
    with pytest.raises(ValueError, match="example a has label '2', not one of"):
        ClassificationDataset([Example("a", "x", label="2")], tok, 8, label_list=["0", "1"])
    with pytest.raises(ValueError, match="neither label_list nor regression"):
        ClassificationDataset([Example("a", "x", label="2")], tok, 8)
    with pytest.raises(ValueError, match="mix sentence pairs and single sentences"):
        ClassificationDataset([Example("a", "x", "y", "1"), Example("b", "x", None, "1")], tok, 8, ["0", "1"])


def test_builders_read_splits_with_lazy_tokenizer(tmp_path, vocab_file):
    from libai.config import LazyCall
    from libai.tokenizer import BertTokenizer

    d = tmp_path / "RTE"
    write(d / "dev.tsv", [tsv("index", "sentence1", "sentence2", "label"),
                          tsv("0", *PAIRS[0], "entailment"), tsv("1", *PAIRS[1], "not_entailment")])
    write(d / "test.tsv", [tsv("index", "sentence1", "sentence2"), tsv("0", *PAIRS[2])])
    lazy = LazyCall(BertTokenizer)(vocab_file=vocab_file)
    dev = build_glue_dataset("rte", d, "dev", lazy, max_seq_length=20)
    assert len(dev) == 2 and [int(field(dev, i, "labels")) for i in range(2)] == [0, 1]
    want = reference(vocab_file, [PAIRS[1][0]], [PAIRS[1][1]], 20)
    assert np.array_equal(field(dev, 1, "input_ids"), want["input_ids"][0])
    test = build_glue_dataset("RTE", d, "test", BertTokenizer(vocab_file=vocab_file), max_seq_length=20)
    assert test.labels is None and not test[0].has("labels")
    c = tmp_path / "afqmc"
    jsonl(c / "train.json", [{"sentence1": a, "sentence2": b, "label": str(i % 2)} for i, (a, b) in enumerate(PAIRS)])
    train = build_clue_dataset("AFQMC", c, "train", lazy, max_seq_length=20)
    assert [int(field(train, i, "labels")) for i in range(3)] == [0, 1, 0]


# -------------------------------------------------------------------------------- evaluators
def f1_reference(y_true, y_pred, average):
    """F1 by definition, class by class (percent); macro over the classes present in either."""
    def f1(c):
        tp = sum(t == c and p == c for t, p in zip(y_true, y_pred))
        fp = sum(t != c and p == c for t, p in zip(y_true, y_pred))
        fn = sum(t == c and p != c for t, p in zip(y_true, y_pred))
        precision = tp / (tp + fp) if tp + fp else 0.0
        recall = tp / (tp + fn) if tp + fn else 0.0
        return 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    if average == "binary":
        return 100 * f1(1)
    classes = sorted(set(y_true) | set(y_pred))
    return 100 * sum(f1(c) for c in classes) / len(classes)


def run_cls(evaluator, scores, labels, batch=7):
    evaluator.reset()
    for s in range(0, len(labels), batch):
        evaluator.process({"labels": labels[s:s + batch]}, {"prediction_scores": scores[s:s + batch]})
    return evaluator.evaluate()


@pytest.mark.parametrize("num_classes,average", [(2, "binary"), (2, "macro"), (5, "macro")])
def test_cls_evaluator_f1(num_classes, average):
    rng = np.random.default_rng(num_classes)
    scores = rng.normal(size=(40, num_classes)).astype(np.float32)
    labels = rng.integers(0, num_classes - (num_classes > 2), size=40)  # with 5 classes the last never occurs
    pred = scores.argmax(1)
    if num_classes > 2:
        scores[pred == num_classes - 1, num_classes - 1] = -9  # ... nor is it predicted: left out of macro
        pred = scores.argmax(1)
    res = run_cls(ClsEvaluator(topk=(1, 3), f1=average), scores, labels)
    assert list(res) == ["Acc@1", "Acc@3", "F1"]
    assert res["F1"] == pytest.approx(f1_reference(labels.tolist(), pred.tolist(), average))
    assert res["Acc@1"] == pytest.approx(100 * (pred == labels).mean())
    if num_classes == 2:
        assert res["Acc@3"] == 100.0  # k above the class count: every sample hits


def test_cls_evaluator_without_f1_is_unchanged():
    scores = np.array([[0.1, 0.9], [0.8, 0.2], [0.3, 0.7]])
    res = run_cls(ClsEvaluator(topk=(1,)), scores, np.array([1, 1, 0]))
    assert dict(res) == {"Acc@1": pytest.approx(100 / 3)}
    assert run_cls(ClsEvaluator(topk=(1,), f1="binary"), scores, np.array([0, 0, 0]))["F1"] == 0.0  # no positive
    with pytest.raises(ValueError, match="f1 must be None, 'binary' or 'macro'"):
        ClsEvaluator(f1="micro")


def correlation_reference(x, y):
    from scipy.stats import pearsonr, spearmanr

    return 100 * pearsonr(x, y)[0], 100 * spearmanr(x, y)[0]


@pytest.mark.parametrize("shape", ["flat", "column"])
def test_reg_evaluator_against_scipy_with_ties(shape):
    rng = np.random.default_rng(1)
    gold = np.round(rng.uniform(0, 5, size=50) * 4) / 4  # STS-B-like: many ties
    preds = np.round(gold + rng.normal(scale=1.0, size=50), 1).astype(np.float32)
    preds[:6] = preds[6]  # a long run of tied predictions
    ev = RegEvaluator()
    for s in range(0, 50, 16):
        p = preds[s:s + 16]
        ev.process({"labels": gold[s:s + 16]}, {"prediction_scores": p[:, None] if shape == "column" else p})
    res = ev.evaluate()
    assert list(res) == ["Pearson", "Spearman"]
    want = correlation_reference(preds.astype(np.float64), gold)
    assert res["Pearson"] == pytest.approx(want[0], rel=1e-6) and res["Spearman"] == pytest.approx(want[1], rel=1e-9)
    ev.reset()
    with pytest.raises(ValueError, match=r"shape \[batch\] or \[batch, 1\], got \(2, 3\)"):
        ev.process({"labels": np.zeros(2)}, {"prediction_scores": np.zeros((2, 3))})


def test_evaluators_agree_on_two_mpi_ranks():
    script = os.path.join(HERE, "scripts", "evaluators_dist.py")
    one = subprocess.run([sys.executable, script], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": ROOT})
    assert one.returncode == 0, one.stdout + one.stderr
    rc, out, err = run_mpi(2, script, timeout=180)

    def results(text):
        return [json.loads(line[len("RESULT "):]) for line in text.splitlines() if line.startswith("RESULT ")]

    single, multi = results(one.stdout), results(out)
    assert len(single) == len(multi) == 2 and [r["world"] for r in multi] == [2, 2], out + err
    for a, b in zip(single, multi):
        for name in ("macro", "binary", "reg"):
            assert a[name] == pytest.approx(b[name], rel=1e-12), (name, a, b)
