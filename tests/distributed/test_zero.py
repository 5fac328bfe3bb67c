"""ZeRO (engine/distributed/zero.py, train.zero_optimization.*).

* which tensor axis a parameter is split on, over the data-parallel mesh axis;
* per-rank bytes on 2 and 4 ranks: optimizer state 1/dp of the plain run's for every stage,
  parameters too for stage 3, and the same trained parameters as plain data parallelism;
* through tools/train_net.py, 10 iterations of the GPT-2 recipe (dropout off, 2 micro-batches):
  stages 1, 2 and 3 under dp=2 and dp=4 log the losses of plain dp within 1e-6 relative (and of
  one process); stage 3 with tp and stage 2 with pp too; a stage-3 run saved under dp=2 resumes
  in one process without ZeRO onto the same losses (checkpoints are logical).
"""
import os
import sys

import pytest

import engine as flow
from engine.distributed import GlobalMeta
from engine.distributed import sbp as S
from engine.distributed.zero import zero_sbp

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "gpt2"))

from gpt2_helpers import TINY, losses, max_rel_err, train_net, trained_losses  # noqa: E402
from mpi_helper import run_mpi  # noqa: E402


# ------------------------------------------------------------------ the split
class _Placement:
    def __init__(self, *hierarchy):
        self.hierarchy = hierarchy


@pytest.mark.parametrize("shape,sbp,hierarchy,want", [
    ((8, 4), (S.broadcast,), (2,), (S.split(0),)),
    ((3, 4), (S.broadcast,), (2,), (S.split(1),)),                         # axis 0 does not divide
    ((3, 5), (S.broadcast,), (2,), None),                                   # nothing divides: replicated
    ((1,), (S.broadcast,), (2,), None),
    ((8, 4), (S.broadcast, S.split(0)), (2, 2), (S.split(0), S.split(0))),  # 8 / tp 2 = 4 still divides
    ((2, 6), (S.broadcast, S.split(0)), (2, 2), (S.split(1), S.split(0))),  # 2 / tp 2 = 1 does not
    ((8, 4), (S.split(0),), (2,), None),                                    # already split on the axis
    ((8, 4), (S.broadcast,), (1,), None),                                   # one data-parallel rank
])
def test_zero_split_axis(shape, sbp, hierarchy, want):
    assert zero_sbp(GlobalMeta(_Placement(*hierarchy), sbp, shape), 0) == want


# ------------------------------------------------------------------ bytes per rank
@pytest.mark.parametrize("nprocs", [2, 4])
def test_optimizer_state_and_stage3_parameters_are_one_dp_th_per_rank(nprocs):
    _, out, _ = run_mpi(nprocs, "zero_memory.py")
    print(out)
    for stage in (1, 2, 3):
        assert f"ZeRO stage {stage} on {nprocs} ranks" in out


# ------------------------------------------------------------------ recipes
BASE = [*TINY, "train.train_iter=10", "train.log_period=1", "train.train_micro_batch_size=null",
        "train.global_batch_size=8", "train.num_accumulation_steps=2", "train.evaluation.enabled=False",
        "tokenization.make_vocab_size_divisible_by=256"]


def run(tmp_path, name, *args, nprocs=1):
    return trained_losses(str(tmp_path / name), *BASE, *args, iters=10, nprocs=nprocs)


def zero(stage):
    return ["train.zero_optimization.enabled=True", f"train.zero_optimization.stage={stage}"]


@pytest.mark.parametrize("dp,stages", [(2, (1, 2, 3)), (4, (3,))])
def test_zero_stages_match_plain_data_parallelism(tmp_path, dp, stages):
    """Every stage at dp=2; at dp=4 stage 3, which shards the most (optimizer state, gradients
    and parameters: the gathers and reduce-scatters over 4 ranks that stages 1 and 2 also use)."""
    no_ckpt = "train.checkpointer.period=0"
    single = run(tmp_path, "single", no_ckpt)
    plain = run(tmp_path, "plain", no_ckpt, f"train.dist.data_parallel_size={dp}", nprocs=dp)
    assert max_rel_err(plain, single) < 1e-6, max_rel_err(plain, single)
    errors = {}
    for stage in stages:
        got = run(tmp_path, f"zero{stage}", no_ckpt, f"train.dist.data_parallel_size={dp}", *zero(stage), nprocs=dp)
        errors[stage] = max_rel_err(got, plain)
        assert errors[stage] < 1e-6, (stage, errors[stage])
    print(f"ZeRO dp={dp}: max relative loss error vs plain dp {errors}")


