"""projects/text_classification fails when a dataset is built, naming the file or the config keys:

* a train or dev file without its label column / key (a misspelt GLUE header, a CLUE file without
  "label", an unlabelled test file used as dev) is refused by the readers with `<path>:<line>:`,
  where it used to give an unlabelled dataset that crashed in backward (train) or in
  ClsEvaluator.process after the whole training (dev). Test splits may still be unlabelled.
* task.max_seq_length above the model's model.cfg.max_position_embeddings is refused when the
  datasets are built (it used to fail at the first step naming no key); the pydoc topics config
  sets its sequence length once, as task.max_seq_length, like the GLUE/CLUE configs.
"""
import json
import os
import re
import sys

import pytest
from omegaconf import OmegaConf

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path[:0] = [ROOT]  # `projects` lives at the repository root

from libai.config import LazyConfig  # noqa: E402
from libai.engine import DefaultTrainer  # noqa: E402
from projects.text_classification.dataset import (build_clue_dataset, build_glue_dataset,  # noqa: E402
                                                  get_clue_task, get_glue_task)
from projects.text_classification.dataset.pydoc_topics import build_topic_dataset  # noqa: E402

CONFIGS = os.path.join(ROOT, "projects", "text_classification", "configs")
NOT_A_TOKENIZER = object()  # the readers refuse the file before anything is tokenized


def write(path, lines):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def where(path, line):
    return re.escape(f"{path}:{line}: ")


# ----------------------------------------------------------------------------- labels: GLUE
@pytest.mark.parametrize("split", ["train", "dev"])
def test_glue_label_column_misspelt(tmp_path, split):
    path = write(tmp_path / f"{split}.tsv", ["sentence\tLabel", "a fine film\t1", "a dull film\t0"])
    with pytest.raises(ValueError, match=where(path, 1) + r"no label column 'label' in the header "
                                         r"\['sentence', 'Label'\]"):
        get_glue_task("sst-2").read_split(tmp_path, split)
    with pytest.raises(ValueError, match=where(path, 1) + "no label column 'label'"):
        build_glue_dataset("sst-2", tmp_path, split, NOT_A_TOKENIZER)


def test_glue_unlabelled_test_file_as_dev(tmp_path):
    """MNLI's dev_matched.tsv replaced by its test file (no gold_label column); STS-B's dev by
    its test file (no score)."""
    mnli = write(tmp_path / "MNLI" / "dev_matched.tsv", ["index\tsentence1\tsentence2", "0\ta\tb"])
    with pytest.raises(ValueError, match=where(mnli, 1) + "no label column 'gold_label'"):
        get_glue_task("mnli").read_split(tmp_path / "MNLI", "dev_matched")
    stsb = write(tmp_path / "STS-B" / "dev.tsv", ["index\tsentence1\tsentence2", "0\ta\tb"])
    with pytest.raises(ValueError, match=where(stsb, 1) + "no label column 'score'"):
        get_glue_task("sts-b").read_split(tmp_path / "STS-B", "dev")


def test_cola_train_file_with_the_test_header(tmp_path):
    path = write(tmp_path / "train.tsv", ["index\tsentence", "0\tBill whistled past the house."])
    with pytest.raises(ValueError, match=where(path, 1) + "no label column"):
        get_glue_task("cola").read_split(tmp_path, "train")
    assert [e.label for e in get_glue_task("cola").reader(str(path))] == [None]  # as a test file


def test_test_splits_may_stay_unlabelled(tmp_path):
    write(tmp_path / "test.tsv", ["index\tsentence", "0\tan unlabelled sentence"])
    assert [e.label for e in get_glue_task("sst-2").read_split(tmp_path, "test")] == [None]
    write(tmp_path / "test_matched.tsv", ["index\tsentence1\tsentence2", "0\ta\tb"])
    assert [e.label for e in get_glue_task("mnli").read_split(tmp_path, "test_matched")] == [None]
    write(tmp_path / "test.json", [json.dumps({"sentence1": "a", "sentence2": "b", "id": 0})])
    assert [e.label for e in get_clue_task("afqmc").read_split(tmp_path, "test")] == [None]


