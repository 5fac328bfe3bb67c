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


LAYOUT_BASE = ["train.train_iter=10", "train.log_period=1", "train.train_micro_batch_size=null",
               "train.global_batch_size=8", "train.num_accumulation_steps=1", "train.evaluation.enabled=False",
               "train.checkpointer.period=0"]


def check_layout_parity(train, model_args, tmp_path, name):
    """10 iterations of `train` (train_vit / train_swin) with `model_args` in one process and under
    dp=2, tp=2 and dp=2 x tp=2 (the same global batch of 8): every logged loss within 1e-5
    relative of the single process's. Returns the worst relative error per layout."""
    base = [*model_args, *LAYOUT_BASE]
    ref_out = str(tmp_path / "single")
    train(f"train.output_dir={ref_out}", *base)
    ref = losses(ref_out)
    assert sorted(ref) == list(range(10))
    worst = {}
    for dp, tp in [(2, 1), (1, 2), (2, 2)]:
        out = str(tmp_path / f"dp{dp}_tp{tp}")
        train(f"train.output_dir={out}", *base, f"train.dist.data_parallel_size={dp}",
              f"train.dist.tensor_parallel_size={tp}", nprocs=dp * tp)
        got = losses(out)
        assert sorted(got) == list(range(10))
        errs = [rel_err(got[i], ref[i]) for i in range(10)]
        worst[(dp, tp)] = max(errs)
        assert max(errs) < 1e-5, (dp, tp, errs)
    print(f"{name} layout parity, max relative loss error vs 1 process:",
          {f"dp={d} tp={t}": f"{e:.2e}" for (d, t), e in worst.items()})
    return worst