def test_zero_with_tensor_and_pipeline_parallelism(tmp_path):
    no_ckpt = "train.checkpointer.period=0"
    tp = ["train.dist.data_parallel_size=2", "train.dist.tensor_parallel_size=2",
          "tokenization.make_vocab_size_divisible_by=128"]
    plain = run(tmp_path, "dp2_tp2", no_ckpt, *tp, nprocs=4)
    got = run(tmp_path, "dp2_tp2_zero3", no_ckpt, *tp, *zero(3), nprocs=4)
    assert max_rel_err(got, plain) < 1e-6
    single = run(tmp_path, "single", no_ckpt)
    got = run(tmp_path, "dp2_pp2_zero2", no_ckpt, "train.dist.data_parallel_size=2",
              "train.dist.pipeline_parallel_size=2", *zero(2), nprocs=4)
    assert max_rel_err(got, single) < 1e-6


def test_zero3_trains_swin_as_plain_data_parallelism(tmp_path):
    """Swin's attention reads its relative-position bias table as this rank's heads
    (`to_local()`): under stage 3 the table is stored split over the data-parallel ranks too,
    and that read took half the heads (a shape error at the first step)."""
    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "vision"))
    from vision_helpers import SWIN_CONFIG, SWIN_NO_DROP

    args = ["train.train_iter=3", "train.log_period=1", "train.train_micro_batch_size=null", "train.global_batch_size=8",
            "train.evaluation.enabled=False", "train.checkpointer.period=0", "train.dist.data_parallel_size=2",
            *SWIN_NO_DROP]
    plain = trained_losses(str(tmp_path / "plain"), *args, iters=3, nprocs=2, config=SWIN_CONFIG)
    got = trained_losses(str(tmp_path / "zero3"), *args, *zero(3), iters=3, nprocs=2, config=SWIN_CONFIG)
    assert max_rel_err(got, plain) < 1e-6, (got, plain)


def test_a_zero3_checkpoint_resumes_in_one_process(tmp_path):
    full = run(tmp_path, "full", "train.checkpointer.period=5")
    out = str(tmp_path / "resumed")
    train_net("--stop-iter", "5", f"train.output_dir={out}", *BASE, "train.checkpointer.period=5",
              "train.dist.data_parallel_size=2", *zero(3), nprocs=2)
    opt = flow.load(os.path.join(out, "model_0000004", "optimizer.safetensors"))
    assert any(tuple(v["exp_avg"].shape) == (6912, 64) for v in opt["state"].values())  # logical, not a shard
    train_net("--resume", f"train.output_dir={out}", *BASE, "train.checkpointer.period=5")
    assert max_rel_err(losses(out), full) < 1e-6


@pytest.mark.parametrize("stage", [1, 2])
def test_stage_1_and_2_resume_from_their_checkpoint(tmp_path, stage):
    """The optimizer's shards were built before the checkpoint was loaded, so the step after a
    resume updated the initial weights' shards and gathered them over the loaded ones (2.7e-2
    off from iteration 5): a resumed dp=2 run now logs the uninterrupted one's losses."""
    args = [*BASE, "train.checkpointer.period=5", "train.dist.data_parallel_size=2", *zero(stage)]
    full = run(tmp_path, "full", *args[len(BASE):], nprocs=2)
    out = str(tmp_path / "resumed")
    train_net("--stop-iter", "5", f"train.output_dir={out}", *args, nprocs=2)
    train_net("--resume", f"train.output_dir={out}", *args, nprocs=2)
    assert max_rel_err(losses(out), full) < 1e-6, (losses(out), full)

