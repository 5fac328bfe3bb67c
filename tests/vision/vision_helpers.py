"""Shared by tests/vision: the image recipes run through tools/train_net.py (tests/gpt2's runner,
one process or N ranks through the launcher)."""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests", "gpt2"))

from gpt2_helpers import losses, records, rel_err, train_net  # noqa: E402,F401

VIT_CONFIG = os.path.join(ROOT, "configs", "vit_imagenet.py")

# dropout and stochastic depth off so that layouts can be compared; heads and MLP divisible by tp=2
VIT_TINY = ["model.embed_dim=48", "model.depth=2", "model.num_heads=4", "model.drop_path_rate=0.0",
            "model.drop_rate=0.0", "model.attn_drop_rate=0.0"]


def train_vit(*args, nprocs=1, timeout=300):
    return train_net(*args, nprocs=nprocs, timeout=timeout, config=VIT_CONFIG)

SWIN_CONFIG = os.path.join(ROOT, "configs", "swin_imagenet.py")
SWIN_NO_DROP = ["model.drop_path_rate=0.0", "model.drop_rate=0.0", "model.attn_drop_rate=0.0"]


def train_swin(*args, nprocs=1, timeout=300):
    return train_net(*args, nprocs=nprocs, timeout=timeout, config=SWIN_CONFIG)
