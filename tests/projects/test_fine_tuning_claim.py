"""The project README's commands, as written: pretrain with configs/bert_pretrain.py, then
fine-tune on the embedded default task (pydoc topics, 4 classes) from that checkpoint and, for the
comparison, from scratch with the same config and steps (60, about 8 epochs). The pretrained
model must be far above chance (25%) and above the model trained from scratch."""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests", "gpt2")]

from gpt2_helpers import records, train_net  # noqa: E402
from projects.text_classification.dataset import read_json_lines  # noqa: E402
from projects.text_classification.dataset.pydoc_topics import (  # noqa: E402
    DEV_PER_TOPIC, TOPICS, TRAIN_PER_TOPIC, build_topic_files, topic_examples,
)

PRETRAIN = os.path.join(ROOT, "configs", "bert_pretrain.py")
TOPICS_CONFIG = os.path.join(ROOT, "projects", "text_classification", "configs", "pydoc_topics.py")


def test_pydoc_topics_data(tmp_path):
    from pydoc_data.topics import topics

    examples = topic_examples()
    for split, n in (("train", TRAIN_PER_TOPIC), ("dev", DEV_PER_TOPIC)):
        assert sorted(t for _, t in examples[split]) == sorted(list(TOPICS) * n)  # balanced
    for sentence, topic in examples["train"] + examples["dev"]:
        assert " ".join(sentence.split()) in " ".join(topics[topic].split())  # from its topic
        assert sum(" ".join(sentence.split()) in " ".join(topics[t].split()) for t in TOPICS) == 1  # and no other
    assert not {s for s, _ in examples["train"]} & {s for s, _ in examples["dev"]}
    directory = build_topic_files(cache_dir=str(tmp_path))
    read = read_json_lines(os.path.join(directory, "dev.json"), "sentence", label_list=TOPICS)
    assert [(e.text_a, e.label) for e in read] == examples["dev"]


def final_accuracy(out):
    accs = [r[k] for r in records(out) for k in r if k.endswith("Acc@1")]
    assert accs, f"no accuracy in {out}/metrics.json"
    return accs[-1]


def test_fine_tuning_the_pretrained_bert_beats_chance_and_scratch(tmp_path):
    pre = str(tmp_path / "bert_pretrain")
    train_net(f"train.output_dir={pre}", "train.evaluation.enabled=False", config=PRETRAIN, timeout=1800)
    fine = str(tmp_path / "fine_tuned")
    train_net(f"train.output_dir={fine}", f"train.load_weight={pre}/model_final", config=TOPICS_CONFIG, timeout=900)
    scratch = str(tmp_path / "scratch")
    train_net(f"train.output_dir={scratch}", config=TOPICS_CONFIG, timeout=900)
    acc_fine, acc_scratch = final_accuracy(fine), final_accuracy(scratch)
    print(f"pydoc topics, dev accuracy: fine-tuned {acc_fine:.1f}%, from scratch {acc_scratch:.1f}% (chance 25%)")
    assert acc_fine >= 45.0  # chance + 20 points
    assert acc_fine >= acc_scratch + 5.0
