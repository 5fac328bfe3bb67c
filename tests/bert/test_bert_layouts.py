"""Layout parity of the BERT recipe: the tiny model (dropout off) for 10 iterations under dp=2,
tp=2 and dp=2 x tp=2 (4 processes) through `python -m engine.distributed.launch ...
tools/train_net.py --config-file configs/bert_pretrain.py` logs the single-process losses (total,
masked-LM and sentence-order) within 1e-5 relative (rank 0's metrics.json, log_period=1); a
stopped tp=2 run resumes onto the same losses."""
import os

from bert_helpers import TINY, losses, records, rel_err, train_bert

# the same global batch (8) and padded vocabulary (a multiple of 256) in every layout:
# make_vocab_size_divisible_by * tp = 256
BASE = [*TINY, "train.train_iter=10", "train.log_period=1", "train.train_micro_batch_size=null",
        "train.global_batch_size=8", "train.num_accumulation_steps=1", "train.evaluation.enabled=False"]


def layout(dp, tp):
    return [f"train.dist.data_parallel_size={dp}", f"train.dist.tensor_parallel_size={tp}",
            f"tokenization.make_vocab_size_divisible_by={256 // tp}"]


def loss_parts(out):
    return {r["iteration"]: (r["total_loss"], r["lm_loss"], r["sop_loss"]) for r in records(out) if "lm_loss" in r}


def test_layout_parity_dp_tp(tmp_path):
    ref_out = str(tmp_path / "single")
    train_bert(f"train.output_dir={ref_out}", "train.checkpointer.period=0", *BASE, *layout(1, 1))
    ref = loss_parts(ref_out)
    assert sorted(ref) == list(range(10)) and ref[9][1] < ref[0][1]
    worst = {}
    for dp, tp in [(2, 1), (1, 2), (2, 2)]:
        out = str(tmp_path / f"dp{dp}_tp{tp}")
        train_bert(f"train.output_dir={out}", "train.checkpointer.period=0", *BASE, *layout(dp, tp), nprocs=dp * tp)
        got = loss_parts(out)
        assert sorted(got) == list(range(10))
        errs = [rel_err(g, r) for i in range(10) for g, r in zip(got[i], ref[i])]
        worst[(dp, tp)] = max(errs)
        assert max(errs) < 1e-5, (dp, tp, errs)
    print("BERT layout parity, max relative loss error vs 1 process:",
          {f"dp={d} tp={t}": f"{e:.2e}" for (d, t), e in worst.items()})


def test_stop_and_resume_under_tp(tmp_path):
    args = [*BASE, *layout(1, 2), "train.checkpointer.period=5"]
    full = str(tmp_path / "full")
    train_bert(f"train.output_dir={full}", *args, nprocs=2)
    out = str(tmp_path / "resumed")
    train_bert("--stop-iter", "5", f"train.output_dir={out}", *args, nprocs=2)
    assert open(os.path.join(out, "last_checkpoint")).read().strip() == "model_0000004"
    train_bert("--resume", f"train.output_dir={out}", *args, nprocs=2)
    ref, got = losses(full), losses(out)
    assert sorted(got) == list(range(10))
    errs = [rel_err(got[i], ref[i]) for i in range(10)]
    assert max(errs) < 1e-6, errs
