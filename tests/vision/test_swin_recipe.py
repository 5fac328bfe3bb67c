"""The Swin recipe end to end on the embedded digits: the README command with short overrides
(accuracy above chance) and layout parity: dropout and drop-path off, 10 iterations under dp=2,
tp=2 (heads and the relative position bias tables split) and dp=2 x tp=2 give the
single-process losses within 1e-5 relative."""
from vision_helpers import SWIN_NO_DROP, losses, records, rel_err, train_swin


def test_readme_command_learns_the_digits(tmp_path):
    out = str(tmp_path / "run")
    train_swin(f"train.output_dir={out}", "train.train_iter=300", "train.log_period=50",
               "train.evaluation.eval_period=300", "train.checkpointer.period=0")
    recs = records(out)
    train = [r["total_loss"] for r in recs if "total_loss" in r]
    assert train[-1] < 0.85 * train[0]
    acc = [r for r in recs if "Acc@1" in r]
    assert acc and acc[-1]["Acc@1"] > 25.0, acc  # chance is 10%


BASE = [*SWIN_NO_DROP, "train.train_iter=10", "train.log_period=1", "train.train_micro_batch_size=null",
        "train.global_batch_size=8", "train.num_accumulation_steps=1", "train.evaluation.enabled=False",
        "train.checkpointer.period=0"]


def test_layout_parity_dp_tp(tmp_path):
    ref_out = str(tmp_path / "single")
    train_swin(f"train.output_dir={ref_out}", *BASE)
    ref = losses(ref_out)
    assert sorted(ref) == list(range(10))
    worst = {}
    for dp, tp in [(2, 1), (1, 2), (2, 2)]:
        out = str(tmp_path / f"dp{dp}_tp{tp}")
        train_swin(f"train.output_dir={out}", *BASE, f"train.dist.data_parallel_size={dp}",
                   f"train.dist.tensor_parallel_size={tp}", nprocs=dp * tp)
        got = losses(out)
        assert sorted(got) == list(range(10))
        errs = [rel_err(got[i], ref[i]) for i in range(10)]
        worst[(dp, tp)] = max(errs)
        assert max(errs) < 1e-5, (dp, tp, errs)
    print("Swin layout parity, max relative loss error vs 1 process:",
          {f"dp={d} tp={t}": f"{e:.2e}" for (d, t), e in worst.items()})
