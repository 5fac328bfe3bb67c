"""Every task config of projects/text_classification runs through tools/train_net.py on small
files in the official layouts (a tiny model, a few iterations): the right evaluator and metrics,
MNLI's two dev sets, STS-B as regression, CLUE's F1, and fine-tuning from a HuggingFace folder."""
import json
import os
import sys

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests", "gpt2"), os.path.join(ROOT, "tests", "models")]

from gpt2_helpers import records, train_net  # noqa: E402

CONFIGS = os.path.join(ROOT, "projects", "text_classification", "configs")
TINY = ["model.cfg.hidden_layers=1", "model.cfg.hidden_size=32", "model.cfg.intermediate_size=64",
        "model.cfg.num_attention_heads=2", "model.cfg.max_position_embeddings=64",
        "train.train_iter=4", "train.train_micro_batch_size=4", "train.test_micro_batch_size=4",
        "train.evaluation.eval_period=4", "train.log_period=1", "task.max_seq_length=64"]
SENTENCES = ["the statement is executed once .", "a loop runs the body again", "names are bound in blocks",
             "the value is returned to the caller", "an exception ends the block", "it is an error"]


def write(path, lines):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")


def glue_files(root, task, n=8):
    """`n` rows per split of `task` in GLUE's layout under root/task."""
    rng = np.random.default_rng(0)
    d = root / task
    for split in (("train", "dev_matched", "dev_mismatched") if task == "MNLI" else ("train", "dev")):
        rows = []
        for i in range(n):
            a, b = SENTENCES[i % 6], SENTENCES[(i + 1) % 6]
            if task == "SST-2":
                rows.append(f"{a}\t{i % 2}")
            elif task == "MNLI":
                label = ("contradiction", "entailment", "neutral")[i % 3]
                rows.append("\t".join([str(i), "0", "0", "genre", "-", "-", "-", "-", a, b, label, label]))
            else:  # STS-B
                rows.append("\t".join([str(i), "g", "f", "y", str(i), "0", a, b, f"{rng.uniform(0, 5):.3f}"]))
        header = {"SST-2": "sentence\tlabel",
                  "MNLI": "index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\t"
                          "sentence1_parse\tsentence2_parse\tsentence1\tsentence2\tlabel1\tgold_label",
                  "STS-B": "index\tgenre\tfilename\tyear\told_index\tsource1\tsentence1\tsentence2\tscore"}[task]
        write(d / f"{split}.tsv", [header, *rows])
    return str(d)


def run(tmp_path, config, *args):
    out = str(tmp_path / "out")
    train_net(f"train.output_dir={out}", *TINY, *args, config=os.path.join(CONFIGS, config))
    return records(out)


def final_metrics(recs):
    return {k: v for r in recs for k, v in r.items() if "/" in k or k in ("Acc@1", "F1", "Pearson", "Spearman")}


def test_sst2(tmp_path):
    metrics = final_metrics(run(tmp_path, "glue_sst2.py", f"task.data_dir={glue_files(tmp_path, 'SST-2')}"))
    assert any(k.endswith("Acc@1") for k in metrics), metrics


def test_mnli_reports_both_dev_sets(tmp_path):
    metrics = final_metrics(run(tmp_path, "glue_mnli.py", f"task.data_dir={glue_files(tmp_path, 'MNLI')}"))
    assert len([k for k in metrics if k.endswith("Acc@1")]) == 2, metrics


def test_stsb_is_regression(tmp_path):
    recs = run(tmp_path, "glue_stsb.py", f"task.data_dir={glue_files(tmp_path, 'STS-B')}")
    metrics = final_metrics(recs)
    assert any(k.endswith("Pearson") for k in metrics) and any(k.endswith("Spearman") for k in metrics), metrics
    assert all(np.isfinite(r["loss"]) for r in recs if "loss" in r)


def test_clue_afqmc_accuracy_and_f1(tmp_path):
    d = tmp_path / "afqmc"
    for split in ("train", "dev"):
        write(d / f"{split}.json", [json.dumps({"sentence1": SENTENCES[i % 6], "sentence2": SENTENCES[(i + 2) % 6],
                                                "label": str(i % 2)}, ensure_ascii=False) for i in range(8)])
    metrics = final_metrics(run(tmp_path, "clue_afqmc.py", f"task.data_dir={d}"))
    assert any(k.endswith("F1") for k in metrics) and any(k.endswith("Acc@1") for k in metrics), metrics


def test_fine_tune_from_a_huggingface_folder(tmp_path):
    """model.cfg=null model.hf_path=FOLDER with the folder's vocab.txt: the HF weights load (the
    trainer leaves the vocabulary alone) and the classifier trains."""
    from test_bert_hf_parity import make_hf

    hf_dir = tmp_path / "hf"
    make_hf(hf_dir, "BertModel", hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
            max_position_embeddings=64)
    words = sorted({w for s in SENTENCES for w in s.split()})
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words]
    vocab += [f"[unused{i}]" for i in range(100 - len(vocab))]
    (hf_dir / "vocab.txt").write_text("\n".join(vocab) + "\n")
    recs = run(tmp_path, "glue_sst2.py", f"task.data_dir={glue_files(tmp_path, 'SST-2')}", "model.cfg=null",
               f"model.hf_path={hf_dir}", f"tokenization.tokenizer.vocab_file={hf_dir / 'vocab.txt'}")
    assert any(k.endswith("Acc@1") for k in final_metrics(recs))
    log = open(os.path.join(str(tmp_path / "out"), "log.txt")).read()
    assert "classifier is newly initialised" in log


def test_build_classifier_needs_one_source():
    from projects.text_classification.modeling import build_classifier

    with pytest.raises(ValueError, match="exactly one of cfg"):
        build_classifier()
