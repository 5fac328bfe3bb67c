"""Shared by tests/graph: the recipes shrunk for CI, run eagerly and in graph mode."""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests", "gpt2"))

from gpt2_helpers import losses, records, train_net  # noqa: E402,F401

CONFIGS = {name: os.path.join(ROOT, "configs", f"{name}.py")
           for name in ("gpt2_pretrain", "bert_pretrain", "vit_imagenet", "swin_imagenet")}

# small models with their dropout (and stochastic depth) on: graph replays draw fresh masks
SMALL = {
    "gpt2_pretrain": ["model.cfg.hidden_layers=2", "model.cfg.hidden_size=64", "model.cfg.ffn_hidden_size=256",
                      "model.cfg.num_attention_heads=4", "model.cfg.max_seq_length=32"],
    "bert_pretrain": ["model.cfg.hidden_layers=2", "model.cfg.hidden_size=64", "model.cfg.intermediate_size=256",
                      "model.cfg.num_attention_heads=4", "model.cfg.max_position_embeddings=32"],
    "vit_imagenet": ["model.embed_dim=48", "model.depth=2", "model.num_heads=4", "model.drop_path_rate=0.1",
                     "model.drop_rate=0.1", "model.attn_drop_rate=0.1"],
    "swin_imagenet": ["model.drop_path_rate=0.1", "model.drop_rate=0.1", "model.attn_drop_rate=0.1"],
}
NO_DROPOUT = {
    "gpt2_pretrain": ["model.cfg.embedding_dropout_prob=0.0", "model.cfg.attention_dropout_prob=0.0",
                      "model.cfg.output_dropout_prob=0.0"],
    "bert_pretrain": ["model.cfg.hidden_dropout_prob=0.0", "model.cfg.attention_probs_dropout_prob=0.0"],
    "vit_imagenet": ["model.drop_path_rate=0.0", "model.drop_rate=0.0", "model.attn_drop_rate=0.0"],
    "swin_imagenet": ["model.drop_path_rate=0.0", "model.drop_rate=0.0", "model.attn_drop_rate=0.0"],
}
BASE = ["train.log_period=1", "train.train_micro_batch_size=null", "train.global_batch_size=8",
        "train.evaluation.enabled=False", "train.checkpointer.period=0"]


def run(out, name, *args, iters=20, nprocs=1, timeout=600):
    """`iters` iterations of recipe `name` into `out`; its logged {iteration: total_loss}."""
    train_net(f"train.output_dir={out}", f"train.train_iter={iters}", *BASE, *SMALL[name], *args,
              nprocs=nprocs, timeout=timeout, config=CONFIGS[name])
    got = losses(out)
    assert sorted(got) == list(range(iters)), got
    return got
