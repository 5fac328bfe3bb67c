"""Shared by tests/bert: the BERT recipe shrunk for CI, run through tools/train_net.py (tests/gpt2's
runner, one process or N ranks through the launcher)."""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests", "gpt2"))

from gpt2_helpers import losses, records, rel_err, train_net  # noqa: E402,F401

CONFIG = os.path.join(ROOT, "configs", "bert_pretrain.py")

# dropout off so that layouts and resumes can be compared
TINY = ["model.cfg.hidden_layers=2", "model.cfg.hidden_size=64", "model.cfg.intermediate_size=256",
        "model.cfg.num_attention_heads=4", "model.cfg.max_position_embeddings=32",
        "model.cfg.hidden_dropout_prob=0.0", "model.cfg.attention_probs_dropout_prob=0.0"]


def train_bert(*args, nprocs=1, timeout=240):
    return train_net(*args, nprocs=nprocs, timeout=timeout, config=CONFIG)
