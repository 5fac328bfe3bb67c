"""train.amp through the trainer: loss curves of bf16 and fp16 against fp32 over 50 GPT-2 steps
(tools/train_net.py), fp16 under dp x pp with ZeRO-2 and under tp against one process, and the trainer's loss
scaling against torch.amp.GradScaler step by step with an injected inf gradient."""
import os
import sys

import numpy as np
import torch

import engine as flow
from libai.engine.trainer import EagerTrainer
from libai.utils.events import EventStorage

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "gpt2"))

from gpt2_helpers import TINY, max_rel_err, trained_losses  # noqa: E402

# measured over these 50 steps: bf16 5.4e-5, fp16 8.0e-6 (docs/parallelism.md, "Mixed precision")
TOLERANCE = {"bfloat16": 1e-3, "float16": 1e-4}


def run(tmp_path, name, *args, iters=50, nprocs=1):
    return trained_losses(str(tmp_path / name), *TINY, f"train.train_iter={iters}", "train.log_period=1",
                          "train.evaluation.enabled=False", "train.checkpointer.period=0",
                          "tokenization.make_vocab_size_divisible_by=256", *args, iters=iters, nprocs=nprocs)


def test_bf16_and_fp16_loss_curves_follow_fp32_over_50_steps(tmp_path):
    ref = run(tmp_path, "fp32", "train.train_micro_batch_size=8")
    assert ref[49] < ref[0] - 0.5  # it trains
    for dtype, tol in TOLERANCE.items():
        got = run(tmp_path, dtype, "train.train_micro_batch_size=8", "train.amp.enabled=True",
                  f"train.amp.dtype={dtype}")
        worst = max_rel_err(got, ref)
        print(f"{dtype}: max relative loss difference vs fp32 over 50 steps {worst:.1e}")
        assert worst < tol, (dtype, worst)


def test_fp16_with_pipeline_data_parallel_and_zero_matches_one_process(tmp_path):
    args = ["train.train_micro_batch_size=null", "train.global_batch_size=8", "train.num_accumulation_steps=2",
            "train.amp.enabled=True", "train.amp.dtype=float16"]
    ref = run(tmp_path, "single", *args, iters=6)
    got = run(tmp_path, "dp2_pp2_zero2", *args, "train.dist.data_parallel_size=2",
              "train.dist.pipeline_parallel_size=2", "train.zero_optimization.enabled=True",
              "train.zero_optimization.stage=2", iters=6, nprocs=4)
    assert max_rel_err(got, ref) < 1e-4


def test_fp16_with_tensor_parallel_matches_one_process(tmp_path):
    """Column- and row-parallel linears under fp16 autocast: their weight and bias gradients come
    out of the sharded products in float32 (engine/ops/linalg.py Linear), as in one process."""
    args = ["train.train_micro_batch_size=4", "train.amp.enabled=True", "train.amp.dtype=float16"]
    ref = run(tmp_path, "single", *args, iters=6)
    got = run(tmp_path, "tp2", *args, "train.dist.tensor_parallel_size=2",
              "tokenization.make_vocab_size_divisible_by=128", iters=6, nprocs=2)  # the same padded vocabulary
    assert max_rel_err(got, ref) < 1e-4


class _Model(flow.nn.Module):
    """loss = sum(w * x); at the iterations in `inject` the gradient of w * x is made inf (the
    loss stays finite), as an overflow in a float16 backward would."""

    def __init__(self, w0, inject):
        super().__init__()
        self.w = flow.nn.Parameter(flow.tensor(w0))
        self.inject, self.calls = inject, 0

    def forward(self, x):
        y = self.w * x
        if self.calls in self.inject:
            y.register_hook(lambda g: g * float("inf"))
        self.calls += 1
        return {"total_loss": y.sum()}


def test_trainer_loss_scaling_matches_torch_grad_scaler_with_an_injected_inf():
    rng = np.random.default_rng(0)
    w0 = rng.standard_normal(3).astype(np.float32)
    xs = [rng.standard_normal(3).astype(np.float32) for _ in range(6)]
    inject = {2}
    model = _Model(w0, inject)
    opt = flow.optim.SGD(model.parameters(), lr=0.1)
    scaler = flow.amp.GradScaler(init_scale=2.0 ** 10, growth_interval=2)
    trainer = EagerTrainer(model, iter([{"x": flow.tensor(x)} for x in xs]), opt, grad_scaler=scaler)
    tw = torch.tensor(w0, requires_grad=True)
    topt = torch.optim.SGD([tw], lr=0.1)
    tscaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10, growth_interval=2)
    with EventStorage(0) as storage:
        trainer.storage = storage
        for i, x in enumerate(xs):
            storage.iter = i
            before = model.w.detach().numpy().copy()
            trainer.run_step()
            y = tw * torch.tensor(x)
            if i in inject:
                y.register_hook(lambda g: g * float("inf"))
            tscaler.scale(y.sum()).backward()
            tscaler.step(topt)
            tscaler.update()
            topt.zero_grad()
            assert scaler.get_scale() == tscaler.get_scale(), i
            np.testing.assert_allclose(model.w.detach().numpy(), tw.detach().numpy(), rtol=1e-6)
            if i in inject:
                np.testing.assert_array_equal(model.w.detach().numpy(), before)  # skipped
    # 2^10 -> 2^11 after two clean steps, halved at the inf, 2^11 again after two more clean steps
    assert scaler.get_scale() == 2.0 ** 11