# ----------------------------------------------------------------------------- labels: CLUE
@pytest.mark.parametrize("split", ["train", "dev"])
def test_clue_file_without_label_key(tmp_path, split):
    path = write(tmp_path / f"{split}.json", [json.dumps({"sentence1": "a", "sentence2": "b", "id": i})
                                              for i in range(2)])
    with pytest.raises(ValueError, match=where(path, 1) + "missing key 'label'"):
        get_clue_task("afqmc").read_split(tmp_path, split)
    with pytest.raises(ValueError, match=where(path, 1) + "missing key 'label'"):
        build_clue_dataset("afqmc", tmp_path, split, NOT_A_TOKENIZER)


def test_pydoc_topics_file_without_label_key(tmp_path):
    path = write(tmp_path / "train.json", [json.dumps({"sentence": "The debugger stops here."})])
    with pytest.raises(ValueError, match=where(path, 1) + "missing key 'label'"):
        build_topic_dataset("train", NOT_A_TOKENIZER, data_dir=str(tmp_path))


# ------------------------------------------------------------------- max_seq_length vs the model
def test_pydoc_topics_sets_its_sequence_length_once():
    cfg = LazyConfig.load(os.path.join(CONFIGS, "pydoc_topics.py"))
    assert cfg.task.max_seq_length == 64
    raw = OmegaConf.to_container(cfg.dataloader, resolve=False)
    assert [raw["train"]["dataset"][0]["max_seq_length"], raw["test"][0]["dataset"]["max_seq_length"]] == \
        ["${task.max_seq_length}"] * 2
    cfg.task.max_seq_length = 40
    assert [cfg.dataloader.train.dataset[0].max_seq_length, cfg.dataloader.test[0].dataset.max_seq_length] == [40, 40]


@pytest.mark.parametrize("config", ["pydoc_topics.py", "glue_sst2.py", "glue_mnli.py", "clue_afqmc.py"])
def test_max_seq_length_longer_than_the_model_names_both_keys(config):
    cfg = LazyConfig.load(os.path.join(CONFIGS, config))
    cfg.model.cfg.max_position_embeddings = 32
    for build in (DefaultTrainer.build_train_loader, DefaultTrainer.build_test_loader):
        with pytest.raises(Exception) as e:  # before anything is read or tokenized
            build(cfg)
        msg = str(e.value)
        assert "task.max_seq_length" in msg and "model.cfg.max_position_embeddings" in msg, msg
        assert re.search(r"\b(64|128)\b", msg) and re.search(r"\b32\b", msg), msg


def test_max_seq_length_within_the_model_or_a_huggingface_model_is_not_refused(tmp_path):
    """Equal lengths pass the check (the data is read next: here, none); with model.cfg=null
    (a HuggingFace folder) the positions are the folder's and nothing is checked here."""
    for hf in (False, True):
        cfg = LazyConfig.load(os.path.join(CONFIGS, "glue_sst2.py"))
        cfg.task.data_dir = str(tmp_path / "absent")
        if hf:
            cfg.model.cfg = None
        else:
            cfg.model.cfg.max_position_embeddings = 128
        with pytest.raises(Exception, match="SST-2 train file not found"):
            DefaultTrainer.build_train_loader(cfg)


def test_direct_call_checks_the_model_positions(tmp_path):
    with pytest.raises(ValueError, match=r"max_seq_length 128 .*task\.max_seq_length.* exceeds .*"
                                         r"max_position_embeddings 64 .*model\.cfg\.max_position_embeddings"):
        build_glue_dataset("sst-2", tmp_path, "train", NOT_A_TOKENIZER, max_seq_length=128,
                           max_position_embeddings=64)
