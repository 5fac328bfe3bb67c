"""(b) Layout parity: the GPT-2 recipe (tiny, dropout off) for 10 iterations under dp=2, tp=2 and
dp=2 x tp=2 (4 processes) through `python -m engine.distributed.launch ... tools/train_net.py`
logs the single-process losses within 1e-4 relative (rank 0's metrics.json, log_period=1).

(d) Checkpoints of the global model and optimizer: training stopped at iteration 5
(--stop-iter) and continued with --resume reproduces the uninterrupted losses (within 1e-6
relative under tp=2; bit for bit in one process); the checkpoint holds logical (whole) tensors,
so a tp=2 checkpoint loads into a one-process model."""
import os

import numpy as np
import pytest

from gpt2_helpers import CONFIG, TINY, losses, rel_err, train_net

# the same global batch (8) and padded vocabulary (6912 = 27 * 256) in every layout:
# make_vocab_size_divisible_by * tp = 256
BASE = [*TINY, "train.train_iter=10", "train.log_period=1", "train.train_micro_batch_size=null",
        "train.global_batch_size=8", "train.num_accumulation_steps=1", "train.evaluation.enabled=False"]


def layout(dp, tp):
    return [f"train.dist.data_parallel_size={dp}", f"train.dist.tensor_parallel_size={tp}",
            f"tokenization.make_vocab_size_divisible_by={256 // tp}"]


def test_layout_parity_dp_tp(tmp_path):
    ref_out = str(tmp_path / "single")
    train_net(f"train.output_dir={ref_out}", "train.checkpointer.period=0", *BASE, *layout(1, 1))
    ref = losses(ref_out)
    assert sorted(ref) == list(range(10)) and ref[9] < ref[0]
    worst = {}
    for dp, tp in [(2, 1), (1, 2), (2, 2)]:
        out = str(tmp_path / f"dp{dp}_tp{tp}")
        train_net(f"train.output_dir={out}", "train.checkpointer.period=0", *BASE, *layout(dp, tp), nprocs=dp * tp)
        got = losses(out)
        assert sorted(got) == list(range(10))
        errs = [rel_err(got[i], ref[i]) for i in range(10)]
        worst[(dp, tp)] = max(errs)
        assert max(errs) < 1e-4, (dp, tp, errs)
    print("layout parity, max relative loss error vs 1 process:",
          {f"dp={d} tp={t}": f"{e:.2e}" for (d, t), e in worst.items()})


@pytest.mark.parametrize("nprocs", [1, 2])
def test_stop_and_resume_reproduces_losses(tmp_path, nprocs):
    import engine as flow

    args = [*BASE, *layout(1, nprocs), "train.checkpointer.period=5"]
    full = str(tmp_path / "full")
    train_net(f"train.output_dir={full}", *args, nprocs=nprocs)
    out = str(tmp_path / "resumed")
    train_net("--stop-iter", "5", f"train.output_dir={out}", *args, nprocs=nprocs)
    assert open(os.path.join(out, "last_checkpoint")).read().strip() == "model_0000004"
    assert sorted(losses(out)) == list(range(5))
    train_net("--resume", f"train.output_dir={out}", *args, nprocs=nprocs)
    ref, got = losses(full), losses(out)
    assert sorted(got) == list(range(10))
    errs = [rel_err(got[i], ref[i]) for i in range(10)]
    print(f"resume nprocs={nprocs}: max relative loss error {max(errs):.2e}")
    if nprocs == 1:
        assert all(got[i] == ref[i] for i in range(10))  # bitwise
    assert max(errs) < 1e-6, errs

    # the checkpoint holds the logical tensors (whole vocabulary, whole heads), whatever tp wrote it
    ckpt = os.path.join(out, "model_0000004")
    sd = flow.load(os.path.join(ckpt, "model.safetensors"))
    assert tuple(sd["GPT_model.embeddings.token_embeddings.weight"].shape) == (6912, 64)
    assert tuple(sd["GPT_model.transformer.layers.0.self_attention.query_key_value.weight"].shape) == (192, 64)
    opt = flow.load(os.path.join(ckpt, "optimizer.safetensors"))
    shapes = {tuple(v["exp_avg"].shape) for v in opt["state"].values()}
    assert (6912, 64) in shapes and (192, 64) in shapes
    assert np.isfinite(sd["GPT_model.embeddings.token_embeddings.weight"].numpy()).all()
    if nprocs == 2:  # the tp=2 checkpoint (model + optimizer) loads into a one-process model
        from libai.models import GPTForPreTraining
        from libai.utils import distributed as dist
        from libai.utils.checkpoint import Checkpointer

        dist._reset_dist_util()
        try:
            model = GPTForPreTraining(hidden_layers=2, vocab_size=6912, hidden_size=64, ffn_hidden_size=256,
                                      num_attention_heads=4, max_seq_length=32)
            from libai.config import LazyConfig
            from libai.optim import build_optimizer

            optimizer = build_optimizer(LazyConfig.load(CONFIG).optim, model)  # the recipe's param groups
            Checkpointer(model, save_dir="", optimizer=optimizer).load(ckpt, checkpointables=["optimizer"])
            for k, v in model.state_dict().items():
                np.testing.assert_array_equal(v.detach().numpy(), sd[k].numpy())
            assert len(optimizer.state) == len(list(model.parameters()))
        finally:
            dist._reset_dist_util()
