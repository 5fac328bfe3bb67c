"""train.activation_checkpoint.enabled through tools/train_net.py: with dropout on and the same
seed, the GPT-2 recipe logs exactly the losses it logs without it, in one process and under
tp=2 x pp=2 (global tensors and the pipeline schedule); ViT (TransformerLayer) and Swin
(SwinBlock) too; a model with no recomputable layer is refused by name."""
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "gpt2"))

from gpt2_helpers import losses, train_net  # noqa: E402

# the tiny GPT-2 with the recipe's dropout (0.1) left on
GPT = ["model.cfg.hidden_layers=2", "model.cfg.hidden_size=64", "model.cfg.ffn_hidden_size=256",
       "model.cfg.num_attention_heads=4", "model.cfg.max_seq_length=32"]
BASE = ["train.train_iter=6", "train.log_period=1", "train.train_micro_batch_size=null", "train.global_batch_size=8",
        "train.num_accumulation_steps=2", "train.evaluation.enabled=False", "train.checkpointer.period=0"]


def run_both(tmp_path, *args, nprocs=1, config=None):
    got = []
    for on in (False, True):
        out = str(tmp_path / f"ckpt_{on}")
        extra = {"config": config} if config else {}
        _, stdout, stderr = train_net(f"train.output_dir={out}", *BASE, *args,
                                      f"train.activation_checkpoint.enabled={on}", nprocs=nprocs, **extra)
        if on:
            assert "layers recompute their forward in backward" in stdout + stderr
        got.append(losses(out))
    assert sorted(got[0]) == list(range(6))
    assert got[0] == got[1]  # bit for bit: the recomputation draws the same dropout masks


def test_gpt2_one_process(tmp_path):
    run_both(tmp_path, *GPT, "tokenization.make_vocab_size_divisible_by=256")


def test_gpt2_tensor_and_pipeline_parallel(tmp_path):
    run_both(tmp_path, *GPT, "tokenization.make_vocab_size_divisible_by=128", "train.dist.tensor_parallel_size=2",
             "train.dist.pipeline_parallel_size=2", nprocs=4)


@pytest.mark.parametrize("recipe,args", [
    ("vit_imagenet.py", ["model.embed_dim=48", "model.depth=2", "model.num_heads=4", "model.drop_rate=0.1",
                         "model.drop_path_rate=0.1"]),
    ("swin_imagenet.py", ["model.drop_rate=0.1"])], ids=["vit", "swin"])
def test_vision(tmp_path, recipe, args):
    run_both(tmp_path, *args, config=os.path.join(ROOT, "configs", recipe))


def test_a_model_without_recomputable_layers_is_refused(tmp_path):
    rc, out, err = train_net(f"train.output_dir={tmp_path / 'mlp'}", "train.train_iter=1",
                             "train.activation_checkpoint.enabled=True",
                             config=os.path.join(ROOT, "configs", "mlp_classifier.py"), check=False)
    assert rc != 0
    assert "train.activation_checkpoint.enabled=True but" in out + err and "no layer" in out + err
